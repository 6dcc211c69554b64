#!/bin/bash
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/gpu.txt
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PYTHONPATH=$PWD
mkdir -p $OUT/d
ROPEKIT_CACHE_DIR=$OUT/rc TRITON_CACHE_DIR=$OUT/tc timeout 300 python3 exp/diag3.py 2>&1 | tail -40 > $OUT/d/diag3.txt
mkdir -p $OUT/ptx; n=0; for f in $OUT/tc/*/fused_forward_kernel.ptx; do n=$((n+1)); cp $f $OUT/ptx/$n.ptx; done
rm -rf $OUT/tc $OUT/rc
