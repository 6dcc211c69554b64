#!/usr/bin/env bash
# device call 8 (session 60): the two lane-agreement tests (forward and backward) on this tree and on 25419bc, whose
# norm sums let lanes disagree (mutation check of the new backward test)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; git status --short | grep -v "^??"; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call8.sh exp/HEAD.txt $R/
K="one_factor or scales_every_channel"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_qk_norm_rope.py -k "$K" -rfE > $R/head.txt 2>&1; echo "head rc $?"; tail -2 $R/head.txt
(cd exp/mut && PYTHONPATH=../base_tree python3 -c "import ropekit; print('ropekit from', ropekit.__file__)"; PYTHONPATH=../base_tree timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" test_fused_qk_norm_rope.py -k "$K" -rfE > $R/base.txt 2>&1; echo "base rc $?"; grep -E "^E .*groups|passed|failed" $R/base.txt | head -12)
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
