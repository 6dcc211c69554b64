#!/usr/bin/env bash
# device call 2 (session 62): A/B of the per-(token, head) prefill rule (v's programs apart, 16 heads) against
# 4b73b63, beside the variant that also gives NVFP4's prefill v's own programs (ropekit_uni), with controls
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call2.sh exp/HEAD.txt exp/change.patch $R/; git status --short > $R/tree.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
OUT=$R/ab bash tools/gpu_run.sh ab-fused 4b73b63 --rounds 9 --also ropekit_uni --cases prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-nvfp4 decode-b64-int8-token-head decode-b64-nvfp4 prefill-b4-s4096-fp8-q prefill-b4-s4096 prefill-b4-s4096-fp8 2>&1 | grep -v '^\[' | tail -14
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
