#!/usr/bin/env bash
# stop 48 call 3: the address map's first loads issued with the tile (working tree) A/B against the committed tree (.ab)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call2b.sh exp/fused_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git diff --stat -- ropekit; } | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 300 python3 exp/fused_ab.py --budget 200 --out $R/ab.json --cases decode-b64-page-table decode-b64 \
  decode-b64-fp8 mla-decode-b64 decode-b64-int8-token-head decode-b64-qknorm prefill-b4-s4096-page-table \
  prefill-b4-s4096 2>&1 | grep -v "^\[" | tee $R/ab.txt
