#!/usr/bin/env bash
# device call 1 (session 60): (a) racecheck's hazard in the norm over all heads after the rotation, per hazard, with
# the kernel's SASS; (b) the fused bf16 prefill beside copy kernels of its exact bytes and addresses
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/race $R/probe
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; date -u; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } 2>&1 | tee $R/gpu.txt
cp exp/call1.sh exp/race_norm.py exp/addr_probe.py exp/HEAD.txt $R/
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
# (a) the kernels compiled into a cache of their own, then racecheck with every hazard's detail
TC=$R/race/tcache; mkdir -p $TC
TRITON_CACHE_DIR=$TC timeout 60 python3 exp/race_norm.py 1 > $R/race/plain.txt 2>&1; echo "plain rc $?"
TRITON_CACHE_DIR=$TC PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$cs" --tool racecheck --racecheck-report all --print-limit 60 python3 exp/race_norm.py 6 > $R/race/racecheck_all.txt 2>&1
echo "racecheck rc $?"; grep -cE "Potential WAW|Error: Race" $R/race/racecheck_all.txt; grep -E "LAUNCHED|SUMMARY|Current Value" $R/race/racecheck_all.txt | head -30
cuobj=$(command -v cuobjdump || ls -d /usr/local/cuda*/bin/cuobjdump | sort -V | tail -1)
for f in $(find $TC -name "fused_forward_kernel*.cubin"); do
  h=$(basename $(dirname $f)); "$cuobj" -sass $f > $R/race/sass_$h.txt 2>&1
  cp $(dirname $f)/fused_forward_kernel.json $R/race/meta_$h.json 2>/dev/null; cp $(dirname $f)/fused_forward_kernel.ttgir $R/race/ttgir_$h.ttgir 2>/dev/null
  echo "$h $(grep -c '/\*[0-9a-f]*\*/' $R/race/sass_$h.txt) lines; $(grep -E '/\*19[b-f]0\*/|/\*1a[0-9a-f]0\*/|/\*1b[01]0\*/' $R/race/sass_$h.txt | head -24 | tr -s ' ' | cut -c1-80 | tr '\n' '|')"
done
rm -rf $TC
# (b) the fused prefill beside copy kernels of its bytes and addresses
OUT=$R/probe ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 300 python3 exp/addr_probe.py prefill-b4-s4096 > $R/probe/addr_probe.txt 2>&1; echo "probe rc $?"; tail -30 $R/probe/addr_probe.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
