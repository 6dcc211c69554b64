#!/usr/bin/env bash
# device call E: the fused q+k tile (in place and every non-flat DRAM call) at smaller programs, graph replay
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
T="tile:block_s=2,block_h=32,num_warps=16,fused_qk=1,evict_first=1; tile:block_s=1,block_h=32,num_warps=8,fused_qk=1,evict_first=1; tile:block_s=1,block_h=32,num_warps=16,fused_qk=1,evict_first=1; tile:block_s=2,block_h=32,num_warps=32,fused_qk=1,evict_first=1"
M="tile:block_s=2,block_h=64,num_warps=32,fused_qk=1,evict_first=1; tile:block_s=1,block_h=64,num_warps=16,fused_qk=1,evict_first=1; tile:block_s=1,block_h=64,num_warps=32,fused_qk=1,evict_first=1"
for i in 1 2; do
  timeout 70 python3 tools/tune_v4.py --cases llama3-8b-prefill --rounds 5 --configs "$T" --out $R/tile_llama_$i.json > $R/tile_llama_$i.txt 2>&1; grep -E "tile:|moved" $R/tile_llama_$i.txt
  timeout 60 python3 tools/tune_v4.py --cases mha-fp16 --rounds 5 --configs "$M" --out $R/tile_mha_$i.json > $R/tile_mha_$i.txt 2>&1; grep -E "tile:|moved" $R/tile_mha_$i.txt
done
