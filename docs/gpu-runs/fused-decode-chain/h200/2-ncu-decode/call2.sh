#!/usr/bin/env bash
# session 50 call 2: ncu over the fused decode against the launch-chain floor (durations, stalls, SASS)
OUT=${OUT:-/tmp/out}
export PYTHONPATH=$PWD ROPEKIT_CACHE_DIR=/tmp/rkcache TRITON_CACHE_DIR=$OUT/tcache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout 60 python3 exp/ncu_decode.py decode-b64,chain 2>&1 | tail -4
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis"
for what in decode-b64:fused_forward chain:launch_chain ; do
  name=${what%%:*}; kern=${what#*:}
  timeout 90 ncu --kernel-name "regex:$kern" --launch-skip 2 --launch-count 1 --warp-sampling-interval 0 $S \
    -o "$OUT/$name" python3 exp/ncu_decode.py $name > "$OUT/ncu_$name.log" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --print-details all > "$OUT/ncu_$name.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv > "$OUT/sass_$name.csv" 2>&1
  grep -E "Duration|Registers Per|Elapsed Cycles|Warp Cycles Per Issued|Executed Ipc|Grid Size|Block Size" "$OUT/ncu_$name.txt" | head -12
done
ls -la "$OUT" | head -30
for f in $(find "$OUT/tcache" -name "*.cubin"); do cuobjdump -sass "$f" > "$OUT/$(basename $(dirname $f)).sass.txt" 2>&1; done
cd "$OUT" && tar czf ncu_all.tgz *.txt *.csv *.log && rm -rf tcache *.ncu-rep sass_*.csv ncu_*.txt ncu_*.log *.sass.txt
