#!/usr/bin/env bash
# call 3: the forward walking token blocks a program, pipelined (working tree: change.patch): the prefills at the
# model's choice and at walks of 4-16 token blocks, 2-4 stages (walk_tiles.py)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call3.sh exp/walk_tiles.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
ROPEKIT_AUTOTUNE=0 timeout 330 python3 exp/walk_tiles.py $R/walk_tiles.json 2>&1 | grep -v "^\[" | tee $R/walk_tiles.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
