#!/usr/bin/env bash
# device call 1: (a) the fused tests on this GPU with the new NVFP4 store; (b) A/B of the NVFP4 store, old (HEAD) and
# new fused_tiles.py + fused.py alternating in processes, the same configurations, graph replay; (c) a prefill launch
# sweep of every format on the new tree; (d) the eager host costs (the training path's plan cache)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
cp exp/run1.sh $R/
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
export ROPEKIT_CACHE_DIR=$(mktemp -d)
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_quant.py > $R/pytest_quant.txt 2>&1; tail -3 $R/pytest_quant.txt
P="2,8,4,1,1;1,8,4,1,1;2,8,8,1,1;1,16,4,1,1;1,8,2,1,1;2,16,8,1,1;4,8,8,1,1"
D="1,4,4;1,8,4;1,8,8;1,2,2;1,16,4"
for v in new old new old; do
  cp exp/$v/fused_tiles.py exp/$v/fused.py ropekit/triton/
  timeout 60 python3 exp/sweep.py --cases prefill-b4-s4096-nvfp4 decode-b64-nvfp4 --prefill "$P" --decode "$D" \
    --out $R/nvfp4_$v.json > $R/nvfp4_$v.txt 2>&1
  echo "== $v"; grep -v "^best\|^\[" $R/nvfp4_$v.txt | tail -14
done 2>&1 | tee $R/nvfp4_ab.txt | grep -E "==|s=2   h=8  w=4|s=1   h=8  w=4 |s=1   h=4  w=4|ceiling"
cp exp/new/fused_tiles.py exp/new/fused.py ropekit/triton/
W="2,8,4,1,1;1,8,4,1,1;1,8,2,1,1;2,8,2,1,1;2,4,4,1,1;2,4,2,1,1;1,16,4,1,1;2,16,8,1,1;2,8,8,1,1;4,8,8,1,1;1,4,2,1,1;2,16,4,1,1"
timeout 230 python3 exp/sweep.py --cases prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-head \
  prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-q prefill-b4-s4096-page-table prefill-b4-s4096-e5m2 prefill-b4-s4096-fp8-token-head \
  --prefill "$W" --budget 200 --out $R/wide.json > $R/wide.txt 2>&1; grep "^best\|ceiling" $R/wide.txt
timeout 100 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager > $R/eager.txt 2>&1; grep -v "^\[" $R/eager.txt | tail -16
cd $OUT && tar czf r.tgz r && ls -la $OUT
