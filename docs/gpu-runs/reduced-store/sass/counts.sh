#!/usr/bin/env bash
# SASS of the fused kernel's launches, compiled for sm_90 on a CPU by Triton 3.6 (the GPU machine's; PYTHONPATH to
# it), for the trees named: instructions and registers a thread, and the shared-memory operations and barriers.
#   bash counts.sh TRITON36_SITE TREE [--cfg=s,h,w] [--apart] VARIANT...   (TREE: a checkout's ropekit/ and tools/)
set -u
site=$1; tree=$2; shift 2
out=$(mktemp -d)
here=$(cd "$(dirname "$0")" && pwd)
OUTDIR=$out PYTHONPATH=$site python "$here/sass_decode.py" "$tree" "$@" 2>&1 | grep " launch "
for f in "$out"/*.sass; do
  echo "$(basename "$f" .0.sass): $(grep -oE '(BAR\.SYNC|STS|LDS|STSM)[A-Z0-9_.]*' "$f" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
done
rm -rf "$out"
