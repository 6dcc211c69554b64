#!/usr/bin/env bash
# The maintainer's GPU stages, one per device call (each fits in ten minutes). From the repository root:
#
#   bash tools/gpu_run.sh test [PATH ...]       the test suite on the GPU (default: all of tests/)
#   bash tools/gpu_run.sh bench                 the published benchmark (main cases + sweep), merged into docs/
#   bash tools/gpu_run.sh verify                the reliability run and compute-sanitizer, rendered into docs/
#   bash tools/gpu_run.sh notebooks [NB ...]    execute notebooks in place (default: all) and run nbval on them
#   bash tools/gpu_run.sh ab COMMIT             this tree against COMMIT in one process (export .ab first, see below)
#   bash tools/gpu_run.sh ab-fused COMMIT [ARG...]  the fused ops against COMMIT (tools/ab_fused.py ARG...: --eager,
#                                               --cases, --also VARIANT)
#   bash tools/gpu_run.sh course [NB ...]       the course's GPU data (reference tiles, tools), then notebooks NB
#   bash tools/gpu_run.sh targets               the launch-chain floor (plain and fused decode) and the eager host costs
#   bash tools/gpu_run.sh publish               one GPU's column of the side-by-side pages: main cases, every fused case, eager
#   bash tools/gpu_run.sh nccl                  python -m ropekit.distributed, one rank per visible GPU (2 or more)
#   bash tools/gpu_run.sh configs [--cases C]   every tune-tool configuration once, plain and under memcheck; the tool
#
# Carry .whl (nbval/nbconvert wheels, for notebooks), .shared (gpu-notebooks.sh), .peers (Liger, flash-attention's
# file: tools/fetch_peers.sh) and .ab (tools/ab_versions.py --export COMMIT) as the stage needs. Everything a stage
# produces is written under $OUT (default /tmp/out); docs/gpu.md lists what each stage writes.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stage=${1:-}
shift || true
site=/tmp/site
for folder in .whl .peers; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
[ -d "$site" ] && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
# the clocks and power limit beside the name: two GPUs of one kind can differ in them, and a kernel short of pure
# streaming feels the SM clock
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
    --format=csv; git rev-parse HEAD 2>/dev/null; date -u; \
  python3 -m ropekit info; } 2>&1 | tee "$OUT/gpu.txt"

echo "[gpu_run] stage $stage: started $(date -u +%H:%M:%S)"
case "$stage" in
  test)
    [ $# -gt 0 ] || set -- tests/
    # TEST_WORKERS > 0 spreads the files over pytest-xdist workers (carry its wheel in .whl): one GPU holds them all
    workers=()
    [ "${TEST_WORKERS:-0}" -gt 0 ] && workers=(-n "$TEST_WORKERS" --dist loadfile)
    timeout "${TEST_SECONDS:-560}" python3 -m pytest -q -p no:cacheprovider -o addopts="" "${workers[@]}" "$@" 2>&1 \
      | tee "$OUT/pytest.txt" | tail -25
    ;;
  bench)
    # the main cases and the seed sweep, each merged into docs/benchmarks.{json,md} and the plots; the raw run
    # documents and the published files come back
    mkdir -p "$OUT/docs"
    timeout 300 python3 -m ropekit bench --peers .peers --time-budget 260 --out "$OUT/main" 2>&1 \
      | tee "$OUT/bench_main.txt" | grep -v "^\[" | tail -30
    timeout 200 python3 -m ropekit bench --groups sweep --peers .peers --time-budget 150 --out "$OUT/sweep" 2>&1 \
      | tee "$OUT/bench_sweep.txt" | grep -v "^\[" | tail -8
    for run in main sweep; do
      [ -f "$OUT/$run/benchmarks.json" ] && python3 -m ropekit bench --merge docs/benchmarks.json "$OUT/$run/benchmarks.json" \
        --out docs 2>&1 | tail -2
    done
    cp docs/benchmarks.json docs/benchmarks.md docs/benchmarks_*.png "$OUT/docs/"
    ;;
  verify)
    # the reliability run and compute-sanitizer over every kernel (both owned by the reliability suite), rendered
    # into docs/reliability.md with the sanitizer's JSON
    timeout 300 python3 -m ropekit stress --out "$OUT/reliability.json" 2>&1 | tee "$OUT/stress.txt" | tail -12
    timeout 220 bash tools/sanitize.sh "$OUT/sanitize" 2>&1 | tee "$OUT/sanitize.txt" | tail -4
    python3 -m ropekit stress --render "$OUT/reliability.json" "$OUT/reliability.md" \
      --sanitizer "$OUT/sanitize/sanitize.json" 2>&1 | tail -2
    ;;
  notebooks)
    # each notebook executed in place with its own time limit, then nbval (lax) over it; $OUT/notebooks.tgz holds
    # the executed notebooks, $OUT/<name>.log each one's log
    [ -d .whl ] && [ -f .shared/gpu-notebooks.sh ] || { echo "notebooks: carry .whl and .shared"; exit 2; }
    [ $# -gt 0 ] || set -- notebooks/*.ipynb
    OUT=$OUT bash tools/gpu_notebooks_batch.sh "${NOTEBOOK_SECONDS:-150}" "$@"
    ;;
  course)
    # the course's stored GPU data, then the notebooks given (which read it) executed in place: the reference tiles
    # measured on this GPU (added under its name to ropekit/course/data/reference_tiles.json) and the tools on v1
    # and v3 (docs/gpu-runs/course-tools/); both come back in $OUT/course-data.tgz
    timeout 120 python3 -m ropekit.course.reference_tiles --out ropekit/course/data/reference_tiles.json 2>&1 | tail -4
    timeout 180 python3 -m ropekit.course.tools_run --out docs/gpu-runs/course-tools/ 2>&1 | tail -12
    tar -czf "$OUT/course-data.tgz" ropekit/course/data/reference_tiles.json docs/gpu-runs/course-tools
    [ $# -gt 0 ] && OUT=$OUT bash tools/gpu_notebooks_batch.sh "${NOTEBOOK_SECONDS:-150}" "$@"
    ;;
  targets)
    # issue 32's floors and host costs: the decode and small-prefill cases against the launch-chain floor (with the
    # peers), the fused decode cases against it, and the eager back-to-back wall clock of every op and its chain
    timeout 170 python3 -m ropekit bench --cases small-prefill,decode --skip ropekit-cuda --peers .peers \
      --time-budget 100 --out "$OUT/floor" 2>&1 | tee "$OUT/floor.txt" | grep -v "^\[" | tail -14
    timeout 150 python3 -m ropekit.bench.fused --cases decode-b64 decode-b64-qknorm mla-decode-b64 --time-budget 60 \
      --out "$OUT/fused" 2>&1 | tee "$OUT/fused.txt" | grep -v "^\[" | tail -10
    timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 90 --out "$OUT/eager" 2>&1 \
      | tee "$OUT/eager.txt" | grep -v "^\[" | tail -24
    ;;
  publish)
    # one GPU's tables for the pages that set the GPUs side by side: the main cases with the peers (the decode rows
    # beside the launch-chain floor), every fused case (formats included) with its unfused pipelines and
    # torch.compile, and the eager host costs; everything in $OUT/publish.tgz (one file comes back, whatever the count)
    mkdir -p "$OUT/publish"
    timeout 230 python3 -m ropekit bench --peers .peers --time-budget "${MAIN_SECONDS:-170}" --out "$OUT/publish/main" \
      2>&1 | tee "$OUT/publish/main.txt" | grep -v "^\[" | tail -12
    timeout 300 python3 -m ropekit.bench.fused --time-budget "${FUSED_SECONDS:-230}" --out "$OUT/publish/fused" 2>&1 \
      | tee "$OUT/publish/fused.txt" | grep -v "^\[" | grep -E "target|met|yes|\*\*no" | tail -40
    timeout 120 python3 -m ropekit.bench.eager --peers .peers --time-budget "${EAGER_SECONDS:-60}" \
      --out "$OUT/publish/eager" 2>&1 | tee "$OUT/publish/eager.txt" | grep -v "^\[" | tail -16
    cp "$OUT/gpu.txt" "$OUT/publish/"
    tar -czf "$OUT/publish.tgz" -C "$OUT" publish && rm -rf "$OUT/publish"
    ;;
  ab|ab-fused)
    # this tree against COMMIT, both through their public API, in one process: every published apply_rope case (ab),
    # or the fused ops on the graph or the eager clock (ab-fused): $OUT/ab/ or $OUT/ab-fused/ (ab.json, ab.md)
    ref=${1:?usage: gpu_run.sh $stage COMMIT}
    shift
    # .ab/REF: "REF FULL_HASH"; COMMIT names it as REF or as a prefix of the hash (the machine's git may not know it)
    if ! awk -v r="$ref" '$1 == r || index($2, r) == 1 { found = 1 } END { exit !found }' .ab/REF 2>/dev/null; then
      git rev-parse --verify -q "$ref" >/dev/null && python3 tools/ab_versions.py --export "$ref" \
        || { echo "ab: .ab/REF is not $ref and it cannot be exported here: run tools/ab_versions.py --export $ref"; exit 2; }
    fi
    set -o pipefail  # the stage's status is the tool's (1: a version slower, or failing its check), not tail's
    if [ "$stage" = ab ]; then
      timeout 560 python3 tools/ab_versions.py --rounds "${AB_ROUNDS:-9}" --time-budget 480 --out "$OUT/ab" 2>&1 \
        | tee "$OUT/ab.txt" | grep -v "^\[" | tail -60
    else
      timeout 560 python3 tools/ab_fused.py --time-budget 420 "$@" --out "$OUT/ab-fused" 2>&1 \
        | tee "$OUT/ab-fused.txt" | tail -60
    fi
    ;;
  configs)
    # every launch configuration the tune tool reaches, once each on the real case shapes: plain (fills the compile
    # caches, compares with the table), then under compute-sanitizer memcheck; then the tune tool itself
    mkdir -p "$OUT/configs"
    timeout 150 python3 tools/tune_v4.py --once "$@" 2>&1 | tee "$OUT/configs/plain.txt" | tail -3
    cs=$(command -v compute-sanitizer || ls -d /usr/local/cuda*/bin/compute-sanitizer | sort -V | tail -1)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 "$cs" --tool memcheck --report-api-errors no \
      --print-limit 20 python3 tools/tune_v4.py --once "$@" > "$OUT/configs/memcheck.txt" 2>&1
    grep -E "ERROR SUMMARY|Invalid|of size|at .*rope|configs differing" "$OUT/configs/memcheck.txt" | head -30
    timeout 150 python3 tools/tune_v4.py --cases "${TUNE_CASES:-decode,mha-fp16}" --rounds 3 --out "$OUT/configs/tune.json" \
      2>&1 | tee "$OUT/configs/tune.txt" | tail -25
    ;;
  nccl)
    # one rank a GPU, NCCL between them: every op on each rank's context-parallel share, gathered, against one
    # process bit for bit; $OUT/nccl.txt. NVLink multicast stays off (NCCL, PyTorch, NVSHMEM): the check needs
    # none, and on a shared host a program that uses it can put every GPU there out of service.
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    [ "$gpus" -ge 2 ] || { echo "nccl: needs 2 or more GPUs, this machine has $gpus"; exit 2; }
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=${NCCL_DEBUG:-VERSION}
    { nvidia-smi -L; echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
      echo "python3 -m ropekit.distributed --world $gpus --backend nccl"
      timeout 300 python3 -m ropekit.distributed --world "$gpus" --backend nccl; echo "exit status $?"; } 2>&1 \
      | tee "$OUT/nccl.txt"
    ;;
  *) echo "usage: bash tools/gpu_run.sh test [PATH ...]|bench|verify|notebooks [NB ...]|course [NB ...]|targets|publish|ab COMMIT|configs|nccl"; exit 2 ;;
esac
echo "[gpu_run] stage $stage: done in ${SECONDS} s"
