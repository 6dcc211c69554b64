#!/usr/bin/env bash
# device call 3 (session 62): the fused GPU tests at the per-(token, head) prefill rule, then the H200's fused page
# republished on it
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
cp exp/call3.sh exp/HEAD.txt $R/; git status --short > $R/tree.txt
TEST_WORKERS=8 TEST_SECONDS=170 OUT=$R/test bash tools/gpu_run.sh test tests/test_fused_quant.py tests/test_engines.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_native.py tests/test_fused_page_table.py tests/test_choice.py tests/test_bench_fused_tune.py 2>&1 | tail -3
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; date -u; } 2>&1 | tee $R/gpu.txt
timeout 300 python3 -m ropekit.bench.fused --time-budget 240 --out $R/publish/fused > $R/fused.txt 2>&1
echo "fused rc $?"; tail -1 $R/fused.txt
grep -E "^prefill|^decode|backward" $R/fused.txt | head -0
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
