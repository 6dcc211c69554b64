#!/usr/bin/env bash
# call 1: eager A/B of the working tree (a launch makes its own GPU current where another is, the launcher takes that
# device's stream; check mode read from os.environ's dictionary) against f7b896f (.ab), with the unfused chains; the
# launch, relaunch, device, validation and fused-op tests on the GPU
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call1.sh exp/eager_ab.py exp/HEAD.txt exp/change.patch $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__, torch.cuda.device_count())'; } | tee $R/gpu.txt
timeout 230 python3 exp/eager_ab.py --out $R/eager_ab.json --repeats 9 --peers .peers 2>&1 | grep -v "^\[" | tee $R/eager_ab.txt
timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_launch.py tests/test_api.py \
  tests/test_devices.py tests/test_validate.py tests/test_choice.py tests/test_hardening.py \
  tests/test_outputs.py tests/test_bench_eager.py tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_quant.py \
  tests/test_fused_page_table.py tests/test_fused_qk_norm_rope.py tests/test_fused_validate.py tests/test_engines.py tests/test_te.py tests/test_overlap.py \
  tests/test_grid_dependency.py tests/test_module.py tests/test_relaunch.py tests/test_norm_all_heads.py tests/test_norm_placement.py \
  > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
cd $OUT && tar czf r.tgz r && rm -rf r
