#!/usr/bin/env bash
# device call 8 (session 62): the per-(token, head) prefill rule on shapes the benchmark lacks (a per-head QK-norm; a
# float8 q): forced tiles with v apart and without
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call8.sh exp/combo62.py exp/HEAD.txt $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ROPEKIT_AUTOTUNE=0 timeout 200 python3 exp/combo62.py > $R/combo.txt 2>&1
echo "combo rc $?"; grep -v "^\[" $R/combo.txt | tail -10
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
