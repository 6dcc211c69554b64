#!/usr/bin/env bash
# device call 4 (session 62): the forward walking token blocks, software-pipelined: forced tiles by graph replay
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call4.sh exp/walk62.py exp/HEAD.txt exp/change.patch $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROPEKIT_AUTOTUNE=0 timeout 420 python3 exp/walk62.py > $R/walk.txt 2>&1
echo "walk rc $?"; grep -v "^\[" $R/walk.txt | tail -40
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
