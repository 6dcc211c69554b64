#!/usr/bin/env bash
# device call 5 (session 57): v's own programs (the k programs no longer store v): the fused GPU tests, then an A/B of
# every forward fused case against the exported base
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call5.sh exp/HEAD.txt exp/change.patch $R/ 2>/dev/null
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfE tests/test_fused_quant.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_triton_fused.py tests/test_fused_mla.py tests/test_launch.py tests/test_fused_qk_norm_rope.py 2>&1 | tee $R/pytest.txt | tail -4
timeout 400 python3 tools/ab_fused.py --rounds 7 --time-budget 330 --out $R/ab-fused 2>&1 | tee $R/ab-fused.txt | tail -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
