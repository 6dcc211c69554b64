#!/usr/bin/env bash
# device call 10 (session 60): the fused prefill's addresses copied by TMA (tensor descriptors) against the best
# per-thread copy and the fused op
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call10.sh exp/tma_probe.py exp/addr_probe.py exp/HEAD.txt $R/
OUT=$R ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/tma_probe.py > $R/tma_probe.txt 2>&1; echo "rc $?"; tail -30 $R/tma_probe.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
