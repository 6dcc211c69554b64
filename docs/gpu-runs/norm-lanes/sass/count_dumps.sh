#!/usr/bin/env bash
# The cross-lane fmas (sass_count.py) and instructions of the 21 launches tools/ptx_diff.py compiles for sm_90, in
# two trees, on a machine without a GPU: bash count_dumps.sh BASE_REF [TRITON_SITE]  (run from the repository root)
set -eu
base=$1; site=${2:-}
bin=$(PYTHONPATH=$site python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
work=$(mktemp -d); git worktree add --detach --quiet $work/tree $base
for t in base head; do
  where=$PWD; [ $t = base ] && where=$work/tree
  (cd $where && env -u TRITON_INTERPRET PYTHONPATH=$where${site:+:$site} python $OLDPWD/tools/ptx_diff.py --dump $work/$t 2>/dev/null)
  for f in $work/$t/*.cubin; do $bin/cuobjdump -sass $f > ${f%.cubin}.sass; done
done
python - $work <<'PY'
import json, sys
work = sys.argv[1]
exec(open("docs/gpu-runs/norm-lanes/h200/sass_count.py").read().split("for path in")[0])
for e in json.load(open(f"{work}/base/index.json")):
    b, h = (asymmetric(open(f"{work}/{t}/{e['stem']}.sass").read()) for t in ("base", "head"))
    print(f"{e['stem']} {e['case'][:72]:72s} cross-lane fmas {b[0]} -> {h[0]}, instructions {b[1]} -> {h[1]}")
PY
git worktree remove --force $work/tree; rm -rf $work
