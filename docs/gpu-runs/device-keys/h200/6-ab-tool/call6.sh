#!/usr/bin/env bash
# call 6: tools/ab_fused.py --eager at this tree (one op's versions side by side, every other run reversed): the
# device index against 43223fc (.ab), 21 runs of 1000 calls
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call6.sh exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 400 python3 tools/ab_fused.py --eager --repeats 21 --peers .peers --out $R/ab-eager --ops "apply_rope" "apply_rope (in place)" rope_and_cache "rope_and_cache + QK-norm" "rope_and_cache, float8 cache" qk_norm_rope mla_rope_and_cache 2>&1 | grep -v "^\[" | tee $R/ab-eager.txt
echo "rc $?"; date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
