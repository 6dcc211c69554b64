#!/usr/bin/env bash
# device call 2: (a) A/B of the NVFP4 store (HEAD against the new fused_tiles.py + fused.py), alternating processes;
# (b) per prefill case the fused autotune's pick and the model's choice against a sweep, one process a case group
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/run2.sh $R/
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
P="2,8,4,1,1;1,8,4,1,1;2,8,8,1,1;1,16,4,1,1;1,8,2,1,1;2,16,8,1,1;4,8,8,1,1"
D="1,4,4;1,8,4;1,8,8;1,2,2;1,16,4"
for v in new old new old; do
  cp exp/$v/fused_tiles.py exp/$v/fused.py ropekit/triton/
  ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 60 python3 exp/sweep.py --cases prefill-b4-s4096-nvfp4 decode-b64-nvfp4 --prefill "$P" --decode "$D" \
    --out $R/nvfp4_$v.json > $R/nvfp4_$v.txt 2>&1
  echo "== $v"; grep -v "^best\|^\[" $R/nvfp4_$v.txt | tail -14
done 2>&1 | tee $R/nvfp4_ab.txt | grep -E "==|s=2   h=8  w=4|s=1   h=4  w=4|ceiling"
cp exp/new/fused_tiles.py exp/new/fused.py ropekit/triton/
W="2,8,4,1,1;1,8,4,1,1;1,8,2,1,1;2,8,2,1,1;2,4,2,1,1;1,16,4,1,1;2,16,8,1,1;2,16,4,1,1;1,16,8,1,1;1,32,8,1,1"
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 200 python3 exp/sweep2.py --cases prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-page-table prefill-b4-s4096-fp8-head \
  --prefill "$W" --out $R/wide1.json > $R/wide1.txt 2>&1; grep -E "autotune|ceiling" $R/wide1.txt
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 200 python3 exp/sweep2.py --cases prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-q prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-token-head prefill-b4-s4096-nvfp4 \
  --prefill "$W" --out $R/wide2.json > $R/wide2.txt 2>&1; grep -E "autotune|ceiling" $R/wide2.txt
cd $OUT && tar czf r.tgz r && ls -la $OUT
