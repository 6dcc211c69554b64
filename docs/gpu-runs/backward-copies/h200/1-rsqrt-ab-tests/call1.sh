#!/usr/bin/env bash
# call 1: graph-replay A/B of the norm's reciprocal square root (one instruction) and the backward's reuse of w h
# against 14a051d (.ab): every QK-norm case, forward and backward, and two controls; then, beside each other, the GPU
# tests of the touched kernels and the tree's unchanged ones, and python -m ropekit check (timed)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call1.sh exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 230 python3 tools/ab_fused.py --time-budget 200 --cases qknorm-backward-b4-s4096 olmo2-backward-b4-s4096 \
  prefill-b4-s4096-qknorm decode-b64-qknorm prefill-b4-s4096-olmo2 decode-b64-olmo2 prefill-b4-s4096 decode-b64 \
  --out $R/ab-fused 2>&1 | grep -v "^\[" | tail -14 | tee $R/ab-fused.txt
( s=$(date +%s); timeout 230 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $? in $(( $(date +%s) - s )) s" >> $R/check.txt ) &
timeout 230 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 --dist loadfile -rfEs tests/test_fused_qk_norm_rope.py \
  tests/test_norm_all_heads.py tests/test_norm_placement.py tests/test_triton_fused.py tests/test_device.py tests/test_choice.py \
  tests/test_validate.py tests/test_relaunch.py tests/test_launch.py tests/test_fused_kv_cache.py tests/test_fused_mla.py \
  tests/test_overlap.py > $R/pytest.txt 2>&1
tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head
wait; tail -3 $R/check.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
