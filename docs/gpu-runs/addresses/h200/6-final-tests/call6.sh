#!/usr/bin/env bash
# call 6: the launch, relaunch and fused-op GPU tests at the final tree (the relaunch's launcher call factored into
# launch._run_prepared, otherwise as call 5's)
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call6.sh exp/HEAD.txt $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .whl/pytest_xdist*.whl .whl/execnet*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } | tee $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_relaunch.py tests/test_launch.py \
  tests/test_fused_kv_cache.py tests/test_fused_mla.py tests/test_fused_qk_norm_rope.py tests/test_fused_quant.py tests/test_api.py \
  > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
cd $OUT && tar czf r.tgz r && rm -rf r
