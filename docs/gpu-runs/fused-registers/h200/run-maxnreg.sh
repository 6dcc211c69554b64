#!/usr/bin/env bash
# session 49 call 2: fused prefill with the registers a thread capped so more programs fit an SM (maxnreg A/B)
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 400 python3 exp/maxnreg_ab.py --out "$OUT/maxnreg.json" --cases prefill-b4-s4096 prefill-b4-s4096-qknorm \
  prefill-b4-s4096-e5m2 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-q prefill-b4-s4096-page-table \
  prefill-b4-s4096-nvfp4 prefill-b4-s4096-olmo2 2>&1 | grep -v "^W1128\|Warning\|warn" | tee "$OUT/maxnreg.txt"
