#!/usr/bin/env bash
# memcheck over the candidates a call past the L2 reaches, forced onto the sanitizer's mask-and-tail calls
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
timeout 170 python3 exp/sanitize_streaming.py > $R/plain.txt 2>&1; tail -3 $R/plain.txt
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$cs" --tool memcheck --report-api-errors no --print-limit 20 \
  python3 exp/sanitize_streaming.py > $R/memcheck.txt 2>&1; echo "rc $?"
grep -E "ERROR SUMMARY|Invalid|streaming candidates|FAIL" $R/memcheck.txt | head -20
