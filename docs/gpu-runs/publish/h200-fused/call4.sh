#!/usr/bin/env bash
# device call 4 (session 61): the H200's fused page at the scale in the angles: every fused case with its unfused
# pipelines, torch.compile of the chain and the floors
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call4.sh exp/HEAD.txt $R/
timeout 330 python3 -m ropekit.bench.fused --time-budget 250 --out $R/publish/fused > $R/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/fused.txt | grep -E "target|met|yes|\*\*no" | tail -40
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
