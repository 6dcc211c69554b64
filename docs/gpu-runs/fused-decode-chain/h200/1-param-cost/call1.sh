#!/usr/bin/env bash
# session 50 call 1: what kernel parameters cost a decode-sized launch under graph replay
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 200 python3 exp/param_cost.py --rounds 9 2>&1 | grep -v "Warning\|warn" | tee "$OUT/param_cost.txt"
