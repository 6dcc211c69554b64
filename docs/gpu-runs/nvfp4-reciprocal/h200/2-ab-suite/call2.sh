#!/usr/bin/env bash
# device call 2 (session 59): NVFP4's block-scale reciprocal by the GPU's approximate one + a Newton step:
# A/B of the NVFP4 cases against HEAD (exported in .ab), the new exhaustive test and its mutation, the whole suite
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/call2.sh exp/HEAD.txt exp/change.patch $R/
OUT=$R/ab timeout 150 bash tools/gpu_run.sh ab-fused HEAD --rounds 9 --cases decode-b64-nvfp4 prefill-b4-s4096-nvfp4 decode-b64 2>&1 | tail -6
site=/tmp/site; export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
git status --short > $R/tree.txt
# the mutation: the approximate reciprocal without its Newton step must fail the new test
rm -rf /tmp/mut && mkdir /tmp/mut && cp -r ropekit tests pyproject.toml /tmp/mut/
sed -i 's/inverse = tl.where(error == error, tl.fma(approximate, error, approximate), approximate)/inverse = approximate/' /tmp/mut/ropekit/triton/fused_tiles.py
grep -c "inverse = approximate$" /tmp/mut/ropekit/triton/fused_tiles.py | sed 's/^/mutated lines: /' | tee $R/mutation.txt
(cd /tmp/mut && PYTHONPATH=/tmp/mut:$site timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_quant.py -k every_scale 2>&1 | tail -4) | tee -a $R/mutation.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_quant.py -k every_scale 2>&1 | tail -2 | tee $R/new_test.txt
date -u | tee -a $R/gpu_dates.txt
timeout 400 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE --junitxml=$R/suite.xml tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu_dates.txt
cd $OUT && tar czf r.tgz r && rm -rf r
