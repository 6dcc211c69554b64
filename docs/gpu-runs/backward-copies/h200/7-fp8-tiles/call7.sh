#!/usr/bin/env bash
# call 7: the float8 caches' prefill at 2 and 4 tokens a program (exp/fp8_tiles.py), graph replay
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call7.sh exp/HEAD.txt exp/fp8_tiles.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 250 python3 exp/fp8_tiles.py $R/fp8_tiles.json 2>&1 | grep -v "^\[" | tee $R/fp8_tiles.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
