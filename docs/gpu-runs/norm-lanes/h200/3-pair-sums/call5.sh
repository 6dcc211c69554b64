#!/usr/bin/env bash
# device call 5 (session 60): the reductions' products rounded before their sums (fused_tiles.channel_dot): the new
# test on this tree and on 25419bc (mutation check); racecheck over the norm launches; the kernels' cross-lane fmas
# counted in the SASS; an A/B of the norm cases against 25419bc
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R/race $R/test
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem,power.limit --format=csv; cat exp/HEAD.txt; git status --short | grep -v "^??"; date -u; } 2>&1 | tee $R/gpu.txt
cp exp/call4.sh exp/race_norm.py exp/HEAD.txt $R/; cp exp/sass_count.py $R/ 2>/dev/null
# (1) the new test: this tree, then 25419bc (expected to fail)
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_qk_norm_rope.py -k one_factor > $R/test/head.txt 2>&1; echo "test head rc $?"; tail -3 $R/test/head.txt
(cd exp/mut && PYTHONPATH=../base_tree python3 -c "import ropekit; print(\"ropekit from\", ropekit.__file__)" > $R/test/base_from.txt; cat $R/test/base_from.txt; PYTHONPATH=../base_tree timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" test_fused_qk_norm_rope.py -k one_factor > $R/test/base.txt 2>&1; echo "test base rc $?"; grep -E "ropekit from|assert|passed|failed" $R/test/base.txt | head -8)
# (2) racecheck over the norm launches (this tree), the kernels compiled into a cache of their own
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
TC=$R/race/tcache; mkdir -p $TC
TRITON_CACHE_DIR=$TC PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$cs" --tool racecheck --racecheck-report all --print-limit 60 python3 exp/race_norm.py 6 > $R/race/racecheck_all.txt 2>&1
echo "racecheck rc $?"; grep -E "LAUNCHED|SUMMARY" $R/race/racecheck_all.txt | head -10
cuobj=$(command -v cuobjdump || ls -d /usr/local/cuda*/bin/cuobjdump | sort -V | tail -1)
for f in $(find $TC -name "*.cubin"); do h=$(basename $(dirname $f)); "$cuobj" -sass $f > $R/race/sass_$(basename $f .cubin)_$h.txt 2>&1; done
python3 exp/sass_count.py $R/race/sass_*.txt
rm -rf $TC
# (3) the A/B of the norm cases (and a control whose code did not change)
bash tools/gpu_run.sh ab-fused 25419bc --rounds 7 --cases decode-b64-qknorm prefill-b4-s4096-qknorm qknorm-backward-b4-s4096 decode-b64-olmo2 prefill-b4-s4096-olmo2 olmo2-backward-b4-s4096 decode-b64-int8-token-head prefill-b4-s4096 > $R/ab.txt 2>&1; echo "ab rc $?"; tail -25 $R/ab.txt
cp -r $OUT/ab-fused $R/ 2>/dev/null
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
