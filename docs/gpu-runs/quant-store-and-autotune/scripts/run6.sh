#!/usr/bin/env bash
# device call: NVFP4's fused cases; the autotune's clock and the heavy-store rule against the tree before (patched in)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv | tee "$OUT/exp/gpu.txt"
timeout 100 python3 -m ropekit.bench.fused --cases decode-b64-nvfp4 prefill-b4-s4096-nvfp4 --time-budget 60 \
  --out "$OUT/exp/nvfp4" 2>&1 | grep -v "^\[" | grep -E "nvfp4|floor|met|yes|\*\*no" | tail -20
cases="prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-q prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-nvfp4"
for v in new old new2 old2; do
  timeout 60 python3 exp/ab_tune.py $v ${v%2} fused $cases 2>&1 | grep -E "^(new|old)" | tee -a "$OUT/exp/ab_fused.txt"
done
for v in new old new2 old2; do
  timeout 75 python3 exp/ab_tune.py $v ${v%2} rope 2>&1 | grep -E "^(new|old)" | tee -a "$OUT/exp/ab_rope.txt"
done
