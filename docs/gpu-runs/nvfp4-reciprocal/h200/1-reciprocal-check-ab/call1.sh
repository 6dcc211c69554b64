set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
cp exp/call1.sh exp/HEAD.txt exp/change.patch exp/rcp_check.py $OUT/
timeout 120 python3 exp/rcp_check.py 2>&1 | tee $OUT/rcp_check.txt | tail -8
OUT=$OUT/tests TEST_WORKERS=4 TEST_SECONDS=150 bash tools/gpu_run.sh test -rfE tests/test_fused_quant.py tests/test_triton_fused.py 2>&1 | tail -6
OUT=$OUT/ab timeout 330 bash tools/gpu_run.sh ab-fused HEAD --rounds 7 --also ropekit_rcp1,ropekit_rcp2 --cases decode-b64-int8-token-head decode-b64-fp8-token-head decode-b64-fp8 decode-b64-nvfp4 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-q prefill-b4-s4096-nvfp4 decode-b64 2>&1 | tail -40
