#!/usr/bin/env bash
# device call 2 (session 56): Triton's launcher called directly when no launch hook is installed: eager A/B against
# HEAD (.ab/ropekit_base), the eager page, the whole suite on the GPU
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; git diff -- ropekit tests > $R/change.patch; cat .ab/REF > $R/ref.txt; cp exp/call2.sh exp/eager_ab.py $R/
timeout 150 python3 exp/eager_ab.py --out $R/eager_ab.json --peers .peers --repeats 9 > $R/eager_ab.txt 2>&1
echo "eager ab rc $?"; cat $R/eager_ab.txt
mkdir -p $R/eager
timeout 130 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager > $R/eager/eager.txt 2>&1
echo "eager rc $?"; grep -v "^\[" $R/eager/eager.txt | tail -12
date -u | tee -a $R/gpu.txt
mkdir -p $R/suite
OUT=$R/suite TEST_WORKERS=8 TEST_SECONDS=320 bash tools/gpu_run.sh test > /dev/null 2>&1
tail -n 4 $R/suite/pytest.txt; grep -E "^(FAILED|ERROR)" $R/suite/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
