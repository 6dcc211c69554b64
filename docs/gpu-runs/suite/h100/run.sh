#!/usr/bin/env bash
# stop 48 call 4: the whole suite on the committed tree (H100), then ropekit check
OUT=${OUT:-/tmp/out}
TEST_WORKERS=8 TEST_SECONDS=360 bash tools/gpu_run.sh test 2>&1 | grep -v "^WARNING: Target" | tail -12
python3 -m ropekit check 2>&1 | tee "$OUT/check.txt" | tail -12
