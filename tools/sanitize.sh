#!/usr/bin/env bash
# compute-sanitizer over every ropekit kernel — Triton v1..v4 and the CUDA backend (rotation and table kernels) —
# on shapes that exercise masks and tails (`python -m ropekit stress --sanitize-driver` runs each once).
#
#   bash tools/sanitize.sh [OUT_DIR] [TOOL ...]        default OUT_DIR: $OUT or /tmp/sanitize; TOOLs: memcheck racecheck
#
# Prints one summary line per tool, e.g. "memcheck: ========= ERROR SUMMARY: 0 errors", and writes into OUT_DIR:
# driver.txt (the plain run), <tool>.log (the sanitizer's report), <tool>.driver.txt (the driver's own output under
# the tool) and sanitize.json (what `python -m ropekit stress --render ... --sanitizer` puts into the docs).
# Exit status 0 when the driver passed and every tool reported 0 errors.
#
# Why these settings:
#   PYTORCH_NO_CUDA_MEMORY_CACHING=1  every tensor is its own cudaMalloc, so a read one element past a tensor is
#                                     outside an allocation (with the caching allocator it would land in a neighbour);
#   --report-api-errors no            count kernel memory/hazard errors, not return codes of CUDA API calls made by
#                                     torch/triton internals (a failing launch of ours raises in the driver instead);
#   a plain run first                 it checks the results and fills Triton's and torch's on-disk compile caches, so
#                                     the (10-100x slower) sanitized runs only load kernels.
set -u
out=${1:-${OUT:-/tmp/sanitize}}
[ $# -gt 0 ] && shift
tools=${*:-memcheck racecheck}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1

sanitizer=${COMPUTE_SANITIZER:-}
if [ -z "$sanitizer" ]; then
  newest=$(ls -d /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | sort -V -r | head -1)
  for candidate in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
                   /usr/local/cuda/bin/compute-sanitizer "$newest"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then sanitizer=$candidate; break; fi
  done
fi
if [ -z "$sanitizer" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER or CUDA_HOME, or put it on PATH)" >&2
  exit 2
fi
echo "sanitizer: $sanitizer ($("$sanitizer" --version 2>/dev/null | grep -i version | head -1))"

start=$(date +%s)
"$python" -m ropekit stress --sanitize-driver > "$out/driver.txt" 2>&1
driver_status=$?
tail -1 "$out/driver.txt"
echo "plain driver run: exit $driver_status ($(( $(date +%s) - start )) s)"

status=$driver_status
for tool in $tools; do
  t0=$(date +%s)
  "$sanitizer" --tool "$tool" --target-processes all --report-api-errors no --print-limit 100 \
      --log-file "$out/$tool.log" "$python" -m ropekit stress --sanitize-driver > "$out/$tool.driver.txt" 2>&1
  rc=$?
  line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log" | tail -1)
  echo "$tool: ${line:-no summary line (see $out/$tool.log)} (exit $rc, $(( $(date +%s) - t0 )) s)"
  errors=$(echo "$line" | grep -oE "[0-9]+ error" | head -1 | grep -oE "[0-9]+")
  if [ "$rc" != 0 ] || [ -z "$errors" ] || [ "$errors" != 0 ]; then status=1; fi
  printf '%s\t%s\t%s\t%s\n' "$tool" "$rc" "${errors:-}" "$line" >> "$out/summary.tsv.tmp"
done

"$python" - "$out" <<'EOF'
import json, os, subprocess, sys
out = sys.argv[1]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[0]
except Exception:  # noqa: BLE001
    gpu = None
tools = {}
path = os.path.join(out, "summary.tsv.tmp")
if os.path.exists(path):
    for row in open(path):
        tool, rc, errors, line = row.rstrip("\n").split("\t", 3)
        tools[tool] = {"exit": int(rc), "errors": int(errors) if errors else None, "summary": line.strip()}
    os.remove(path)
driver = [l.rstrip() for l in open(os.path.join(out, "driver.txt")) if l[:6] in ("ok    ", "skip  ", "FAIL  ")]
json.dump({"gpu": gpu, "command": "bash tools/sanitize.sh", "tools": tools, "driver": driver},
          open(os.path.join(out, "sanitize.json"), "w"), indent=1)
print(f"wrote {os.path.join(out, 'sanitize.json')}")
EOF
echo "sanitize: $([ $status = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - start )) s"
exit $status
