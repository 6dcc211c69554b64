#!/usr/bin/env bash
# session 53, call 7: GPU tests of the fused decode's callers on the final tree
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
ls .whl/pytest_xdist*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$site" .whl/pytest_xdist*.whl .whl/execnet*.whl
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 12 --dist loadfile tests/test_choice.py \
  tests/test_grid_dependency.py tests/test_fused_page_table.py tests/test_engines.py tests/test_fused_mla.py \
  tests/test_norm_all_heads.py > $R/pytest.txt 2>&1; echo "pytest rc $?"; tail -3 $R/pytest.txt
