#!/usr/bin/env bash
# stop 48 call 7: the same eager A/B and the published eager page, on an H100
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call7.sh exp/eager_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git diff --stat -- ropekit; } | tee $R/gpu.txt
timeout 100 python3 exp/eager_ab.py 7 2>&1 | grep -v "^\[" | tee $R/ab.txt
timeout 110 python3 -m ropekit.bench.eager --peers .peers --time-budget 55 --out $R/eager 2>&1 | tee $R/eager.txt \
  | grep -v "^\[" | tail -3
cd $OUT && tar czf r.tgz r
