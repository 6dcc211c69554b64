#!/usr/bin/env bash
# device call 1 (session 61): the first version of the one-scale fold (the working tree on 5034c09: q and k folded;
# .ab/ropekit_qonly: q only) against 5034c09, seven interleaved rounds, graph replay
set -u
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
git diff --stat > $OUT/diffstat.txt 2>/dev/null; cat exp/HEAD.txt >> $OUT/diffstat.txt
OUT=$OUT/call1 bash tools/gpu_run.sh ab-fused HEAD --rounds 7 --also ropekit_qonly --cases decode-b64-fp8 prefill-b4-s4096-fp8 decode-b64-e5m2 prefill-b4-s4096-e5m2 decode-b64-fp8-q prefill-b4-s4096-fp8-q decode-b64 prefill-b4-s4096 decode-b64-fp8-head prefill-b4-s4096-fp8-head
cd $OUT && tar czf call1.tgz call1 gpu.txt diffstat.txt && rm -rf call1
