#!/usr/bin/env bash
# call 5: the two GPU-only failures diagnosed (diag.py), then the eager A/B of the fused front doors against the
# session's starting main once more (the angles' host arguments now add nothing to a key at their defaults)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; } 2>&1 | tee $R/gpu.txt
git diff > $R/change.patch; cp exp/call5.sh exp/diag.py exp/HEAD.txt $R/
timeout 150 python3 exp/diag.py > $R/diag.txt 2>&1; echo "diag rc $?"; grep -v "^\s*$" $R/diag.txt | tail -14
date -u | tee -a $R/gpu.txt
timeout 130 python3 tools/ab_fused.py --eager --repeats 15 --peers .peers --out $R/ab-eager --ops "apply_rope" rope_and_cache "rope_and_cache + QK-norm" "rope_and_cache, float8 cache" qk_norm_rope mla_rope_and_cache 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab rc $?"; cat $R/ab-eager.txt | tail -12
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
