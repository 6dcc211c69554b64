#!/usr/bin/env bash
# call 3: eager A/B of the working tree (launcher arguments by address, float8 tensors passed as they are, MLA's
# k_pe and kv_c split once in the bench) against 87014ae (.ab), with the unfused chains; then the GPU tests of
# the launcher, the ops, CUDA graphs and the engines
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call3.sh exp/eager_ab.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 220 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 9 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_launch.py tests/test_api.py \
  tests/test_outputs.py tests/test_bench_eager.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_quant.py \
  tests/test_fused_page_table.py tests/test_fused_qk_norm_rope.py tests/test_engines.py tests/test_te.py tests/test_overlap.py \
  tests/test_grid_dependency.py tests/test_v4.py tests/test_module.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
cd $OUT && tar czf r.tgz r && rm -rf r
