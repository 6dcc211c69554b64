#!/usr/bin/env bash
# call 1: the backward writing its weight gradients from its last program (no cast kernels after it): an A/B against
# main in one process (graph replay, interleaved rounds), then the GPU tests of the fused ops and the backward
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; } 2>&1 | tee $R/gpu.txt
git diff > $R/change.patch; cp exp/call1.sh exp/HEAD.txt $R/
timeout 230 python3 tools/ab_fused.py --rounds 11 --time-budget 200 --cases qknorm-backward-b4-s4096 olmo2-backward-b4-s4096 prefill-b4-s4096-qknorm decode-b64-qknorm --out $R/ab > $R/ab.txt 2>&1
echo "ab rc $?"; tail -12 $R/ab/ab.md
date -u | tee -a $R/gpu.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfE tests/test_triton_fused.py tests/test_fused_qk_norm_rope.py tests/test_norm_all_heads.py tests/test_norm_placement.py tests/test_fused_autotune.py > $R/pytest.txt 2>&1
echo "tests rc $?"; tail -3 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
