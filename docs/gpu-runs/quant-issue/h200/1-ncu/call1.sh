#!/usr/bin/env bash
# session 54, call 1: the quotient fix on the GPU (fused quant tests); ncu over the fused prefills per format at the
# GPU's own clocks (is the H200's gap on the heavy stores issue-bound?)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
for folder in .whl .peers; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff 87aa0c3 -- ropekit > $R/change.patch
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_fused_quant.py \
  tests/test_fused_mla.py tests/test_fused_page_table.py > $R/pytest.txt 2>&1; echo "pytest rc $?"; tail -3 $R/pytest.txt
NCU=$(command -v ncu || ls -d /usr/local/cuda*/bin/ncu | sort -V -r | head -1)
for c in prefill-b4-s4096 prefill-b4-s4096-fp8 prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-q prefill-b4-s4096-nvfp4 \
         prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head; do
  ROPEKIT_AUTOTUNE=0 timeout 60 "$NCU" --clock-control none --section SpeedOfLight --section SchedulerStats \
    --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
    --metrics smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,dram__bytes.sum.per_second \
    -k regex:fused_forward --launch-skip 1 --launch-count 1 python3 exp/ncu_fused.py $c > $R/ncu_$c.txt 2>&1
  echo "== $c rc $?"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|issue_active|Issued Warp|No Eligible|Executed Ipc A|inst_executed|Block Limit Reg|Grid Size|Threads|cycles_elapsed.avg.per|dram__bytes" $R/ncu_$c.txt | sed 's/  */ /g'
done
