#!/usr/bin/env bash
# call 6: the e5m2 store fix (one inline-assembly block a pair, codes in 16 bits): the fused float8 and engine GPU tests, the
# new every-tile test against the tree before (fused_tiles.py as HEAD: must fail for e5m2 only), and a graph-clock
# A/B of the e5m2 cases against HEAD
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/call6.sh exp/HEAD.txt exp/change.patch $R/
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/test_fused_quant.py tests/test_engines.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
timeout 150 python3 tools/ab_fused.py --rounds 11 --peers .peers --out $R/ab-fused --also ropekit_p1 --cases decode-b64-e5m2 prefill-b4-s4096-e5m2 decode-b64-fp8 2>&1 | grep -v "^\[" > $R/ab-fused.txt
echo "ab rc $?"; tail -12 $R/ab-fused.txt
date -u | tee -a $R/gpu.txt
# the new test against the store before the fix
cp ropekit/triton/fused_tiles.py /tmp/fixed.py
cp exp/fused_tiles_head.py ropekit/triton/fused_tiles.py
grep -c "e5m2_native" ropekit/triton/fused_tiles.py
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_fused_quant.py -k "native_backends_bytes_at_every_tile" > $R/mutation.txt 2>&1
echo "mutation rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" $R/mutation.txt | tail -5
cp /tmp/fixed.py ropekit/triton/fused_tiles.py
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
