#!/usr/bin/env bash
# device call 5 (session 56): the prefill tile sweep of the float8 q output (its prefill the furthest from its target
# but NVFP4's)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call5.sh exp/HEAD.txt $R/
ROPEKIT_AUTOTUNE=0 timeout 200 python3 -m ropekit.bench.fused_tune --cases prefill-b4-s4096-fp8-q --time-budget 150 --out $R > $R/tune.txt 2>&1
echo "tune rc $?"; grep -v "^\[" $R/tune.txt | tail -32
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
