#!/usr/bin/env bash
# device call 5 (session 59): racecheck over the quantising-store launches with QK-norm, the tree (HEAD) and the tree
# before NVFP4's reciprocal (f4bc366, exp/base_tree), each report interleaved with the launches
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu_name.txt; cp exp/call5.sh exp/race_driver.py exp/HEAD.txt $R/
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
for tree in head base; do
  pp=""; [ $tree = base ] && pp=exp/base_tree
  PYTHONPATH=$pp PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 75 "$cs" --tool racecheck --print-limit 4 python3 exp/race_driver.py block token_head > $R/race_$tree.txt 2>&1
  echo "$tree rc $?"; grep -E "ropekit from|LAUNCHED|RACECHECK SUMMARY|Error: Race" $R/race_$tree.txt | cut -c1-150 | head -24
done
cd $OUT && tar czf r.tgz r && rm -rf r
