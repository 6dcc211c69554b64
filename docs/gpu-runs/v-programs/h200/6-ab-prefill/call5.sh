set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
OUT=$OUT/ab timeout 400 bash tools/gpu_run.sh ab-fused 5b7a5b7 --rounds 5 --cases prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8-q prefill-b4-s4096-nvfp4 prefill-b4-s4096-int8-token-head prefill-b4-s4096-olmo2 2>&1 | tail -12
