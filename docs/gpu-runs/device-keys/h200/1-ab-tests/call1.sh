#!/usr/bin/env bash
# call 1: eager A/B of the plan keys' device index (this tree) against 43223fc (.ab), pinned to one CPU; then the
# H200's eager page at this tree; then the GPU tests of the launcher, the plans and the ops
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call1.sh exp/eager_ab.py exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 230 taskset -c 5 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 15 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager > $R/eager.txt 2>&1; echo "eager rc $?"; grep -E "0\.[0-9]+x \| (yes|\*\*no)" $R/eager/*.md | grep "unfused chain" | head -20
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfE tests/test_relaunch.py tests/test_launch.py \
  tests/test_api.py tests/test_device.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_qk_norm_rope.py \
  tests/test_overlap.py tests/test_engines.py tests/test_te.py tests/test_bench_eager.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
