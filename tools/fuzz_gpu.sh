#!/usr/bin/env bash
# The hostile-input fuzzer on a GPU (docs/fuzzing.md): a large seeded run, the CUDA backend's run, and a smaller run
# under compute-sanitizer's memcheck with the caching allocator off (every tensor its own cudaMalloc, so a write one
# element past a tensor is outside an allocation).
#
#   bash tools/fuzz_gpu.sh [OUT_DIR]        default OUT_DIR: $OUT or /tmp/fuzz; CASES, SEED, WORKERS, FAMILY override
#
# About 9 minutes: each run stops starting cases at its time budget (300 s, 90 s, 120 s), within one device call.
#
# Writes fuzz.json, fuzz-cuda.json, fuzz-memcheck.json and memcheck.<pid>.log into OUT_DIR and prints one line per
# run. Exit status 0 when no run found a violation and memcheck reported no error.
set -u
out=${1:-${OUT:-/tmp/fuzz}}
python=${PYTHON:-python3}
cases=${CASES:-3000}
seed=${SEED:-0}
workers=${WORKERS:-12}
family=${FAMILY:-4}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

summary() {  # counts of one run, on one line
  "$python" -c "import json,sys; c=json.load(open(sys.argv[1])); print(sys.argv[2], {k: c[k] for k in
    ('cases', 'matched', 'documented_errors', 'violations', 'seconds')})" "$1" "$2" 2>/dev/null || echo "$2: no result"
}

start=$(date +%s)
"$python" -m ropekit.reliability.fuzz --device cuda --cases "$cases" --seed "$seed" --workers "$workers" \
  --family-size "$family" --time-budget 300 --out "$out/fuzz.json" > "$out/fuzz.txt" 2>&1 || status=1
summary "$out/fuzz.json" "triton ($(( $(date +%s) - start )) s):"

start=$(date +%s)
"$python" -m ropekit.reliability.fuzz --device cuda --target apply_rope_cuda --cases 400 --seed "$seed" \
  --workers "$workers" --family-size "$family" --time-budget 90 --out "$out/fuzz-cuda.json" \
  > "$out/fuzz-cuda.txt" 2>&1 || status=1
summary "$out/fuzz-cuda.json" "cuda backend ($(( $(date +%s) - start )) s):"

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null \
  | sort -V -r | head -1)}
if [ -n "$sanitizer" ] && [ -x "$sanitizer" ]; then
  start=$(date +%s)
  # the first cases of the large run: their kernels are already in Triton's on-disk cache
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$sanitizer" --tool memcheck --target-processes all --report-api-errors no \
    --print-limit 100 --log-file "$out/memcheck.%p.log" \
    "$python" -m ropekit.reliability.fuzz --device cuda --cases 240 --seed "$seed" --workers "$workers" \
    --family-size "$family" --time-budget 120 --out "$out/fuzz-memcheck.json" > "$out/fuzz-memcheck.txt" 2>&1 \
    || status=1
  errors=$(cat "$out"/memcheck.*.log 2>/dev/null | grep -oE "ERROR SUMMARY: [0-9]+" | grep -oE "[0-9]+" \
    | awk '{s += $1} END {print s + 0}')
  summary "$out/fuzz-memcheck.json" "memcheck ($(( $(date +%s) - start )) s, $errors errors):"
  [ "$errors" = 0 ] || status=1
else
  echo "memcheck: compute-sanitizer not found (set COMPUTE_SANITIZER)"
  status=1
fi
echo "fuzz: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
