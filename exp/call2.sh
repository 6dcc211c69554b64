#!/usr/bin/env bash
# call 2: eager A/B of the tree against f7b896f (.ab) again, pinned to one CPU, 21 rounds in alternating order; the
# fused backward's pipeline depth on both backward cases (forced tiles, graph replay); the eager page
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call2.sh exp/eager_ab.py exp/bwd_stages.py exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; nproc; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 200 taskset -c 5 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 21 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 220 python3 exp/bwd_stages.py $R/bwd_stages.json 2>&1 | grep -v "^\[" | tee $R/bwd_stages.txt
timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager 2>&1 | grep -v "^\[" | tail -4 | tee $R/eager.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
