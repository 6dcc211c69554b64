#!/usr/bin/env bash
# call 9: the H200's fused page at the final tree
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call9.sh exp/HEAD.txt $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 270 python3 -m ropekit.bench.fused --time-budget 200 --out $R/fused > $R/fused.txt 2>&1; echo "bench rc $?"
grep -E "\*\*no|backward" $R/fused.txt | tail -12
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
