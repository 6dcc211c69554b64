#!/usr/bin/env bash
# call 4: the per-head QK-norm backward at wider tiles (exp/bwd_tiles.py), graph replay
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call4.sh exp/HEAD.txt exp/bwd_tiles.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 250 python3 exp/bwd_tiles.py $R/bwd_tiles.json 2>&1 | grep -v "^\[" | tee $R/bwd_tiles.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
