#!/usr/bin/env bash
# call 2: the fused ops' table-free angles and M-RoPE on the GPU (their tests and the kernels' tests they touch),
# then the angles benchmark (accuracy of the kernel's float64 cos/sin at 1e3, 1e6, 1e7; table against table-free,
# apply_rope and rope_and_cache) and the M-RoPE benchmark (in-kernel against materialised rows)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; git diff > $R/change.patch; cp exp/call2.sh exp/HEAD.txt $R/
timeout 200 python3 -m ropekit.bench.angles --out $R/angles > $R/angles.txt 2>&1; echo "angles rc $?"; tail -8 $R/angles.txt
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m ropekit.bench.mrope --out $R/mrope > $R/mrope.txt 2>&1; echo "mrope rc $?"; tail -12 $R/mrope.txt
date -u | tee -a $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_fused_angles.py tests/test_angles.py tests/test_mrope.py tests/test_triton_fused.py tests/test_fused_qk_norm_rope.py tests/test_fused_kv_cache.py tests/test_norm_placement.py tests/test_norm_all_heads.py tests/test_v4.py tests/test_api.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
