#!/usr/bin/env bash
# device call A: the flat kernel's warps on this GPU (graph replay, two processes), ncu of 2048x8 against 1024x4, the
# fused prefill sweep
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
BF="flat:block=2048,num_warps=8; flat:block=1024,num_warps=4; flat:block=512,num_warps=2; flat:block=4096,num_warps=16; flat:block=2048,num_warps=4"
F32="flat:block=1024,num_warps=8; flat:block=512,num_warps=4; flat:block=256,num_warps=2; flat:block=2048,num_warps=16"
for i in 1 2; do
  timeout 100 python3 tools/tune_v4.py --cases llama3-8b-prefill,mha-fp16 --configs "$BF" --out $R/tune_bf16_$i.json > $R/tune_bf16_$i.txt 2>&1; tail -14 $R/tune_bf16_$i.txt
  timeout 60 python3 tools/tune_v4.py --cases fp32 --configs "$F32" --out $R/tune_fp32_$i.json > $R/tune_fp32_$i.txt 2>&1; tail -7 $R/tune_fp32_$i.txt
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__maximum_warps_per_active_cycle_pct,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_warps,launch__waves_per_multiprocessor,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,sm__cycles_elapsed.avg,smsp__inst_executed.sum,sm__ctas_launched.sum,smsp__warps_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warps_issue_stalled_lg_throttle_per_warp_active.pct,smsp__warps_issue_stalled_drain_per_warp_active.pct,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum
timeout 120 ncu --kernel-name regex:rope_flat --metrics $M --csv python3 exp/ncu_flat.py 2048x8,1024x4,512x2 > $R/ncu_flat.csv 2> $R/ncu_flat.err; tail -3 $R/ncu_flat.err; wc -l $R/ncu_flat.csv
timeout 150 python3 -m ropekit.bench.fused_tune --cases prefill-b4-s4096 prefill-b4-s4096-qknorm --time-budget 120 --out $R/ftune > $R/ftune.txt 2>&1; tail -40 $R/ftune.txt
cd $OUT && tar czf r.tgz r && ls -la $OUT
