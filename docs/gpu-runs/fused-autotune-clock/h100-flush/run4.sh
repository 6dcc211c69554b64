#!/usr/bin/env bash
# device call: (a) the choice and autotune tests; (b) A/B of the fused autotune, HEAD (one timing a candidate, no
# flush, the hint and order flipped among the candidates) against the new (interleaved rounds, the L2 flushed, half the warps instead), each pick timed beside the model's by graph replay;
# (c) the fused benchmark with the autotune on and an empty cache (the published page), its picks kept
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/run4.sh exp/sweep3.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_choice.py tests/test_fused_autotune.py > $R/pytest_choice.txt 2>&1; tail -2 $R/pytest_choice.txt
timeout 200 python3 exp/sweep3.py --cases prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-page-table \
  prefill-b4-s4096-fp8-head prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-q prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-token-head \
  prefill-b4-s4096-nvfp4 prefill-b4-s4096-olmo2 --extra "2,16,4,1,1;2,8,2,1,1" --out $R/clock_ab.json > $R/clock_ab.txt 2>&1; grep -v "^\[" $R/clock_ab.txt | tail -60
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 300 python3 -m ropekit.bench.fused --time-budget ${FUSED_SECONDS:-230} --out $R/fused > $R/fused.txt 2>&1
grep -v "^\[" $R/fused.txt | grep -E "\*\*no|NOT|prefill.*yes" | tail -30
cp $ROPEKIT_CACHE_DIR/autotune.json $R/fused_autotune_picks.json 2>/dev/null
cd $OUT && tar czf r.tgz r && ls -la $OUT
