#!/usr/bin/env bash
# call 2: the eager A/B again with base and new of each op side by side in every run (41 runs), not pinned; the
# H200's eager page at this tree; then OLMo-2's and the per-head backward's neighbouring tiles (olmo2_tiles.py)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call2.sh exp/eager_ab.py exp/olmo2_tiles.py exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; uptime; } | tee $R/gpu.txt
timeout 200 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 41 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
date -u | tee -a $R/gpu.txt
timeout 150 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager > $R/eager.txt 2>&1; echo "eager rc $?"; grep -E "^\| (apply_rope|rope_and_cache \(|mla)" $R/eager/*.md | head; grep "unfused chain" $R/eager/*.md | grep -E "x \|" | head -20
date -u | tee -a $R/gpu.txt
timeout 200 python3 exp/olmo2_tiles.py $R/olmo2_tiles.json 2>&1 | grep -v "^\[" | tail -40 | tee $R/olmo2_tiles.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
