#!/usr/bin/env bash
# device call 3 (session 55): the fused prefill split into its parts
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; git rev-parse HEAD; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call3.sh exp/fused_probe.py $R/
OUT=$R ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/fused_probe.py prefill-b4-s4096 prefill-b4-s4096-qknorm > $R/fused_probe.txt 2>&1; tail -40 $R/fused_probe.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
