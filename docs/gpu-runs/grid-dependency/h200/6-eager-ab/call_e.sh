#!/usr/bin/env bash
# device call E: eager A/B (host cost) of this tree (programmatic launches) against 9a97e3e, one process, taskset-pinned
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff 9a97e3e -- ropekit > $R/change.patch 2>/dev/null; cat .ab/REF > $R/ref.txt
for i in 1 2; do
  ROPEKIT_AUTOTUNE=0 timeout 150 taskset -c 2 python3 exp/eager_ab.py 9 > $R/eager_ab_$i.txt 2>&1; tail -24 $R/eager_ab_$i.txt
done
