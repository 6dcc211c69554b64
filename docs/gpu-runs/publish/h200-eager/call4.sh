#!/usr/bin/env bash
# device call 4 (session 56): the edge and hook tests on the GPU; the H200's fused page and eager page republished
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/publish
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call4.sh exp/HEAD.txt $R/
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 -rfE tests/test_fused_quant.py tests/test_launch.py 2>&1 | tee $R/pytest.txt | tail -3
timeout 280 python3 -m ropekit.bench.fused --time-budget 200 --out $R/publish/fused > $R/publish/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/publish/fused.txt | grep -E "\*\*no|NOT" | tail -30
timeout 120 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/publish/eager > $R/publish/eager.txt 2>&1
echo "eager rc $?"; grep -v "^\[" $R/publish/eager.txt | grep "NOT" | tail -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
