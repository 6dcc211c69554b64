#!/usr/bin/env bash
# call 4: the eager A/B of the fused ops' front doors against the session's starting main (inv_freq and the M-RoPE
# sections joined their keys and tuples), then the whole suite with the peers beside compute-sanitizer (memcheck,
# racecheck) over every kernel, the fused angles and M-RoPE among them
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/call4.sh exp/HEAD.txt $R/
timeout 130 python3 tools/ab_fused.py --eager --repeats 15 --peers .peers --out $R/ab-eager --ops "apply_rope" "apply_rope (in place)" rope_and_cache "rope_and_cache + QK-norm" "rope_and_cache, float8 cache" qk_norm_rope mla_rope_and_cache 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab rc $?"; tail -10 $R/ab-eager.txt
date -u | tee -a $R/gpu.txt
(timeout 400 bash tools/sanitize.sh $R/sanitize memcheck racecheck > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; date -u >> $R/sanitize.txt) &
san=$!
timeout 390 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -30
date -u | tee -a $R/gpu.txt
wait $san
grep -E "driver|memcheck|racecheck|sanitize|launches|problem" $R/sanitize.txt | tail -8
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
