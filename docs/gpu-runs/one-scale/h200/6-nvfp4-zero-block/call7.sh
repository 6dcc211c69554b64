#!/usr/bin/env bash
# device call 7 (session 61): NVFP4's store with the e2m1 rounding's constant alone (the working tree: a zero block
# divided by 1 again), against 5034c09 (before both) and .ab/ropekit_both (a6ed892: also the zero block divided by
# infinity, 96 registers a thread under Triton 3.6 where 80 were)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/call7.sh exp/HEAD.txt $R/; git diff > $R/change.diff
OUT=$R/ab bash tools/gpu_run.sh ab-fused 5034c09 --rounds 9 --also ropekit_both --cases decode-b64-nvfp4 prefill-b4-s4096-nvfp4 decode-b64 prefill-b4-s4096 2>&1 | grep -v '^\[' | tail -5
cd $OUT && tar czf r.tgz r && rm -rf r
