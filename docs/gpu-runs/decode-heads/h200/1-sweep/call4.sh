#!/usr/bin/env bash
# session 53, call 4: the fused decode tiles on every decode format (fused_tune's clock)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 260 python3 exp/decode_sweep.py --out $R/dsweep --time-budget 200 \
  --cases decode-b64-qknorm decode-b64-fp8 decode-b64-fp8-token-head decode-b64-e5m2 decode-b64-fp8-head \
  decode-b64-fp8-q decode-b64-int8-token-head decode-b64-nvfp4 decode-b64 > $R/dsweep.txt 2>&1
echo "rc $?"; grep -v "^\[" $R/dsweep.txt | grep -v "^$" | tail -110 | cut -c1-90
