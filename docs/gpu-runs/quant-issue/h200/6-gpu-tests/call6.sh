#!/usr/bin/env bash
# session 54, call 6: GPU tests of the final tree (993534b): the fused stores, their native conversions (a million
# bit patterns each for e4m3, e5m2, int8), caches, MLA, page tables
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
for folder in .whl; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff 87aa0c3 -- ropekit > $R/change.patch
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rx tests/test_fused_quant.py \
  tests/test_fused_mla.py tests/test_fused_page_table.py tests/test_fused_kv_cache.py tests/test_choice.py \
  tests/test_fused_qk_norm_rope.py > $R/pytest.txt 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED|XFAIL" $R/pytest.txt | tail -12
