#!/usr/bin/env bash
# stop 48 call 2: the fused page on the committed kernels (empty autotune cache), then the address map's first loads
# issued with the tile (the working tree's patch) A/B against the committed tree (.ab)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/pub; cp exp/call2.sh exp/fused_ab.py $R/
git diff > /tmp/split.patch; cp /tmp/split.patch $R/
git checkout -q -- ropekit/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/pub/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 215 python3 -m ropekit.bench.fused --time-budget 170 --out $R/pub/fused 2>&1 | tee $R/pub/fused.txt \
  | grep -v "^\[" | grep -E "wrote|Traceback|Error" | tail -5
git apply /tmp/split.patch && git diff --stat | tail -1 | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 300 python3 exp/fused_ab.py --budget 200 --out $R/ab.json --cases decode-b64-page-table decode-b64 \
  decode-b64-fp8 mla-decode-b64 decode-b64-int8-token-head decode-b64-qknorm prefill-b4-s4096-page-table \
  prefill-b4-s4096 prefill-b4-s4096-fp8 2>&1 | grep -v "^\[" | tee $R/ab.txt
cd $OUT && tar czf r.tgz r
