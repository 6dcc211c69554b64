#!/usr/bin/env bash
# device call 3 (session 52): apply_rope A/B (streaming tile where flat cannot run) against HEAD; fused prefill tiles
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 tools/ab_versions.py --rounds 5 --time-budget 220 --out $R/ab > $R/ab.txt 2>&1; grep -v "^\[" $R/ab.txt | tail -60
cd $OUT && tar czf r.tgz r
