#!/usr/bin/env bash
# device call B: release after the wait. Floor probe modes; apply_rope A/B against the wait-only variant; fused A/B
# (base HEAD, new this tree, alt wait-only)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
OUT=$R timeout 60 python3 exp/pdl_probe.py 2>&1 | tail -3
mv .ab/ropekit_base .ab/ropekit_head && cp -r .ab/ropekit_wait .ab/ropekit_base
for f in $(grep -rl '"ropekit_wait::' .ab/ropekit_base); do sed -i 's/"ropekit_wait::/"ropekit_base::/g' $f; done
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 250 python3 tools/ab_versions.py --rounds 5 --time-budget 150 --out $R/ab_wait > $R/ab_wait.txt 2>&1; grep "graph_us" $R/ab_wait.txt | head -16; grep -A6 Verdict $R/ab_wait.txt
rm -rf .ab/ropekit_base; mv .ab/ropekit_head .ab/ropekit_base
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 250 python3 exp/fused_ab.py --alt ropekit_wait --rounds 5 --budget 170 --out $R/fused_ab.json --cases decode-b64 decode-b64-qknorm decode-b64-fp8 decode-b64-page-table mla-decode-b64 decode-b64-olmo2 prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-page-table > $R/fused_ab.txt 2>&1; cat $R/fused_ab.txt | grep -v "^\[" | tail -14
cd $OUT && tar czf r.tgz r && ls -la $OUT
