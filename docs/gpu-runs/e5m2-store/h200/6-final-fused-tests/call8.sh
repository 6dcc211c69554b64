#!/usr/bin/env bash
# call 8: the final tree (the named launch tuples): the fused, engine and norm GPU tests
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call8.sh exp/HEAD.txt $R/
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_fused_qk_norm_rope.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_engines.py tests/test_fused_quant.py tests/test_norm_placement.py tests/test_norm_all_heads.py tests/test_fused_angles.py tests/test_fused_page_table.py tests/test_te.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
