#!/usr/bin/env bash
# device call 3 (session 57): the A/B tool's test on the GPU, notebook 09 executed, the H200's fused page republished
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/publish
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call3.sh exp/HEAD.txt $R/
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_tools_ab_fused.py 2>&1 | tee $R/pytest.txt | tail -2
OUT=$R bash tools/gpu_notebooks_batch.sh 150 notebooks/09_fusion.ipynb
date -u | tee -a $R/gpu.txt
timeout 290 python3 -m ropekit.bench.fused --time-budget 210 --out $R/publish/fused > $R/publish/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/publish/fused.txt | grep -E "\*\*no|NOT" | tail -30
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
