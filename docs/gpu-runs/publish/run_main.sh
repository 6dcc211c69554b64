#!/usr/bin/env bash
# device call D: the published main benchmark of this tree (autotune on, empty cache), then the choice, launch and v4
# tests on this GPU
set -u
OUT=${OUT:-/tmp/out}
mkdir -p $OUT/publish
TEST_WORKERS=4 TEST_SECONDS=170 bash tools/gpu_run.sh test tests/test_choice.py tests/test_launch.py tests/test_v4.py > $OUT/test_stage.txt 2>&1
tail -4 $OUT/test_stage.txt
export PYTHONPATH=/tmp/site
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 230 python3 -m ropekit bench --peers .peers --time-budget 170 --out $OUT/publish/main > $OUT/publish/main.txt 2>&1
grep -v "^\[" $OUT/publish/main.txt | tail -32
cp $OUT/gpu.txt $OUT/pytest.txt $OUT/publish/
rm -f $OUT/publish/main/*.png
tar -czf $OUT/publish.tgz -C $OUT publish
