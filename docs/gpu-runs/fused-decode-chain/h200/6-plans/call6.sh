#!/usr/bin/env bash
# session 50 call 6: the plans (tile, warps, registers) of base, the constant block size and the slot as row
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name --format=csv | tee "$OUT/gpu.txt"
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/plan_regs.py ropekit_base,ropekit,ropekit_flat \
  2>&1 | grep -v "^\[\|Warning\|warn" | tee "$OUT/plan_regs.txt"
