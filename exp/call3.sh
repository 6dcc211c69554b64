#!/usr/bin/env bash
# call 3: graph-replay A/B of the fused ops against f7b896f (.ab): the two backward cases (a norm over all heads now
# walks four stages deep) and the forward controls; then the whole fused benchmark (the H200's fused page)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call3.sh exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 220 python3 tools/ab_fused.py --time-budget 190 --cases olmo2-backward-b4-s4096 qknorm-backward-b4-s4096 \
  prefill-b4-s4096-olmo2 decode-b64-olmo2 prefill-b4-s4096 decode-b64 --out $R/ab-fused 2>&1 | grep -v "^\[" | tail -12 | tee $R/ab-fused.txt
timeout 320 python3 -m ropekit.bench.fused --time-budget 240 --out $R/fused 2>&1 | tee $R/fused.txt | grep -v "^\[" | grep -E "target|met|yes|\*\*no" | tail -40
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
