#!/usr/bin/env bash
# the H200's main run for the streaming tile; .peers carried; an empty autotune cache
mkdir -p $OUT/publish; git diff -- ropekit > $OUT/publish/change.patch
bash tools/gpu_run.sh info >/dev/null 2>&1; cp $OUT/gpu.txt $OUT/publish/gpu-main.txt 2>/dev/null
export PYTHONPATH=/tmp/site
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 240 python3 -m ropekit bench --peers .peers --time-budget 160 \
  --out $OUT/publish/main > $OUT/publish/main.txt 2>&1
grep -v "^\[" $OUT/publish/main.txt | tail -30
tar -czf $OUT/publish.tgz -C $OUT publish
