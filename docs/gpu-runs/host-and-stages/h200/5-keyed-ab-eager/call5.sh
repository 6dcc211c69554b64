#!/usr/bin/env bash
# call 5: eager A/B of the tree (a planned fused call reads its tensors once for its key and addresses) against
# a0c5c24 (.ab), pinned to one CPU, 21 rounds in alternating order; the relaunch, fused-op and launch tests; the
# eager page
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call5.sh exp/eager_ab.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 200 taskset -c 5 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 21 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_relaunch.py tests/test_launch.py \
  tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_qk_norm_rope.py tests/test_fused_page_table.py \
  tests/test_fused_quant.py tests/test_overlap.py tests/test_engines.py tests/test_te.py tests/test_norm_all_heads.py tests/test_norm_placement.py \
  > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager 2>&1 | grep -v "^\[" | grep -E "NOT|chain" | tee $R/eager.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
