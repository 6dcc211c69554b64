#!/usr/bin/env bash
# stop 47 call 1: the whole suite on the current tree, then ropekit check
OUT=${OUT:-/tmp/out}
TEST_WORKERS=8 TEST_SECONDS=420 bash tools/gpu_run.sh test 2>&1 | tail -30
python3 -m ropekit check 2>&1 | tee "$OUT/check.txt" | tail -15
