#!/usr/bin/env bash
# device call 7 (session 60): the fused prefills at the model's tile against one token a program (1 x 16, 1 x 32)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call7.sh exp/one_token.py exp/HEAD.txt $R/
OUT=$R ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 400 python3 exp/one_token.py > $R/one_token.txt 2>&1; echo "rc $?"; tail -60 $R/one_token.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
