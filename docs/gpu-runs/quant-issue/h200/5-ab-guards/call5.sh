#!/usr/bin/env bash
# session 54, call 5: two cheaper finiteness tests for the division's correction against 87aa0c3 (base), this tree (new),
# 87aa0c3's division in this tree (alt0), excess * 0 == 0 (alt1), the corrected quotient not NaN (alt2)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff 87aa0c3 -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
for p in ropekit_old ropekit_alt ropekit_alt2; do diff -r -x __pycache__ ropekit .ab/$p > $R/$p.diff; done
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 420 python3 exp/fused_ab.py --out $R/ab.json --rounds 11 \
  --budget 380 --alt ropekit_old,ropekit_alt,ropekit_alt2 --cases decode-b64-fp8 decode-b64-nvfp4 decode-b64-e5m2 decode-b64 prefill-b4-s4096-fp8-head \
  prefill-b4-s4096-fp8-q decode-b64-fp8-q prefill-b4-s4096-e5m2 > $R/ab.txt 2>&1
echo "ab rc $?"; grep -v "^\[" $R/ab.txt | sed 's/  copy [0-9.]* //; s/chain [0-9.]* base\/chain [0-9.]* new\/chain [0-9.]*//' | cut -c1-280
