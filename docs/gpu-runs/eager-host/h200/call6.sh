#!/usr/bin/env bash
# stop 48 call 6: eager A/B of the runner found by the launch's own specialisation and the outputs by empty_like
# (working tree) against the tree before (.ab), then the GPU tests of the launcher and the published eager page
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R; cp exp/call6.sh exp/eager_ab.py $R/
site=/tmp/site; python3 -m pip install -q --no-index --no-deps --target $site .peers/*.whl .whl/pytest_xdist*.whl .whl/execnet*.whl 2>/dev/null; export PYTHONPATH=$site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv; date -u; git diff --stat -- ropekit; } | tee $R/gpu.txt
timeout 150 python3 exp/eager_ab.py 9 2>&1 | grep -v "^\[" | tee $R/ab.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_launch.py tests/test_api.py \
  tests/test_outputs.py tests/test_bench_eager.py tests/test_fused_kv_cache.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
timeout 130 python3 -m ropekit.bench.eager --peers .peers --time-budget 60 --out $R/eager 2>&1 | tee $R/eager.txt \
  | grep -v "^\[" | tail -5
cd $OUT && tar czf r.tgz r
