#!/usr/bin/env bash
# call 2: graph-replay A/B against 14a051d (.ab), 11 rounds: this tree (the norm's reciprocal square root in one
# instruction, its subnormal guard, the backward's w h reused) and ropekit_noguard (the same without the guard);
# every QK-norm case and two controls. Then the per-head backward's tiles swept by graph replay on this tree.
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call2.sh exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 300 python3 tools/ab_fused.py --time-budget 270 --rounds 11 --also ropekit_noguard --cases prefill-b4-s4096-qknorm \
  qknorm-backward-b4-s4096 prefill-b4-s4096-olmo2 olmo2-backward-b4-s4096 decode-b64-qknorm decode-b64-olmo2 \
  prefill-b4-s4096 decode-b64 --out $R/ab-fused 2>&1 | grep -v "^\[" | tail -28 | tee $R/ab-fused.txt
timeout 200 python3 -m ropekit.bench.fused_tune --cases qknorm-backward-b4-s4096 --time-budget 170 --out $R/tune 2>&1 \
  | grep -v "^\[" | tee $R/tune.txt | tail -30
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
