#!/usr/bin/env bash
# the H200's main run (device call 9 of the session), on abf9ba8 (the device copy's git metadata read 9a97e3e), with
# .peers (Liger's wheel, flash-attention's rotary.py) carried; an empty autotune cache
mkdir -p $OUT/publish; git log --oneline -1 | cut -c1-60 > $OUT/publish/device-git-head.txt
bash tools/gpu_run.sh info >/dev/null 2>&1; cp $OUT/gpu.txt $OUT/publish/gpu-main.txt 2>/dev/null
export PYTHONPATH=/tmp/site
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 230 python3 -m ropekit bench --peers .peers --time-budget 150 \
  --out $OUT/publish/main > $OUT/publish/main.txt 2>&1
