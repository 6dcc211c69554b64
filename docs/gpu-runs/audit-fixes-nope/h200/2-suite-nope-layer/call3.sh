#!/usr/bin/env bash
# call 3: the stop's final tree: the whole suite (with the peers), `python -m ropekit check`, then a Llama 4 NoPE
# layer's pre-processing timed (exp/s69/nope_bench.py: the fused op, its unfused chain, torch.compile of the chain)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s69/call3.sh exp/s69/nope_bench.py exp/HEAD.txt $R/
timeout 400 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -30
date -u | tee -a $R/gpu.txt
timeout 60 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $?" | tee -a $R/check.txt; tail -4 $R/check.txt
timeout 110 python3 exp/s69/nope_bench.py > $R/nope_bench.txt 2>&1; echo "nope bench rc $?"; cat $R/nope_bench.txt | grep -v "^\[" | tail -16
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
