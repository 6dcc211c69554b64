#!/usr/bin/env bash
# device call 1 (session 52): address/row-split probe on the Llama prefill; fused decode A/B with RELEASE_SHARE 0.55
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
OUT=$R timeout 200 python3 exp/addr_probe.py 2>&1 | tee $R/addr_probe.txt | tail -80
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 250 python3 exp/fused_ab.py --cases mla-decode-b64 decode-b64 decode-b64-olmo2 --alt ropekit_r55 --budget 200 --out $R/fused_r55.json 2>&1 | tee $R/fused_r55.txt | grep -v "^\[" | tail -12
cd $OUT && tar czf r.tgz r && ls -la $OUT
