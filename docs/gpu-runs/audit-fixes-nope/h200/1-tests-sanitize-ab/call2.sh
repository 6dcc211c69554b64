#!/usr/bin/env bash
# call 2: this stop's fixes and the fused NoPE layer against 0b7dc4b (.ab): the graph-clock A/B of fused cases whose
# kernel code ptx_diff says is unchanged, the eager A/B of the fused front doors (host paths changed), the GPU tests
# of the changed areas beside compute-sanitizer (memcheck, racecheck: the driver's new NoPE launch)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s69/call2.sh exp/HEAD.txt $R/
(timeout 330 bash tools/sanitize.sh $R/sanitize memcheck racecheck > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; date -u >> $R/sanitize.txt) &
san=$!
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfE tests/test_nope.py tests/test_fused_quant.py tests/test_fused_mla.py tests/test_engines.py tests/test_te.py tests/test_validate.py tests/test_fused_angles.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
wait $san
grep -E "driver|memcheck|racecheck|sanitize|launches|problem|NoPE" $R/sanitize.txt | tail -8
timeout 120 python3 tools/ab_fused.py --rounds 9 --peers .peers --out $R/ab-fused --cases decode-b64 prefill-b4-s4096 decode-b64-fp8 mla-decode-b64 2>&1 | grep -v "^\[" > $R/ab-fused.txt
echo "ab rc $?"; tail -8 $R/ab-fused.txt
timeout 150 python3 tools/ab_fused.py --eager --repeats 11 --peers .peers --out $R/ab-eager 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab eager rc $?"; tail -16 $R/ab-eager.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
