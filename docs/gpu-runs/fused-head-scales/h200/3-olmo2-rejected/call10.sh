#!/usr/bin/env bash
# device call (session 55): the weights of a norm over all heads loaded with the tile in a small grid: fused A/B against HEAD, GPU tests
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt; cp exp/call10.sh exp/fused_ab.py $R/
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 200 python3 exp/fused_ab.py --out $R/ab.json --rounds 11 \
  --budget 120 --cases decode-b64-olmo2 prefill-b4-s4096-olmo2 decode-b64-qknorm > $R/ab.txt 2>&1
echo "ab rc $?"; grep -v "^\[" $R/ab.txt | cut -c1-220
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_fused_qk_norm_rope.py tests/test_fused_kv_cache.py 2>&1 | tee $R/pytest.txt | tail -3
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
