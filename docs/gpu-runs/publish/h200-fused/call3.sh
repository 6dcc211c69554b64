#!/usr/bin/env bash
# device call 3 (session 59): the H200's fused page republished with NVFP4's block reciprocal (first, on a fresh
# machine); then the new reciprocal test, a copy without its Newton step against it, and the fused quant tests
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
timeout 290 python3 -m ropekit.bench.fused --time-budget 210 --out $R/publish/fused > $R/publish/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/publish/fused.txt | grep -E "\*\*no|NOT" | tail -30
date -u | tee -a $R/gpu.txt
rm -rf /tmp/mut && mkdir /tmp/mut && cp -r ropekit tests pyproject.toml /tmp/mut/
sed -i 's/inverse = tl.where(error == error, tl.fma(approximate, error, approximate), approximate)/inverse = approximate/' /tmp/mut/ropekit/triton/fused_tiles.py
grep -c "inverse = approximate$" /tmp/mut/ropekit/triton/fused_tiles.py | sed 's/^/mutated lines: /' | tee $R/mutation.txt
(cd /tmp/mut && PYTHONPATH=/tmp/mut:$site timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_quant.py -k every_scale 2>&1 | grep -E "assert|passed|failed" | tail -4) | tee -a $R/mutation.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 4 --dist loadfile -rfE tests/test_fused_quant.py tests/test_choice.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -2 $R/pytest.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
