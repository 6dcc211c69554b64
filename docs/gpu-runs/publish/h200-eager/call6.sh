#!/usr/bin/env bash
# session 53, call 6: the H200's fused page and eager page, republished on the adopted tree
set -u
OUT=${OUT:-/tmp/out}; P=$OUT/publish; mkdir -p $P
export PYTHONUNBUFFERED=1
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$site" .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; python3 -m ropekit info; } > $P/gpu.txt 2>&1
head -3 $P/gpu.txt
git diff -- ropekit > $P/change.patch
timeout 270 python3 -m ropekit.bench.fused --time-budget 200 --out $P/fused > $P/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $P/fused.txt | grep -E "\*\*no|yes" | cut -c1-120 | tail -60
timeout 110 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $P/eager > $P/eager.txt 2>&1
echo "eager rc $?"; grep -v "^\[" $P/eager.txt | tail -14
cd $OUT && tar -czf publish.tgz publish && rm -rf publish
