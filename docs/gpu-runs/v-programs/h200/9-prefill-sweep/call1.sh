#!/usr/bin/env bash
# device call 1 (session 62): fused GPU tests on the tree (the native backend's float64 fix), then forced-tile
# sweeps: v's programs apart on the reduced-scale prefills, the float8 q's tokens a program
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call1.sh exp/sweep62.py exp/HEAD.txt $R/; git status --short > $R/tree.txt
TEST_WORKERS=8 TEST_SECONDS=170 OUT=$R/test bash tools/gpu_run.sh test tests/test_fused_quant.py tests/test_engines.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_native.py tests/test_fused_page_table.py 2>&1 | tail -3
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
ROPEKIT_AUTOTUNE=0 timeout 300 python3 exp/sweep62.py > $R/sweep.txt 2>&1
echo "sweep rc $?"; grep -v "^\[" $R/sweep.txt | tail -45
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
