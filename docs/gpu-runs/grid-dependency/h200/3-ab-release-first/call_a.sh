#!/usr/bin/env bash
# device call A: apply_rope A/B, this tree (PDL: wait + release rule) against HEAD (no PDL), then against the
# wait-only variant (RELEASE_SHARE 0), each one process, every published case, autotune off, fresh cache
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 270 python3 tools/ab_versions.py --rounds 5 --time-budget 170 --out $R/ab_head > $R/ab_head.txt 2>&1; grep -v "^\[" $R/ab_head.txt | tail -45
mv .ab/ropekit_base .ab/ropekit_head && cp -r .ab/ropekit_wait .ab/ropekit_base
for f in $(grep -rl '"ropekit_wait::' .ab/ropekit_base); do sed -i 's/"ropekit_wait::/"ropekit_base::/g' $f; done
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 270 python3 tools/ab_versions.py --rounds 5 --time-budget 170 --out $R/ab_wait > $R/ab_wait.txt 2>&1; grep -v "^\[" $R/ab_wait.txt | tail -45
rm -rf .ab/ropekit_base; mv .ab/ropekit_head .ab/ropekit_base
cd $OUT && tar czf r.tgz r && ls -la $OUT
