#!/usr/bin/env bash
# call 4: the final tree: `python -m ropekit check` (call 3's stopped at its 60 s limit), then the eager A/B of the
# fused front doors against 0b7dc4b (.ab), 15 repeats of every call
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s69/call4.sh exp/HEAD.txt $R/
start=$(date +%s)
timeout 240 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $? in $(( $(date +%s) - start )) s" | tee -a $R/check.txt; tail -11 $R/check.txt
timeout 200 python3 tools/ab_fused.py --eager --repeats 15 --peers .peers --out $R/ab-eager 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab eager rc $?"; grep -E "rope_and_cache|qk_norm_rope|mla" $R/ab-eager.txt | grep new
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
