#!/usr/bin/env bash
# device call 6 (session 62): OLMo-2's prefill and decode with v's heads in programs of their own (forced tiles)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call6.sh exp/olmo62.py exp/HEAD.txt $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROPEKIT_AUTOTUNE=0 timeout 200 python3 exp/olmo62.py > $R/olmo.txt 2>&1
echo "olmo rc $?"; grep -v "^\[" $R/olmo.txt | tail -8
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
