#!/usr/bin/env bash
# session 50 call 8: the fused page with an empty autotune cache (this tree: a page table's page size a constant)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/pub; cp exp/call8.sh $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git rev-parse HEAD; git status --short | head; } | tee $R/pub/gpu.txt
git diff -- ropekit > $R/change.patch
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 230 python3 -m ropekit.bench.fused --time-budget 170 --out $R/pub/fused 2>&1 | tee $R/pub/fused.txt \
  | grep -v "^\[" | grep -E "wrote|Traceback|Error|page-table" | tail -8
cp $ROPEKIT_CACHE_DIR/autotune.json $R/pub/ 2>/dev/null
cd $OUT && tar czf r.tgz r
