set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
cp exp/call8.sh exp/HEAD.txt $OUT/
TEST_WORKERS=4 TEST_SECONDS=200 bash tools/gpu_run.sh test -rfE tests/test_bench_fused_tune.py tests/test_choice.py tests/test_fused_quant.py 2>&1 | tail -6
