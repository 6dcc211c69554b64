#!/usr/bin/env bash
# device call: the regroup's A/B on this GPU (every published case), the fused autotune's timing and the model's heads
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
AB_ROUNDS=7 bash tools/gpu_run.sh ab 342fa1b 2>&1 | grep -E "Verdict|slower" | head -8
cp -r "$OUT/ab" "$OUT/exp/ab"
export PYTHONPATH=/tmp/site
cases="prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-q prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head"
for v in tree off h16 rounds rounds16 tree2 h162 rounds2 rounds162; do
  timeout 60 python3 exp/tune_time.py $v ${v%2} $cases 2>&1 | grep -v "^\[" | tail -6 | tee -a "$OUT/exp/tune_time.txt"
done
cat "$OUT/gpu.txt" | head -2
