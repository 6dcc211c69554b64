#!/usr/bin/env bash
# call 5: why the fixed e5m2 store is 5 % slower at decode: each version's chosen tile and registers, every version
# under each tile; then the graph-clock A/B with two other fixes (--also p1: one value an assembly block; sel:
# Triton's conversion, the NaN's sign by a select)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call5.sh exp/diag_tiles.py exp/HEAD.txt exp/change.patch $R/
timeout 200 python3 exp/diag_tiles.py decode-b64-e5m2 prefill-b4-s4096-e5m2 > $R/tiles.txt 2>&1
echo "tiles rc $?"; cat $R/tiles.txt | tail -40
timeout 200 python3 tools/ab_fused.py --rounds 11 --peers .peers --also ropekit_p1,ropekit_sel --out $R/ab-fused --cases decode-b64-e5m2 prefill-b4-s4096-e5m2 decode-b64-fp8-token-head 2>&1 | grep -v "^\[" > $R/ab-fused.txt
echo "ab rc $?"; tail -12 $R/ab-fused.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
