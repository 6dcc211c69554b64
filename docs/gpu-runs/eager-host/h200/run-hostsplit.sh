#!/usr/bin/env bash
# stop 48 call 5: an eager decode call's host time taken apart on the GPU's host
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call5.sh exp/hostsplit.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; lscpu | grep -E "Model name|MHz"; } | tee $R/gpu.txt
timeout 300 python3 exp/hostsplit.py 2>&1 | grep -v "^\[" | tee $R/hostsplit.txt | head -60
