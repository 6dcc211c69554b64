set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
OUT=$OUT/ab timeout 300 bash tools/gpu_run.sh ab-fused 5b7a5b7 --rounds 9 --also ropekit_w8 --cases decode-b64-int8-token-head decode-b64-fp8-token-head decode-b64-nvfp4 decode-b64 2>&1 | tail -30
