#!/usr/bin/env bash
# device call: the autotune's batched, interleaved clock ("new") against the single-launch clock ("old", patched in)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv | tee "$OUT/exp/gpu.txt"
cases="prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-head prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-q"
for v in new old new2 old2 new3 old3; do
  timeout 45 python3 exp/ab_tune.py $v ${v%[23]} fused $cases 2>&1 | grep -E "^(new|old)" | tee -a "$OUT/exp/ab_fused.txt"
done
for v in new old new2 old2; do
  timeout 60 python3 exp/ab_tune.py $v ${v%[23]} rope 2>&1 | grep -E "^(new|old)" | cut -c1-200 | tee -a "$OUT/exp/ab_rope.txt"
done
