#!/usr/bin/env bash
# device call 4 (session 57): the decode launch sweep of the formats whose k programs quantise with per-head
# arithmetic, after the reduced-value store
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call4.sh exp/HEAD.txt $R/
ROPEKIT_AUTOTUNE=0 timeout 260 python3 -m ropekit.bench.fused_tune --time-budget 200 --out $R/sweep \
  --cases decode-b64-fp8-token-head decode-b64-int8-token-head decode-b64-nvfp4 decode-b64-olmo2 > $R/sweep.txt 2>&1
echo "sweep rc $?"; grep -v "^\[" $R/sweep.txt | tail -40
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
