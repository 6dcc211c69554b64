#!/usr/bin/env bash
# device call 9 (session 62): the launch every fused prefill case plans, registers rounded to the allocation unit
# (this tree) against 7a1bec4, the autotune off
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call9.sh exp/choices62.py exp/HEAD.txt exp/change.patch $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROPEKIT_AUTOTUNE=0 timeout 200 python3 exp/choices62.py > $R/choices.txt 2>&1
echo "choices rc $?"; grep -v "^\[" $R/choices.txt | tail -34
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
