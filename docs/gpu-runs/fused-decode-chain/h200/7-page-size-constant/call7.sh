#!/usr/bin/env bash
# session 50 call 7: a page table's page size a constant, A/B against the committed tree (.ab, autotune off), then
# the fused and cache test files on the GPU
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call7.sh exp/fused_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 200 python3 exp/fused_ab.py --budget 150 --out $R/ab.json \
  --cases decode-b64-page-table prefill-b4-s4096-page-table decode-b64 mla-decode-b64 prefill-b4-s4096 \
  2>&1 | grep -v "^\[" | tee $R/ab.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_fused_kv_cache.py \
  tests/test_fused_page_table.py tests/test_fused_quant.py tests/test_fused_mla.py tests/test_paged.py \
  tests/test_engines.py tests/test_reliability_fuzz_cache.py tests/test_launch.py 2>&1 | tail -4 | tee $R/pytest.txt
cd $OUT && tar czf r.tgz r
