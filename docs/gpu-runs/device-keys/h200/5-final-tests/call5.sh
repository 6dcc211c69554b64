#!/usr/bin/env bash
# call 5: the GPU tests of the launcher, the plans and the ops at the final tree (signature writes tensor_key inline)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call5.sh exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_relaunch.py tests/test_launch.py \
  tests/test_api.py tests/test_device.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_qk_norm_rope.py \
  tests/test_overlap.py tests/test_engines.py tests/test_te.py tests/test_bench_eager.py tests/test_hardening.py tests/test_angles.py \
  tests/test_module.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
