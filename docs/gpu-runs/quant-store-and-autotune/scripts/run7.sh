#!/usr/bin/env bash
# device call: one GPU's published column (main, every fused case with NVFP4's, eager), then the heavy-store A/B
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
MAIN_SECONDS=150 FUSED_SECONDS=240 EAGER_SECONDS=55 bash tools/gpu_run.sh publish 2>&1 | grep -E "NOT MET|met " | head -60
export PYTHONPATH=/tmp/site
cases="prefill-b4-s4096 prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-q prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head"
for v in old new; do
  timeout 45 python3 exp/ab_tune.py $v $v fused $cases 2>&1 | grep -E "^(new|old)" | tee -a "$OUT/exp/ab_fused.txt"
done
