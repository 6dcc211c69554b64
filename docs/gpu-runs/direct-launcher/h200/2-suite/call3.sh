#!/usr/bin/env bash
# device call 3 (session 56): the whole suite on the GPU again, with failures named (call 2's summary was cut by its
# time limit after 3 failures)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/suite
git status --short > $R/tree.txt; git diff -- ropekit tests > $R/change.patch; cp exp/call3.sh $R/
OUT=$R/suite TEST_WORKERS=14 TEST_SECONDS=480 bash tools/gpu_run.sh test -rfE --junitxml=$R/suite/junit.xml tests/ > /dev/null 2>&1
echo "suite rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" $R/suite/pytest.txt | tail -25
date -u | tee -a $R/suite/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
