#!/usr/bin/env bash
# stop 47 call 3: fused A/B (base f7fea30, new = read scales and weights hoisted, slot = new + the cache slot first),
# then the GPU tests of the changed files
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call3.sh exp/fused_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 420 python3 exp/fused_ab.py --budget ${AB_BUDGET:-300} --out $R/ab.json 2>&1 | grep -v "^\[" | tee $R/ab.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_native.py tests/test_bench_eager.py \
  tests/test_fused_quant.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_fused_mla.py > $R/pytest.txt 2>&1; tail -3 $R/pytest.txt
cd $OUT && tar czf r.tgz r
