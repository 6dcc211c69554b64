#!/usr/bin/env bash
# compute-sanitizer memcheck over the CUDA backend's representative subset: the `sanitizer_subset` tests of
# tests/test_cuda.py (16-byte and element-wise paths, NeoX and GPT-J, GQA, partial rotary, every position mode,
# positions past both ends of the table, per-token cos/sin, in place, fp16/bf16/fp32/fp64, both table kernels).
#
#   bash tools/sanitize_cuda.sh            # on a GPU machine, from the repository root
#
# PyTorch's caching allocator serves tensors from larger pooled blocks, where an out-of-bounds access still lands in
# memory memcheck believes valid; PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own allocation, so memcheck
# sees each tensor's exact bounds. The log goes to $OUT/sanitize_cuda.txt; the exit status is non-zero on any error.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SANITIZER=$(command -v compute-sanitizer || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$candidate" ] && SANITIZER=$candidate
done
if [ -z "$SANITIZER" ]; then echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 2; fi

# Build (or load the cached build of) the extension outside the sanitizer: compiling under it only costs time.
python3 -c "import logging, ropekit.cuda as c; logging.basicConfig(level=logging.INFO); c.load()" || exit 1

export PYTORCH_NO_CUDA_MEMORY_CACHING=1
"$SANITIZER" --tool memcheck --error-exitcode 1 --leak-check no --print-limit 50 \
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_cuda.py -k sanitizer_subset "$@" \
  2>&1 | tee "$OUT/sanitize_cuda.txt"
status=${PIPESTATUS[0]}
grep "ERROR SUMMARY" "$OUT/sanitize_cuda.txt" | tail -1
echo "sanitize_cuda: exit $status"
exit "$status"
