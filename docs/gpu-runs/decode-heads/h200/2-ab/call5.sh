#!/usr/bin/env bash
# session 53, call 5: decode tiles launched plainly; A/B of the programmatic decode rule against b8b7afd on every
# decode case; GPU tests; the fuzzer's fused ops under memcheck
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
for folder in .whl .peers; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff b8b7afd -- ropekit > $R/change.patch 2>/dev/null || git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
ROPEKIT_PDL=0 ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 90 python3 exp/decode_sweep_plain.py --out $R/plain \
  --time-budget 60 --cases decode-b64 decode-b64-fp8 decode-b64-qknorm > $R/plain.txt 2>&1
echo "plain rc $?"; grep -v "^\[" $R/plain.txt | grep -E "best|us " | cut -c1-90
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 200 python3 exp/fused_ab.py --out $R/ab.json --rounds 7 \
  --budget 150 --cases decode-b64 decode-b64-qknorm decode-b64-fp8 decode-b64-page-table mla-decode-b64 \
  decode-b64-olmo2 decode-b64-e5m2 decode-b64-int8-token-head decode-b64-fp8-token-head decode-b64-fp8-head \
  decode-b64-fp8-q decode-b64-nvfp4 prefill-b4-s4096 > $R/ab.txt 2>&1; echo "ab rc $?"; grep -v "^\[" $R/ab.txt | cut -c1-150 | tail -16
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_choice.py \
  tests/test_fused_quant.py tests/test_fused_kv_cache.py > $R/pytest.txt 2>&1; echo "pytest rc $?"; tail -2 $R/pytest.txt
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V -r | head -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 "$cs" --tool memcheck --target-processes all --report-api-errors no \
  --print-limit 50 --log-file "$R/memcheck.%p.log" python3 -m ropekit.reliability.fuzz --device cuda --cases 200 \
  --seed 7 --target rope_and_cache --target mla_rope_and_cache --target qk_norm_rope --time-budget 75 \
  --out $R/fuzz-memcheck.json > $R/fuzz-memcheck.txt 2>&1
echo "memcheck rc $?"; tail -3 $R/fuzz-memcheck.txt; cat $R/memcheck.*.log 2>/dev/null | grep -oE "ERROR SUMMARY: [0-9]+" | sort | uniq -c
