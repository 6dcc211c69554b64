set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
OUT=$OUT/tests TEST_WORKERS=0 TEST_SECONDS=200 bash tools/gpu_run.sh test tests/test_fused_quant.py tests/test_choice.py tests/test_triton_fused.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py 2>&1 | tail -8
OUT=$OUT/ab timeout 300 bash tools/gpu_run.sh ab-fused 5b7a5b7 --rounds 7 --cases decode-b64-int8-token-head decode-b64-fp8-token-head decode-b64-nvfp4 decode-b64 decode-b64-fp8 decode-b64-page-table decode-b64-olmo2 2>&1 | tail -30
