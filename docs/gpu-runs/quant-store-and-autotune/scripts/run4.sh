#!/usr/bin/env bash
# device call: GPU tests of this session's changes; the small cases' A/B again (more rounds); the fused autotune's timing A/B
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
TEST_WORKERS=8 TEST_SECONDS=120 bash tools/gpu_run.sh test -rfE tests/test_fused_quant.py tests/test_bench_fused_tune.py \
  tests/test_engines.py tests/test_fused_page_table.py 2>&1 | tail -6
cp "$OUT/pytest.txt" "$OUT/exp/pytest.txt"
export PYTHONPATH=/tmp/site
timeout 120 python3 tools/ab_versions.py --cases small-prefill,decode --rounds 15 --time-budget 90 --out "$OUT/exp/ab" 2>&1 \
  | grep -E "Verdict|slower|graph_us" | grep -E "Verdict|slower|\| l2 \|" | head -20
cases="prefill-b4-s4096 prefill-b4-s4096-qknorm prefill-b4-s4096-fp8 prefill-b4-s4096-fp8-q prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head"
for v in tree flush off tree2 flush2; do
  timeout 70 python3 exp/tune_time.py $v ${v%2} $cases 2>&1 | grep -v "^\[" | tail -8 | tee -a "$OUT/exp/tune_time.txt"
done
