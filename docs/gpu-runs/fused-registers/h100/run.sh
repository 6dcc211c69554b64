#!/usr/bin/env bash
# session 49 call 4: the copy probe cold and warm, forced fused tiles against the choice
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 420 python3 exp/tile_sweep.py --out "$OUT/tile_sweep.json" 2>&1 | grep -v "^W1128\|Warning\|warn" \
  | tee "$OUT/tile_sweep.txt"
