#!/usr/bin/env bash
# session 49 calls 5/6: the all-heads forward prefill at one token a program, A/B against the committed tree (.ab,
# the model's choices: autotune off), then the fused page with an empty autotune cache
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/pub; cp exp/call5.sh exp/fused_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/pub/gpu.txt
git diff -- ropekit > $R/change.patch
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 150 python3 exp/fused_ab.py --budget 120 --out $R/ab.json \
  --cases prefill-b4-s4096-olmo2 decode-b64-olmo2 prefill-b4-s4096-qknorm 2>&1 | grep -v "^\[" | tee $R/ab.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 215 python3 -m ropekit.bench.fused --time-budget 170 --out $R/pub/fused 2>&1 | tee $R/pub/fused.txt \
  | grep -v "^\[" | grep -E "wrote|Traceback|Error|olmo2" | tail -8
cp $ROPEKIT_CACHE_DIR/autotune.json $R/pub/ 2>/dev/null
cd $OUT && tar czf r.tgz r
