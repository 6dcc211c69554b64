#!/usr/bin/env bash
# session 50 call 4: a slot as the row itself (NHD paged caches), A/B against the committed tree (.ab, the model's
# choices: autotune off), every fused forward case
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call4.sh exp/fused_ab.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 420 python3 exp/fused_ab.py --budget 330 --out $R/ab.json \
  2>&1 | grep -v "^\[" | tee $R/ab.txt
cd $OUT && tar czf r.tgz r
