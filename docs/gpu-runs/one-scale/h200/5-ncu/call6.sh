#!/usr/bin/env bash
# device call 6 (session 61): ncu over one launch of each of five fused prefills at the library's choice, the GPU's
# own clocks: what bounds the float8 q, NVFP4 and per-(token, head) prefills once their division is gone or cut
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; cat exp/HEAD.txt; date -u; } | tee $R/gpu.txt
cp exp/call6.sh exp/ncu_fused.py exp/HEAD.txt $R/; git status --short > $R/tree.txt
NCU=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu | sort -V -r | head -1)
for c in prefill-b4-s4096 prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-q prefill-b4-s4096-nvfp4 prefill-b4-s4096-fp8-token-head; do
  ROPEKIT_AUTOTUNE=0 timeout 70 "$NCU" --clock-control none --section SpeedOfLight --section SchedulerStats \
    --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,dram__bytes.sum.per_second,dram__bytes_read.sum,dram__bytes_write.sum \
    -k regex:fused_forward --launch-skip 1 --launch-count 1 python3 exp/ncu_fused.py $c > $R/ncu_$c.txt 2>&1
  echo "== $c rc $?"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|issue_active|No Eligible|inst_executed|Grid Size|dram__bytes|Stall Long|Warp Cycles Per Issued" $R/ncu_$c.txt | sed 's/  */ /g'
done
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
