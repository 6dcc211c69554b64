#!/usr/bin/env bash
# call 1: the merged tree: the whole suite on the GPU beside compute-sanitizer (memcheck and racecheck over the
# driver's launches, the new MLA table-free and fp8_ds_mla launches among them)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s70/call1.sh exp/HEAD.txt $R/
(timeout 420 bash tools/sanitize.sh $R/sanitize memcheck racecheck > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; date -u >> $R/sanitize.txt) &
san=$!
timeout 470 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -30
date -u | tee -a $R/gpu.txt
wait $san
grep -E "driver|memcheck|racecheck|sanitize|launches|problem|ERROR SUMMARY" $R/sanitize.txt | tail -10
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
