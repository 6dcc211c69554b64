#!/usr/bin/env bash
# session 54, call 3: as call 2, the scalar-scale branch reverted (decode float8 q 1.17x slower) and the zero quotient's sign kept on the GPU (Triton negates as 0 - x)
# bit, int8 by cvt.rni.sat.s8.f32, one scale a tensor without the tiny-scale factor an element): GPU tests (the
# million-pattern native-vs-integer bits for e4m3, e5m2, int8); A/B against 87aa0c3 over the fused cases; ncu
# instruction counts of the changed prefills
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
git diff 87aa0c3 -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_fused_quant.py \
  tests/test_fused_mla.py tests/test_fused_page_table.py tests/test_fused_kv_cache.py > $R/pytest.txt 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED|Error" $R/pytest.txt | tail -8
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/fused_ab.py --out $R/ab.json --rounds 7 \
  --budget 250 --cases prefill-b4-s4096-e5m2 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-q \
  prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-head prefill-b4-s4096-nvfp4 \
  decode-b64-e5m2 decode-b64-int8-token-head decode-b64-fp8-q decode-b64-fp8 decode-b64-fp8-token-head \
  decode-b64-fp8-head decode-b64-nvfp4 prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-page-table \
  decode-b64 decode-b64-qknorm mla-decode-b64 prefill-b4-s4096-olmo2 decode-b64-olmo2 > $R/ab.txt 2>&1
echo "ab rc $?"; grep -v "^\[" $R/ab.txt | cut -c1-150 | tail -26
NCU=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu | sort -V -r | head -1)
for c in prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-q prefill-b4-s4096-int8-token-head; do
  ROPEKIT_AUTOTUNE=0 timeout 50 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
    -k regex:fused_forward --launch-skip 1 --launch-count 1 python3 exp/ncu_fused.py $c > $R/ncu_$c.txt 2>&1
  echo "== $c rc $?"; grep -E "Duration|DRAM Throughput|Registers Per|issue_active|inst_executed|Achieved Occ" $R/ncu_$c.txt | sed 's/  */ /g'
done
