#!/usr/bin/env bash
# call 7: the final tree: the graph-clock A/B of the float8 cases against 75470f8 (.ab), the whole suite beside
# compute-sanitizer (memcheck, racecheck), then `python -m ropekit check`
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/call7.sh exp/HEAD.txt $R/
timeout 100 python3 tools/ab_fused.py --rounds 11 --peers .peers --out $R/ab-fused --cases decode-b64-e5m2 prefill-b4-s4096-e5m2 decode-b64-fp8 2>&1 | grep -v "^\[" > $R/ab-fused.txt
echo "ab rc $?"; tail -5 $R/ab-fused.txt
date -u | tee -a $R/gpu.txt
(timeout 380 bash tools/sanitize.sh $R/sanitize memcheck racecheck > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; date -u >> $R/sanitize.txt) &
san=$!
timeout 380 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -30
date -u | tee -a $R/gpu.txt
wait $san
grep -E "driver|memcheck|racecheck|sanitize|launches|problem" $R/sanitize.txt | tail -8
timeout 60 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $?" | tee -a $R/check.txt; tail -5 $R/check.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
