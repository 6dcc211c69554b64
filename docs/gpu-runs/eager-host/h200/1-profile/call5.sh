#!/usr/bin/env bash
# device call 5 (session 62): where the eager ops' host time goes (wall clock, then cProfile), decode b64
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call5.sh exp/eager_prof.py exp/HEAD.txt $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; lscpu | grep -E "Model name|MHz"; } 2>&1 | tee $R/gpu.txt
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 300 python3 exp/eager_prof.py > $R/prof.txt 2>&1
echo "prof rc $?"; grep -E "^===|tottime|run\b|\{" $R/prof.txt | head -80
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
