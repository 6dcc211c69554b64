#!/usr/bin/env bash
# device call 1 (session 56): cos/sin loaded in the heads' layout (no shared-memory round trip) and the division's
# clamped guess: fused GPU tests; A/B base (HEAD) / alt0 (the clamp only) / new (both)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git status --short > $R/tree.txt; git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt; cp exp/call1.sh exp/fused_ab.py $R/
timeout 130 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_fused_quant.py \
  tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_fused_mla.py tests/test_fused_qk_norm_rope.py \
  tests/test_norm_all_heads.py tests/test_norm_placement.py 2>&1 | tee $R/pytest.txt | tail -4
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 340 python3 exp/fused_ab.py --out $R/ab.json --rounds 7 \
  --budget 300 --alt ropekit_alt0 --cases prefill-b4-s4096 prefill-b4-s4096-fp8-q decode-b64-fp8 decode-b64-fp8-q \
  prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-e5m2 prefill-b4-s4096-int8-token-head \
  prefill-b4-s4096-fp8-token-head prefill-b4-s4096-page-table decode-b64 prefill-b4-s4096-nvfp4 qknorm-backward-b4-s4096 \
  prefill-b4-s4096-olmo2 decode-b64-fp8-token-head decode-b64-nvfp4 prefill-b4-s4096-fp8-head mla-decode-b64 > $R/ab.txt 2>&1
echo "ab rc $?"; grep -v "^\[" $R/ab.txt | cut -c1-260
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
