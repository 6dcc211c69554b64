#!/usr/bin/env bash
# call 6: the backward's rule (16-byte copies: 1 x 16 heads of Qwen3's 128 bf16 channels; four stages everywhere)
# against 14a051d (.ab): graph-replay A/B, 11 rounds, the two backward cases and four controls; then the GPU tests
# of the norm and the choice, beside compute-sanitizer memcheck and racecheck over the Qwen3-heads gradient test
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call6.sh exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 230 python3 tools/ab_fused.py --time-budget 200 --rounds 11 --cases qknorm-backward-b4-s4096 olmo2-backward-b4-s4096 \
  prefill-b4-s4096-qknorm decode-b64-qknorm prefill-b4-s4096 decode-b64 --out $R/ab-fused 2>&1 | grep -v "^\[" | tail -8 | tee $R/ab-fused.txt
( for tool in memcheck racecheck; do PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_qk_norm_rope.py -k "qwen3s_heads" > $R/$tool.txt 2>&1
  echo "$tool rc $?" >> $R/$tool.txt; done ) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 --dist loadfile -rfEs tests/test_fused_qk_norm_rope.py \
  tests/test_norm_all_heads.py tests/test_norm_placement.py tests/test_choice.py tests/test_triton_fused.py \
  tests/test_fused_autotune.py > $R/pytest.txt 2>&1
tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head
wait; for tool in memcheck racecheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|rc " $R/$tool.txt | tail -3; done
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
