set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
OUT=$OUT/ab timeout 300 bash tools/gpu_run.sh ab-fused HEAD --rounds 9 --also ropekit_hk2,ropekit_hk4 --cases decode-b64-nvfp4 decode-b64-int8-token-head decode-b64-fp8-token-head 2>&1 | tail -6
