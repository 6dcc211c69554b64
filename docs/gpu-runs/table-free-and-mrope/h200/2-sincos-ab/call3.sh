#!/usr/bin/env bash
# call 3: table-free sin/cos as one polynomial each after the quadrant (no libdevice call): an A/B against the base
# (libdevice's float64 sin and cos) in one process, then the angles benchmark (accuracy and speed) and the M-RoPE
# benchmark (its build path now capturable), then the GPU tests of the angles, M-RoPE and fused ops
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; git diff > $R/change.patch; cp exp/call3.sh exp/tf_ab.py exp/HEAD.txt $R/
timeout 150 python3 exp/tf_ab.py $R/tf_ab.json > $R/tf_ab.txt 2>&1; echo "ab rc $?"; cat $R/tf_ab.txt | cut -c1-400
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m ropekit.bench.angles --out $R/angles > $R/angles.txt 2>&1; echo "angles rc $?"; tail -7 $R/angles.txt; grep -c "no worse" $R/angles.txt
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m ropekit.bench.mrope --out $R/mrope > $R/mrope.txt 2>&1; echo "mrope rc $?"; tail -14 $R/mrope.txt
date -u | tee -a $R/gpu.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_fused_angles.py tests/test_angles.py tests/test_mrope.py tests/test_v4.py tests/test_nope.py tests/test_triton_fused.py tests/test_fused_qk_norm_rope.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
