#!/usr/bin/env bash
# device call 1 (session 57): the reduced-value store (per-(token, head) scales, NVFP4 block scales) on the GPU:
# the fused GPU tests, then an A/B of the changed formats against the exported base
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call1.sh exp/HEAD.txt exp/change.patch $R/ 2>/dev/null
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 -rfE tests/test_fused_quant.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_triton_fused.py tests/test_launch.py 2>&1 | tee $R/pytest.txt | tail -4
timeout 330 python3 tools/ab_fused.py --rounds 7 --time-budget 260 --out $R/ab-fused --cases decode-b64 decode-b64-int8-token-head \
  decode-b64-fp8-token-head decode-b64-nvfp4 prefill-b4-s4096 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head \
  prefill-b4-s4096-nvfp4 decode-b64-fp8 2>&1 | tee $R/ab-fused.txt | tail -12
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
