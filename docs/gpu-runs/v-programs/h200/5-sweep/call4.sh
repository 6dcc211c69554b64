#!/usr/bin/env bash
# device call 4 (session 58): the H200's fused page republished with v's programs apart, then the decode sweep of
# the three formats whose scales are reduced, each tile with and without v's programs apart
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/publish
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/call4.sh exp/HEAD.txt $R/
timeout 290 python3 -m ropekit.bench.fused --time-budget 210 --out $R/publish/fused > $R/publish/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/publish/fused.txt | grep -E "\*\*no|NOT" | tail -30
date -u | tee -a $R/gpu.txt
ROPEKIT_AUTOTUNE=0 timeout 170 python3 -m ropekit.bench.fused_tune --time-budget 110 --out $R/sweep \
  --cases decode-b64-int8-token-head decode-b64-fp8-token-head decode-b64-nvfp4 > $R/sweep.txt 2>&1
echo "sweep rc $?"; grep -v "^\[" $R/sweep.txt | tail -56
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
