#!/usr/bin/env bash
# device call 2 (session 61): the one-scale fold and the NVFP4 store's cuts: GPU tests of the fused stores, the A/B
# of every case whose code changed (and controls) against 5034c09, the prefill tile sweeps of float8 q and NVFP4
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call2.sh exp/HEAD.txt $R/; git status --short > $R/tree.txt
TEST_WORKERS=8 TEST_SECONDS=200 OUT=$R/test bash tools/gpu_run.sh test tests/test_fused_quant.py tests/test_engines.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_native.py tests/test_fused_page_table.py 2>&1 | tail -6
OUT=$R/ab bash tools/gpu_run.sh ab-fused 5034c09 --rounds 7 --cases decode-b64-fp8 prefill-b4-s4096-fp8 decode-b64-e5m2 prefill-b4-s4096-e5m2 decode-b64-fp8-q prefill-b4-s4096-fp8-q decode-b64-nvfp4 prefill-b4-s4096-nvfp4 decode-b64 prefill-b4-s4096 prefill-b4-s4096-fp8-head prefill-b4-s4096-int8-token-head 2>&1 | grep -v '^\[' | tail -14
ROPEKIT_AUTOTUNE=0 timeout 210 python3 -m ropekit.bench.fused_tune --cases prefill-b4-s4096-fp8-q prefill-b4-s4096-nvfp4 --time-budget 170 --out $R/tune > $R/tune.txt 2>&1
echo "tune rc $?"; grep -v "^\[" $R/tune.txt | tail -40
date -u | tee -a $R/test/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
