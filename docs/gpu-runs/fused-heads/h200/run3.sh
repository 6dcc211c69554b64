#!/usr/bin/env bash
# short device call: the copy sweep's latency fit, then the model's tiles against the rule's and its neighbours on
# every prefill format (graph replay), written as it goes
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/run3.sh exp/sweep4.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 40 python3 -m ropekit.course.ablations --only littles_law --out $R/abl > $R/abl.txt 2>&1; python3 -c "import json; d=json.load(open('$R/abl/ablations.json')); print('copy', d['copy_ceiling']['gbps'], 'fit', d['experiments']['littles_law']['fit'])" 2>&1 | tail -1 | tee $R/fit.txt; rm -rf $R/abl
timeout ${SWEEP_SECONDS:-170} python3 exp/sweep4.py --cases prefill-b4-s4096-fp8 prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-nvfp4 \
  prefill-b4-s4096-int8-token-head prefill-b4-s4096-page-table prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-head \
  prefill-b4-s4096-fp8-q --out $R/sweep.json > $R/sweep.txt 2>&1; grep -v "^\[" $R/sweep.txt | grep -v "^facts" | tail -52
