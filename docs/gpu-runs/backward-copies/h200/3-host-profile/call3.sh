#!/usr/bin/env bash
# call 3: the eager ops' host path on the H200's host (decode b64): back-to-back calls, then cProfile by own time
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call3.sh exp/HEAD.txt exp/host_profile.py $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton,sys;print(torch.__version__,triton.__version__, sys.version)'; lscpu | grep -E 'Model name|^CPU\(s\)|MHz'; } | tee $R/gpu.txt
timeout 200 taskset -c 5 python3 exp/host_profile.py > $R/profile.txt 2>&1; echo rc $?
grep -E 'a call|====|tottime' -A0 $R/profile.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
