#!/usr/bin/env bash
# session 49 call 3: forced fused tiles with and without a register cap (OLMo-2, NVFP4, QK-norm prefill)
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 420 python3 exp/cap_sweep.py --out "$OUT/cap_sweep.json" 2>&1 | grep -v "^W1128\|Warning\|warn" \
  | tee "$OUT/cap_sweep.txt"
