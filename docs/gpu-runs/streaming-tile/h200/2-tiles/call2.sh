#!/usr/bin/env bash
# device call 2 (session 52): the tile at small tiles, tokens-inner against heads-inner grids, on the main prefills
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; diff -ru ropekit_base_dummy /dev/null >/dev/null 2>&1; diff -r .ab/ropekit_base .ab/ropekit_hin > $R/hin.diff
OUT=$R timeout 400 python3 exp/tile_probe.py 2>&1 | tee $R/tile_probe.txt | tail -150
cd $OUT && tar czf r.tgz r
