#!/usr/bin/env bash
# device call: the model's tiles (with the compiled kernels' registers) against the rule's and its neighbours by graph
# replay on every prefill format; the copy sweep's latency fit; the choice, launch and fused tests; the fused
# benchmark (the published page) with an empty autotune cache, its picks kept
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/run2.sh exp/sweep4.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git status --short | head; } | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_choice.py tests/test_launch.py tests/test_fused_autotune.py tests/test_fused_quant.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
timeout 60 python3 -m ropekit.course.ablations --only littles_law --out $R/abl > $R/abl.txt 2>&1; python3 -c "import json; d=json.load(open('$R/abl/ablations.json')); print('copy', d['copy_ceiling']['gbps'], 'fit', d['experiments']['littles_law']['fit'])" 2>&1 | tail -2; rm -rf $R/abl
timeout ${SWEEP_SECONDS:-200} python3 exp/sweep4.py --cases prefill-b4-s4096-fp8 prefill-b4-s4096-nvfp4 prefill-b4-s4096-int8-token-head \
  prefill-b4-s4096-fp8-token-head prefill-b4-s4096-page-table prefill-b4-s4096-qknorm prefill-b4-s4096 prefill-b4-s4096-fp8-head \
  prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-q --out $R/sweep.json > $R/sweep.txt 2>&1; grep -v "^\[" $R/sweep.txt | grep -v "^facts" | tail -52
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout ${FUSED_TIMEOUT:-260} python3 -m ropekit.bench.fused --time-budget ${FUSED_SECONDS:-215} --out $R/fused > $R/fused.txt 2>&1
grep -v "^\[" $R/fused.txt | grep -E "target|\*\*no|prefill.*yes" | tail -24
cp $ROPEKIT_CACHE_DIR/autotune.json $R/fused_autotune_picks.json 2>/dev/null
cd $OUT && tar czf r.tgz r && ls -la $OUT
