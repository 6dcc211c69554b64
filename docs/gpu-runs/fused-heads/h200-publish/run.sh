#!/usr/bin/env bash
# device call (H200, warm after the suite's call): the published fused page with an empty autotune cache
export ROPEKIT_CACHE_DIR=$(mktemp -d); pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $OUT/gpu.txt; git rev-parse HEAD >> $OUT/gpu.txt
timeout 400 python3 -m ropekit.bench.fused --time-budget 215 --out $OUT/fused 2>&1 | tee $OUT/fused.txt | grep -v "^\[" | tail -40
cd $OUT && tar czf fused.tgz fused fused.txt gpu.txt && rm -rf fused
