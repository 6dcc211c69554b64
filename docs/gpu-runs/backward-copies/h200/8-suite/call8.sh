#!/usr/bin/env bash
# call 8: the final tree's whole suite on the GPU, with the peers (pytest -n 12), then python -m ropekit check
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call8.sh exp/HEAD.txt $R/
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
timeout 430 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile -rfE tests/ > $R/pytest.txt 2>&1
echo "suite rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
s=$(date +%s); timeout 100 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $? in $(( $(date +%s) - s )) s" | tee -a $R/check.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
