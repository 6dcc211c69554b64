#!/usr/bin/env bash
# call 4: eager A/B of the working tree (fused plans relaunch a call at known addresses with its launcher arguments
# as they were; launcher arguments by address; float8 tensors as they are; MLA's k_pe and kv_c split once in the
# bench) against 87014ae (.ab), with the unfused chains; the relaunch tests on the GPU and their mutation check; the
# launch, ops and engines tests; then the eager page
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call4.sh exp/eager_ab.py exp/mutate_relaunch.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 220 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 9 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_relaunch.py 2>&1 | tail -3 | tee $R/relaunch.txt
timeout 90 python3 exp/mutate_relaunch.py 2>&1 | tail -8 | tee $R/mutant.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_launch.py tests/test_api.py \
  tests/test_outputs.py tests/test_bench_eager.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_quant.py \
  tests/test_fused_page_table.py tests/test_fused_qk_norm_rope.py tests/test_engines.py tests/test_te.py tests/test_overlap.py \
  tests/test_grid_dependency.py tests/test_module.py tests/test_relaunch.py tests/test_norm_all_heads.py tests/test_norm_placement.py \
  > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager 2>&1 | grep -v "^\[" | tail -4 | tee $R/eager.txt
cd $OUT && tar czf r.tgz r && rm -rf r
