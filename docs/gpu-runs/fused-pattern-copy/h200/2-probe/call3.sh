#!/usr/bin/env bash
# device call 2-3 (session 60): the fused bf16 prefill beside copy kernels of its exact bytes and addresses
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/probe
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call2.sh exp/addr_probe.py $R/
OUT=$R/probe ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/addr_probe.py prefill-b4-s4096 > $R/probe/addr_probe.txt 2>&1; echo "probe rc $?"; tail -34 $R/probe/addr_probe.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
