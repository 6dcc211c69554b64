#!/usr/bin/env bash
# session 49 call 1: the whole suite on the current tree, ropekit check, the host split, ncu over the fused prefill
OUT=${OUT:-/tmp/out}
TEST_WORKERS=8 TEST_SECONDS=330 bash tools/gpu_run.sh test 2>&1 | grep -v "^WARNING: Target" | tail -12
python3 -m ropekit check 2>&1 | tee "$OUT/check.txt" | tail -6
export PYTHONPATH=/tmp/site:$PYTHONPATH
timeout 60 python3 docs/gpu-runs/eager-host/h200/hostsplit.py > "$OUT/hostsplit.txt" 2>&1; head -30 "$OUT/hostsplit.txt"
export ROPEKIT_CACHE_DIR=/tmp/rkcache
cases=prefill-b4-s4096,prefill-b4-s4096-qknorm,prefill-b4-s4096-int8-token-head
timeout 90 python3 exp/ncu_fused.py $cases 2>&1 | tail -3
timeout 150 ncu --kernel-name regex:fused_forward --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section SchedulerStats python3 exp/ncu_fused.py prefill-b4-s4096 > "$OUT/ncu_prefill.txt" 2>&1
grep -E "Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|DRAM Throughput|Memory Throughput|Duration|Block Size|Grid Size|Stall|Warp Cycles Per Issued|Issued Warp" "$OUT/ncu_prefill.txt" | head -40
