#!/usr/bin/env bash
# device call C: the GPU tests of the launch, the ops and the benches with programmatic launches; memcheck over the
# stress driver (every kernel, its small grids released, its large ones waiting)
set -u
OUT=${OUT:-/tmp/out}
git diff -- ropekit > $OUT/change.patch
TEST_WORKERS=8 TEST_SECONDS=300 bash tools/gpu_run.sh test tests/test_grid_dependency.py tests/test_launch.py \
  tests/test_api.py tests/test_fused_kv_cache.py tests/test_fused_page_table.py tests/test_fused_mla.py \
  tests/test_fused_qk_norm_rope.py tests/test_fused_quant.py tests/test_engines.py tests/test_bench.py \
  tests/test_bench_fused.py tests/test_choice.py tests/test_hf.py tests/test_te.py 2>&1 | tail -8
timeout 230 bash tools/sanitize.sh $OUT/sanitize memcheck 2>&1 | tail -4
