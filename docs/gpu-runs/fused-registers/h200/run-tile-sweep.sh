#!/usr/bin/env bash
# session 49 call 7: forced fused tiles against the library's choice, five prefill cases
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 300 python3 exp/tile_sweep_h200.py --out "$OUT/tile_sweep_h200.json" 2>&1 | grep -v "^W1128\|Warning\|warn" \
  | tee "$OUT/tile_sweep_h200.txt"
