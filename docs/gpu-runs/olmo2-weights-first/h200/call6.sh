set -u
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu_name.txt
OUT=$OUT/ab timeout 300 bash tools/gpu_run.sh ab-fused HEAD --rounds 7 --also ropekit_wall --cases decode-b64-olmo2 prefill-b4-s4096-olmo2 decode-b64-qknorm decode-b64 2>&1 | tail -8
