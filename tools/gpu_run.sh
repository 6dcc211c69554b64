#!/usr/bin/env bash
# One device call = one stage of this script, so GPU work is batched (device time is scarce).
#   bash tools/gpu_run.sh smoke|tune|cuda|bench|stress|probe|gputests|paired|publish|final|small|release|ab|verify|sweep   (each stage below; docs/gpu.md has the table)
# Everything it produces goes under $OUT (logs, JSON, PNG).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage=${1:-smoke}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
if [ -d .peers ]; then
  for w in .peers/*.whl; do [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$w"; done
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m ropekit info 2>&1 | tee -a "$OUT/gpu.txt"

# merge_docs RUN_JSON DIR: merge a bench run into docs/ (JSON, markdown, plots) and archive them as DIR/docs.tgz,
# the published files a stage brings back
merge_docs() {
  python3 -m ropekit bench --merge docs/benchmarks.json "$1" --out docs 2>&1 | tee "$2/merge.txt" | tail -3
  tar -czf "$2/docs.tgz" docs/benchmarks.json docs/benchmarks.md docs/*.png
}
echo "[gpu_run] stage $stage: started $(date -u +%H:%M:%S)"
case "$stage" in
  smoke)
    python3 -m ropekit check 2>&1 | tee "$OUT/check.txt"
    timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/ -o addopts="" 2>&1 | tee "$OUT/pytest.txt" | tail -25
    timeout 400 python3 tools/tune_v4.py --out "$OUT/tune_v4.json" 2>&1 | tee "$OUT/tune.txt"
    ;;
  tune)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ -o addopts="" 2>&1 | tee "$OUT/pytest.txt" | tail -15
    timeout 330 python3 tools/tune_v4.py --out "$OUT/tune_v4.json" 2>&1 | tee "$OUT/tune.txt"
    [ -f tools/time_ladder.py ] && timeout 120 python3 tools/time_ladder.py 2>&1 | tee "$OUT/ladder.txt"
    ;;
  cuda)
    timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_cuda.py tests/test_triton_ladder.py \
      tests/test_course.py tests/test_examples.py tests/test_api.py 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -30
    [ -f tools/sanitize_cuda.sh ] && timeout 150 bash tools/sanitize_cuda.sh 2>&1 | tail -8
    ;;
  bench)
    timeout 560 python3 -m ropekit bench --peers .peers --time-budget 500 --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt" | tail -60
    ;;
  stress)
    timeout 330 python3 -m ropekit stress --out "$OUT/stress.json" 2>&1 | tee "$OUT/stress.txt" | tail -30
    [ -f tools/sanitize.sh ] && timeout 200 bash tools/sanitize.sh 2>&1 | tee "$OUT/sanitize.txt" | tail -12
    ;;
  probe)
    timeout ${PROBE_TIMEOUT:-480} python3 tools/probe_host_l2.py 2>&1 | tee "$OUT/probe_host_l2.txt" | grep -v "^ " | tail -120
    ;;
  gputests)
    timeout 540 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_api.py tests/test_examples.py \
      tests/test_reliability.py tests/test_triton_ladder.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
    ;;
  paired)
    # the paired flat path: correctness on the GPU, a probe of its block sizes, then the fp32 case in the harness
    # with the launch table as it is and with the probe's best paired candidate for fp32 prefills
    timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_api.py -k "flat or every_v4_tile" \
      2>&1 | tee "$OUT/pytest_flat.txt" | tail -3
    timeout 300 python3 tools/flat_probe.py --paired --cases fp32,mha-fp16 --rounds 5 --ballast ${BALLAST:-8} \
      --json "$OUT/paired.json" 2>&1 | tee "$OUT/paired.txt"
    for run in table paired table2 paired2; do
      case $run in table*) wrap="-m ropekit bench" ;; *) wrap="tools/bench_table_override.py --element-size 4 \
        --best-of $OUT/paired.json --case fp32 -- " ;; esac
      timeout 150 python3 $wrap --cases fp32 --peers .peers --out "$OUT/bench_$run" 2>&1 \
        | tee "$OUT/bench_$run.txt" | grep -E "graph clock|override"
    done
    ;;
  publish)
    # the published benchmark (main cases) merged into docs/ here, notebooks 05 and 07 re-executed on it (carry
    # .whl and .shared), then the GQA shape in fp32 (the paired flat path falls back to q then k there)
    timeout 300 python3 -m ropekit bench --peers .peers --time-budget 260 --out /tmp/bench 2>&1 | tee "$OUT/bench.txt" \
      | grep -E "graph clock|ceiling|Wrote|wrote"
    cp /tmp/bench/benchmarks.json "$OUT/benchmarks_run.json"
    merge_docs /tmp/bench/benchmarks.json "$OUT"
    OUT=$OUT bash tools/gpu_notebooks_batch.sh 200 notebooks/05_triton_v4.ipynb notebooks/07_benchmarks.ipynb
    timeout 120 python3 tools/flat_probe.py --paired --cases llama3-8b-prefill --dtype float32 --rounds 5 \
      --json "$OUT/gqa_fp32.json" 2>&1 | tee "$OUT/gqa_fp32.txt" | tail -40
    ;;
  final)
    # notebooks 05 and 07 on the published run (carry .whl and .shared), then the sanitizer; everything in one
    # archive, $OUT/final.tgz (the device returns only a few files a call)
    mkdir -p /tmp/final
    OUT=/tmp/final bash tools/gpu_notebooks_batch.sh 200 notebooks/05_triton_v4.ipynb notebooks/07_benchmarks.ipynb
    timeout 240 bash tools/sanitize.sh /tmp/final/sanitize 2>&1 \
      | tee /tmp/final/sanitize.txt | tail -6
    tar -czf "$OUT/final.tgz" -C /tmp/final .
    ;;
  release)
    # after a kernel change (carry .whl, .shared, .peers): GPU tests of v4 and its users, the published benchmark
    # (main cases) merged into docs/ here, notebooks 05 and 07 re-executed on it; one archive, $OUT/release.tgz
    mkdir -p /tmp/rel
    cp "$OUT/gpu.txt" /tmp/rel/
    timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_api.py tests/test_examples.py \
      tests/test_reliability.py tests/test_triton_ladder.py 2>&1 | tee /tmp/rel/pytest_gpu.txt | tail -2
    timeout 220 python3 -m ropekit bench --peers .peers --time-budget 200 --out /tmp/bench 2>&1 | tee /tmp/rel/bench.txt \
      | grep -E "graph clock|ceiling|MET|met "
    cp /tmp/bench/benchmarks.json /tmp/rel/benchmarks_run.json
    merge_docs /tmp/bench/benchmarks.json /tmp/rel
    OUT=/tmp/rel bash tools/gpu_notebooks_batch.sh 170 notebooks/05_triton_v4.ipynb notebooks/07_benchmarks.ipynb
    tar -czf "$OUT/release.tgz" -C /tmp/rel .
    ;;
  small)
    # the small prefill (L2-resident, against Liger): v4 launch configurations in interleaved rounds, then the case in
    # the harness twice with the launch table and twice with the probe's fastest configuration; one archive
    mkdir -p /tmp/small
    OUT=/tmp/small timeout 200 python3 tools/small_prefill_ladder.py --no-rungs --rounds 7 \
      --configs "${SMALL_CONFIGS:-2x16x8,2x8x8,4x8x8,1x16x4,1x16x8,1x32x8,1x8x4,fused1x8,flat2048x8,flat1024x8,flat1024x4,flat512x4}" 2>&1 | tee /tmp/small/probe.txt
    for run in table best table2 best2; do
      case $run in table*) wrap="-m ropekit bench" ;; *) wrap="tools/bench_table_override.py --element-size 2 \
        --min-tokens 129 --max-tokens 4095 --table-only --best-of /tmp/small/small_prefill_ladder.json -- " ;; esac
      timeout 150 python3 $wrap --cases small-prefill --peers .peers --out "/tmp/small/bench_$run" 2>&1 \
        | tee "/tmp/small/bench_$run.txt" | grep -E "override|fastest|graph clock|small-prefill  "
    done
    tar -czf "$OUT/small.tgz" -C /tmp/small .
    ;;
  ab)
    # this tree against an earlier commit exported to .ab/ropekit_base (tools/ab_versions.py --export REF; carry .ab
    # and .peers): GPU tests of v4 and the API, the launch parameters, then both versions and Liger in one harness
    # run (interleaved graph rounds); one archive, $OUT/ab.tgz
    mkdir -p /tmp/ab
    cp "$OUT/gpu.txt" /tmp/ab/
    timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_api.py tests/test_triton_ladder.py \
      2>&1 | tee /tmp/ab/pytest_gpu.txt | tail -2
    python3 tools/launch_params.py 2>&1 | tee /tmp/ab/launch_params.txt
    timeout 330 python3 tools/ab_versions.py --cases "${AB_CASES:-small-prefill,decode,llama3-8b-prefill,mha-fp16,fp32}" \
      --rounds "${AB_ROUNDS:-9}" --out /tmp/ab 2>&1 | tee /tmp/ab/ab.txt | grep -v "^\[" | tail -45
    tar -czf "$OUT/ab.tgz" -C /tmp/ab .
    ;;
  verify)
    # after a kernel change that release already published: the reliability run (stress JSON rendered into
    # docs/reliability.md here), compute-sanitizer over every kernel, and the test files release does not run;
    # one archive, $OUT/verify.tgz
    mkdir -p /tmp/ver
    cp "$OUT/gpu.txt" /tmp/ver/
    timeout 150 python3 -m ropekit stress --out /tmp/ver/reliability.json 2>&1 | tee /tmp/ver/stress.txt | tail -12
    timeout 150 bash tools/sanitize.sh /tmp/ver/sanitize 2>&1 | tee /tmp/ver/sanitize.txt | tail -4
    python3 -m ropekit.stress --render /tmp/ver/reliability.json /tmp/ver/reliability.md \
      --sanitizer /tmp/ver/sanitize/sanitize.json 2>&1 | tail -2
    timeout 250 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/ --ignore tests/test_api.py \
      --ignore tests/test_examples.py --ignore tests/test_reliability.py --ignore tests/test_triton_ladder.py 2>&1 | tee /tmp/ver/pytest_rest.txt | tail -4
    tar -czf "$OUT/verify.tgz" -C /tmp/ver .
    ;;
  sweep)
    # the seed sweep (GB/s vs seq per batch, every implementation) re-measured, merged into docs/ here, and
    # notebook 07 re-executed on it (carry .whl, .shared, .peers); one archive, $OUT/sweep.tgz
    mkdir -p /tmp/swp
    cp "$OUT/gpu.txt" /tmp/swp/
    timeout 290 python3 -m ropekit bench --groups sweep --peers .peers --time-budget 240 --out /tmp/bsweep 2>&1 \
      | tee /tmp/swp/bench_sweep.txt | grep -v "^\[" | tail -8
    cp /tmp/bsweep/benchmarks.json /tmp/swp/benchmarks_sweep_run.json
    merge_docs /tmp/bsweep/benchmarks.json /tmp/swp
    OUT=/tmp/swp bash tools/gpu_notebooks_batch.sh 170 notebooks/07_benchmarks.ipynb
    tar -czf "$OUT/sweep.tgz" -C /tmp/swp .
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
echo "[gpu_run] stage $stage: done in ${SECONDS} s"
