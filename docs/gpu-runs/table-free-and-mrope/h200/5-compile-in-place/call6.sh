#!/usr/bin/env bash
# call 6: in place under torch.compile with fresh outputs copied back: every op compiled (inductor) against eager
# with the written tensors views taken inside the compiled function (diag2.py); the MLA cases eager in a fresh
# process against the reference (diag3.py); the GPU tests of the fused cache ops, the float8 stores and the engines
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call6.sh exp/diag2.py exp/diag3.py exp/HEAD.txt $R/
timeout 60 python3 exp/diag3.py > $R/diag3.txt 2>&1; echo "diag3 rc $?"; cat $R/diag3.txt | tail -4
timeout 150 python3 exp/diag2.py > $R/diag2.txt 2>&1; echo "diag2 rc $?"; grep "equal" $R/diag2.txt | tail -10
date -u | tee -a $R/gpu.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_fused_mla.py tests/test_fused_quant.py tests/test_engines.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_norm_placement.py tests/test_fused_qk_norm_rope.py tests/test_reliability_fuzz_angles.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
