#!/usr/bin/env bash
# device call 2 (session 55): the notebook-05 waterfall, the H200's main page, memcheck over the flat candidates
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
ls .peers/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .peers/*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; git rev-parse HEAD; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
git status --short > $R/tree.txt; cp exp/call2.sh exp/sanitize_flat.py $R/
timeout 100 python3 -m ropekit.course.ladder.measure --out $R/ladder_waterfall_h200.json 2>&1 | tee $R/ladder.txt | tail -14
mkdir -p $R/publish
ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 240 python3 -m ropekit bench --peers .peers --time-budget 160 \
  --out $R/publish/main > $R/publish/main.txt 2>&1
grep -v "^\[" $R/publish/main.txt | tail -14
timeout 60 python3 exp/sanitize_flat.py > $R/sanitize_plain.txt 2>&1; tail -2 $R/sanitize_plain.txt
cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 "$cs" --tool memcheck --report-api-errors no --print-limit 20 \
  python3 exp/sanitize_flat.py > $R/memcheck.txt 2>&1; echo "memcheck rc $?"
grep -E "ERROR SUMMARY|Invalid|flat candidates|FAIL" $R/memcheck.txt | head -20
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
