#!/usr/bin/env bash
# call 1: what the compiled launcher costs a pointer (tensor vs int), then the eager A/B of the direct launch passing
# data pointers (working tree) against 87014ae (.ab), then the launch tests on the GPU
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call1.sh exp/eager_ab.py exp/ptr_bench.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 60 python3 exp/ptr_bench.py 2>&1 | tee $R/ptr_bench.txt
timeout 200 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 9 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_launch.py tests/test_api.py \
  tests/test_outputs.py tests/test_bench_eager.py tests/test_fused_kv_cache.py tests/test_fused_mla.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
cd $OUT && tar czf r.tgz r && rm -rf r
