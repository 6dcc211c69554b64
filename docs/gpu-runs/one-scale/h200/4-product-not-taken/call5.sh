#!/usr/bin/env bash
# device call 5 (session 61): k stored at a scale a head vector (static per head, per (token, head)) as the product
# with the scale's reciprocal instead of the division (the working tree) against a6ed892
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/call5.sh exp/HEAD.txt $R/; git diff > $R/change.diff
OUT=$R/ab bash tools/gpu_run.sh ab-fused a6ed892 --rounds 7 --cases decode-b64-int8-token-head prefill-b4-s4096-int8-token-head decode-b64-fp8-token-head prefill-b4-s4096-fp8-token-head decode-b64-fp8-head prefill-b4-s4096-fp8-head decode-b64-fp8 prefill-b4-s4096 2>&1 | grep -v '^\[' | tail -12
cd $OUT && tar czf r.tgz r && rm -rf r
