#!/usr/bin/env bash
# session 54, call 7: the prefill tiles of the leaner stores (fused_tune over e5m2, int8 and float8 per (token, head),
# float8 q), then the H200's fused page republished on b146663
set -u
OUT=${OUT:-/tmp/out}; P=$OUT/publish; mkdir -p $P
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; python3 -m ropekit info; } > $P/gpu.txt 2>&1
head -3 $P/gpu.txt
git diff 87aa0c3 -- ropekit > $P/change.patch
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 170 python3 -m ropekit.bench.fused_tune --out $P/tune \
  --time-budget 130 --cases prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-e5m2 \
  prefill-b4-s4096-fp8-q > $P/tune.txt 2>&1
echo "tune rc $?"; grep -v "^\[" $P/tune.txt | grep -E "us " | sort -k1,1 -k7,7n | awk '{c[$1]++} c[$1]<=5 || /\*/' | cut -c1-100
timeout 280 python3 -m ropekit.bench.fused --time-budget 200 --out $P/fused > $P/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $P/fused.txt | grep -E "\*\*no" | cut -c1-120 | tail -30
cd $OUT && tar -czf publish.tgz publish && rm -rf publish
