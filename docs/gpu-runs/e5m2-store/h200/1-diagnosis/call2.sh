#!/bin/bash
set -x
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PYTHONPATH=$PWD
mkdir -p $OUT/d
for args in "5" "5 1" "4" ; do
  ROPEKIT_CACHE_DIR=$OUT/rc timeout 120 python3 exp/diag_graph.py $args 2>&1 | tail -12 >> $OUT/d/graph.txt
done
timeout 200 python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/test_engines.py -k "replays_in_a_cuda_graph_with_new_positions" --runxfail 2>&1 | tail -30 > $OUT/d/pytest.txt
