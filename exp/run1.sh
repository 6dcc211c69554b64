#!/usr/bin/env bash
# device call 1: the GPU tests over stop 42's files, the quantising-store arithmetic A/B, the param-bytes slope
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/exp"
TEST_WORKERS=8 TEST_SECONDS=200 bash tools/gpu_run.sh test tests/test_choice.py tests/test_fused_autotune.py \
  tests/test_launch.py tests/test_triton_fused.py tests/test_fused_quant.py tests/test_api.py tests/test_fused_kv_cache.py \
  tests/test_nope.py tests/test_mrope.py tests/test_angles.py tests/test_bench_fused_tune.py 2>&1 | tail -30
export PYTHONPATH=/tmp/site
cases="prefill-b4-s4096 prefill-b4-s4096-fp8 prefill-b4-s4096-int8-token-head prefill-b4-s4096-fp8-token-head prefill-b4-s4096-fp8-q decode-b64-int8-token-head"
cp ropekit/triton/fused_tiles.py /tmp/fused_tiles_tree.py
for v in v0 v1 v3 v0b v1b; do
  cp exp/variants/${v%b}.py ropekit/triton/fused_tiles.py
  ROPEKIT_AUTOTUNE=0 timeout 60 python3 exp/quant_time.py $v $cases 2>&1 | tee "$OUT/exp/$v.txt" | grep -v '^{' | tail -8
done
cp /tmp/fused_tiles_tree.py ropekit/triton/fused_tiles.py
timeout 45 python3 exp/param_bytes.py 2>&1 | tee "$OUT/exp/param_bytes.txt" | tail -10
cp "$OUT/pytest.txt" "$OUT/exp/" 2>/dev/null; cat "$OUT/gpu.txt" | head -3
