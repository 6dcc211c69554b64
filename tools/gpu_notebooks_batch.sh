#!/usr/bin/env bash
# Execute notebooks on the GPU one at a time (each with its own time limit) and keep every finished one:
#   bash tools/gpu_notebooks_batch.sh SECONDS_PER_NOTEBOOK notebooks/02_*.ipynb ...   (carry .whl and .shared)
# Results: $OUT/notebooks.tgz (the executed notebooks so far) and $OUT/<name>.log.
set -u
limit=$1; shift
mkdir -p /tmp/executed
for nb in "$@"; do
  timeout "$limit" bash .shared/gpu-notebooks.sh "$nb" > "$OUT/$(basename "$nb" .ipynb).log" 2>&1
  echo "$nb: exit $? $(grep -E 'executed|FAILED|passed|failed' "$OUT/$(basename "$nb" .ipynb).log" | tr '\n' ' ')"
  tar -xzf "$OUT/executed-notebooks.tgz" -C /tmp/executed 2>/dev/null && rm -f "$OUT/executed-notebooks.tgz"
  tar -czf "$OUT/notebooks.tgz" -C /tmp/executed notebooks 2>/dev/null
done
