#!/usr/bin/env bash
# quantising-store arithmetic: v0 (tree), v1 (int8 by 1.5*2^23), v2 (v1 + multiply by 1/scale), v3 (v1 + corrected product)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > "$OUT/exp/gpu.txt"
cases="prefill-b4-s4096 prefill-b4-s4096-fp8 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-q"
cp ropekit/triton/fused_tiles.py /tmp/fused_tiles_tree.py
for v in v0 v1 v2 v3 v0b v2b; do
  src=exp/variants/${v%b}.py
  cp "$src" ropekit/triton/fused_tiles.py
  ROPEKIT_AUTOTUNE=0 timeout 100 python3 exp/quant_time.py $v $cases 2>&1 | tee "$OUT/exp/$v.txt" | grep -v '^{'
done
cp /tmp/fused_tiles_tree.py ropekit/triton/fused_tiles.py
cat "$OUT/exp/gpu.txt"
