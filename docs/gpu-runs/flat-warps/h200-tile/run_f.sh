#!/usr/bin/env bash
# device call F: the fused q+k tile at 1 token a program against the model's 2, graph replay, every non-flat DRAM shape
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
T="tile:block_s=2,block_h=32,num_warps=16,fused_qk=1,evict_first=1; tile:block_s=1,block_h=32,num_warps=8,fused_qk=1,evict_first=1"
M="tile:block_s=2,block_h=64,num_warps=32,fused_qk=1,evict_first=1; tile:block_s=1,block_h=64,num_warps=32,fused_qk=1,evict_first=1"
F="tile:block_s=2,block_h=32,num_warps=32,fused_qk=1,evict_first=1; tile:block_s=1,block_h=32,num_warps=16,fused_qk=1,evict_first=1"
run() { timeout 45 python3 tools/tune_v4.py --cases $1 --rounds 5 --graph-ms 30 --configs "$2" --out $R/tile_$1.json > $R/tile_$1.txt 2>&1; grep -E "tile:|moved" $R/tile_$1.txt; }
run llama3-8b-prefill "$T"; run mha-fp16 "$M"; run fp32 "$F"; run gptj-interleaved "$T"; run varlen "$T"; run partial-rotary "$T"
