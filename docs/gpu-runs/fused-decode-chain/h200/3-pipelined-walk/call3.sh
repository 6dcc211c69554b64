#!/usr/bin/env bash
# session 50 call 3: the fused forward walking several token blocks, pipelined, against the model's tile
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
git rev-parse HEAD | tee -a "$OUT/gpu.txt"; git diff --stat | tee -a "$OUT/gpu.txt"
timeout 420 python3 exp/pipe_sweep.py --out "$OUT/pipe_sweep.json" 2>&1 | grep -v "^W1128\|Warning\|warn" \
  | tee "$OUT/pipe_sweep.txt"
