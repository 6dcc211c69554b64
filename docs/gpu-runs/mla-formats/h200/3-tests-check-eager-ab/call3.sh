#!/usr/bin/env bash
# call 3: the final tree: the GPU tests of the changed areas beside `python -m ropekit check`; then the eager A/B of
# mla_rope_and_cache (and rope_and_cache) against 716be06 (.ab) with the benchmark's call written as before
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s70/call3.sh exp/HEAD.txt $R/
rm -f ~/.cache/torch_extensions/*/ropekit_cuda/lock
(timeout 230 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $?" >> $R/check.txt) &
chk=$!
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfE tests/test_fused_ds_mla.py tests/test_fused_mla.py tests/test_docs.py tests/test_bench_fused.py tests/test_bench_fused_tune.py tests/test_relaunch.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
wait $chk; tail -3 $R/check.txt
date -u | tee -a $R/gpu.txt
timeout 100 python3 tools/ab_fused.py --eager --repeats 11 --peers .peers --ops mla_rope_and_cache "apply_rope + index_copy_ (latent cache)" rope_and_cache "apply_rope + index_copy_ x2" --out $R/ab-eager 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab eager rc $?"; tail -16 $R/ab-eager.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
