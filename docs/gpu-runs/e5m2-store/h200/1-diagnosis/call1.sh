#!/bin/bash
# call 1: diagnose the e5m2 GQA q bug; each case a fresh process with its own Triton cache
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PYTHONPATH=$PWD
mkdir -p $OUT/d
n=0
for args in "5n,5n,5n" "5g,5g,5g" "4g,4g,5g,5g,5g" "5n,5n,5n side" "5g,5g,5g hook" "5g,5g,5g clear" "4n,5n,5n,4n"; do
  n=$((n+1))
  TRITON_CACHE_DIR=$OUT/tc$n ROPEKIT_CACHE_DIR=$OUT/rc$n timeout 120 python3 exp/diag_e5m2.py $args 2>&1 | tail -8 | tee -a $OUT/d/diag.txt
done
for n in 1 2 3; do
  echo "== tc$n" >> $OUT/d/ptx.txt
  for f in $(ls $OUT/tc$n/*/*.ptx 2>/dev/null); do echo "$f $(grep -c . $f)" >> $OUT/d/ptx.txt; grep -n "cvt.*e5m2\|cvt.*e4m3" $f | head -20 >> $OUT/d/ptx.txt; done
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_engines.py -k "replays_in_a_cuda_graph_with_new_positions" --runxfail -p no:xdist 2>&1 | tail -30 > $OUT/d/pytest.txt
