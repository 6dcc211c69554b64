#!/usr/bin/env bash
# call 2: the merged tree: the fused benchmark's new cases (MLA's bf16 prefill, fp8_ds_mla decode and prefill, MLA
# without a table, Llama-4-Scout's NoPE layer) beside the reference cases; graph and eager A/B against 716be06
# (.ab); python -m ropekit check
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; cat exp/HEAD.txt; cat .ab/REF; date -u; python3 -m ropekit info; } 2>&1 | tee $R/gpu.txt
cp exp/s70/call2.sh exp/s70/diag_graph.py exp/HEAD.txt $R/
timeout 60 python3 exp/s70/diag_graph.py > $R/diag_graph.txt 2>&1; echo "diag rc $?"; tail -12 $R/diag_graph.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_bench_fused_tune.py -k "ds-mla" > $R/pytest_tune.txt 2>&1; echo "tune tests rc $?"; tail -1 $R/pytest_tune.txt
timeout 200 python3 -m ropekit.bench.fused --time-budget 140 --out $R/fused --cases decode-b64 prefill-b4-s4096 mla-decode-b64 mla-prefill-b4-s4096 mla-decode-b64-ds-mla mla-prefill-b4-s4096-ds-mla mla-decode-b64-no-table decode-b64-nope prefill-b4-s4096-nope > $R/fused.txt 2>&1
echo "fused rc $?"; grep -v "^\[" $R/fused.txt | tail -45
date -u | tee -a $R/gpu.txt
timeout 130 python3 tools/ab_fused.py --rounds 9 --peers .peers --out $R/ab-fused --cases decode-b64 prefill-b4-s4096 mla-decode-b64 decode-b64-fp8-token-head prefill-b4-s4096-nvfp4 2>&1 | grep -v "^\[" > $R/ab-fused.txt
echo "ab rc $?"; tail -10 $R/ab-fused.txt
date -u | tee -a $R/gpu.txt
timeout 130 python3 tools/ab_fused.py --eager --repeats 9 --peers .peers --out $R/ab-eager 2>&1 | grep -v "^\[" > $R/ab-eager.txt
echo "ab eager rc $?"; tail -16 $R/ab-eager.txt
date -u | tee -a $R/gpu.txt
rm -f ~/.cache/torch_extensions/*/ropekit_cuda/lock
timeout 100 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $?" | tee -a $R/check.txt; tail -3 $R/check.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
