#!/usr/bin/env bash
# the fuzzer on the GPU, shortened to fit the session's last device minutes: the triton run, then memcheck
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; git log --oneline -1 | cut -c1-60; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
timeout 140 python3 -m ropekit.reliability.fuzz --device cuda --cases 3000 --seed 0 --workers 12 --family-size 4 \
  --time-budget 115 --out $R/fuzz.json > $R/fuzz.txt 2>&1; echo "triton rc $?"; tail -4 $R/fuzz.txt
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V -r | head -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 140 "$cs" --tool memcheck --target-processes all --report-api-errors no \
  --print-limit 100 --log-file "$R/memcheck.%p.log" python3 -m ropekit.reliability.fuzz --device cuda --cases 240 \
  --seed 0 --workers 12 --family-size 4 --time-budget 90 --out $R/fuzz-memcheck.json > $R/fuzz-memcheck.txt 2>&1
echo "memcheck rc $?"; tail -4 $R/fuzz-memcheck.txt
cat $R/memcheck.*.log 2>/dev/null | grep -oE "ERROR SUMMARY: [0-9]+" | sort | uniq -c
