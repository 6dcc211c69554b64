#!/usr/bin/env bash
# stop 48 call 1: the whole suite on the committed tree, ropekit check, then the fused page with an empty autotune cache
OUT=${OUT:-/tmp/out}
TEST_WORKERS=8 TEST_SECONDS=330 bash tools/gpu_run.sh test 2>&1 | tail -30
python3 -m ropekit check 2>&1 | tee "$OUT/check.txt" | tail -15
export PYTHONPATH=/tmp/site ROPEKIT_CACHE_DIR=$(mktemp -d)
mkdir -p $OUT/pub
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $OUT/pub/gpu.txt
git rev-parse HEAD >> $OUT/pub/gpu.txt
timeout 215 python3 -m ropekit.bench.fused --time-budget 170 --out $OUT/pub/fused 2>&1 | tee $OUT/pub/fused.txt \
  | grep -v "^\[" | tail -40
cd $OUT && tar czf pub.tgz pub && rm -rf pub
