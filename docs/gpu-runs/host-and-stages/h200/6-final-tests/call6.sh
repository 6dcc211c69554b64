#!/usr/bin/env bash
# call 6: the final tree's GPU tests: the device tests (every op on a side stream that sleeps before it writes its
# inputs; the two-GPU ones skip on one GPU), the launch choice, validation, relaunch, launch and fused-op tests; then
# python -m ropekit check
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call6.sh exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count(), torch.cuda.get_device_properties(0).shared_memory_per_block_optin)'; } | tee $R/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile -rfEs tests/test_device.py tests/test_choice.py \
  tests/test_validate.py tests/test_relaunch.py tests/test_launch.py tests/test_fused_kv_cache.py tests/test_fused_mla.py \
  tests/test_fused_qk_norm_rope.py tests/test_norm_all_heads.py tests/test_overlap.py tests/test_api.py > $R/pytest.txt 2>&1
tail -2 $R/pytest.txt; grep -E "^(FAILED|ERROR)" $R/pytest.txt | head; grep -c "SKIPPED.*two CUDA GPUs" $R/pytest.txt
timeout 60 python3 -m ropekit check > $R/check.txt 2>&1; echo "check rc $?" | tee -a $R/check.txt
date -u | tee -a $R/gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
