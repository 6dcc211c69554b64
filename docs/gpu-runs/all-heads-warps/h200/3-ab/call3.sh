#!/usr/bin/env bash
# session 53, call 3: A/B of the all-heads rule (32 values a thread) against 883f235 on the fused cases; GPU tests;
# the backward's walks and the all-heads tiles plain and under memcheck
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
for folder in .whl .peers; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt
ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 230 python3 exp/fused_ab.py --out $R/ab.json --rounds 7 \
  --budget 170 --cases olmo2-backward-b4-s4096 decode-b64-olmo2 prefill-b4-s4096-olmo2 qknorm-backward-b4-s4096 \
  decode-b64-qknorm prefill-b4-s4096-qknorm decode-b64 > $R/ab.txt 2>&1; echo "ab rc $?"; grep -v "^\[" $R/ab.txt | tail -12
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_choice.py \
  tests/test_norm_all_heads.py tests/test_fused_qk_norm_rope.py tests/test_triton_fused.py > $R/pytest.txt 2>&1
echo "pytest rc $?"; tail -3 $R/pytest.txt
timeout 40 python3 exp/sanitize_bwd.py > $R/sanitize_plain.txt 2>&1; echo "plain rc $?"; tail -2 $R/sanitize_plain.txt
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V -r | head -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$cs" --tool memcheck --report-api-errors no --print-limit 50 \
  python3 exp/sanitize_bwd.py > $R/sanitize_memcheck.txt 2>&1; echo "memcheck rc $?"; tail -3 $R/sanitize_memcheck.txt
