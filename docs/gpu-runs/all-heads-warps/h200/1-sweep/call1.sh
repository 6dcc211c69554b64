#!/usr/bin/env bash
# session 53, call 1: host split of the eager ops; the fused backward's tiles (OLMo-2, Qwen3); GPU tests of dcfb307
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
export PYTHONUNBUFFERED=1
site=/tmp/site
for folder in .whl .peers; do
  ls "$folder"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$folder"/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } | tee $R/gpu.txt
git diff -- ropekit > $R/change.patch
timeout 100 python3 exp/hostsplit2.py 0 > $R/hostsplit.txt 2>&1; echo "hostsplit rc $?"; head -14 $R/hostsplit.txt
timeout 200 python3 exp/bwd_sweep.py > $R/bwd_sweep.txt 2>&1; echo "sweep rc $?"; grep -v "^\[" $R/bwd_sweep.txt | tail -40
cp /tmp/bwd_sweep.json $R/ 2>/dev/null
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 --dist loadfile tests/test_choice.py \
  tests/test_launch.py tests/test_v4.py > $R/pytest.txt 2>&1; echo "pytest rc $?"; tail -3 $R/pytest.txt
