#!/usr/bin/env bash
# call 4: the fused launch sweep (ropekit.bench.fused_tune) on MLA's bf16 prefill, which call 2 measured slower fused
# (223.5 us) than its unfused chain (183.3 us): the launch choice against its neighbours, graph replay
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/s70/call4.sh exp/HEAD.txt $R/
timeout 170 python3 -m ropekit.bench.fused_tune --cases mla-prefill-b4-s4096 --time-budget 130 --out $R/tune > $R/tune.txt 2>&1
echo "tune rc $?"; grep -v "^\[" $R/tune.txt | tail -40
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
