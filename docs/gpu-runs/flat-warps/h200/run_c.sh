#!/usr/bin/env bash
# device call B: (H200 only) the flat kernel's warps and ncu; the model-only A/B of this tree against ecd72f6 (every
# published case, autotune off, fresh cache); the main benchmark with peers, autotune on, fresh cache
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200"; exit 0; }
if true; then
  BF="flat:block=2048,num_warps=8; flat:block=1024,num_warps=4; flat:block=512,num_warps=2; flat:block=4096,num_warps=16; flat:block=2048,num_warps=4"
  F32="flat:block=1024,num_warps=8; flat:block=512,num_warps=4; flat:block=256,num_warps=2; flat:block=2048,num_warps=16"
  for i in 1 2; do
    timeout 100 python3 tools/tune_v4.py --cases llama3-8b-prefill,mha-fp16 --configs "$BF" --out $R/tune_bf16_$i.json > $R/tune_bf16_$i.txt 2>&1; tail -13 $R/tune_bf16_$i.txt
  done
  timeout 60 python3 tools/tune_v4.py --cases fp32 --configs "$F32" --out $R/tune_fp32_1.json > $R/tune_fp32_1.txt 2>&1; tail -6 $R/tune_fp32_1.txt
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__waves_per_multiprocessor,l1tex__t_sector_hit_rate.pct,lts__t_sector_hit_rate.pct,sm__cycles_active.avg,sm__cycles_elapsed.avg,smsp__inst_executed.sum,sm__ctas_launched.sum
  timeout 100 ncu --kernel-name regex:rope_flat --metrics $M --csv python3 exp/ncu_flat.py 2048x8,1024x4,512x2 > $R/ncu_flat.csv 2> $R/ncu_flat.err; tail -2 $R/ncu_flat.err
fi
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 250 python3 tools/ab_versions.py --rounds 5 --time-budget 150 --out $R/ab > $R/ab.txt 2>&1; grep -v "^\[" $R/ab.txt | tail -45
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 230 python3 -m ropekit bench --peers .peers --time-budget 150 --out $R/main > $R/main.txt 2>&1; grep -v "^\[" $R/main.txt | tail -34
cd $OUT && tar czf r.tgz r && ls -la $OUT
