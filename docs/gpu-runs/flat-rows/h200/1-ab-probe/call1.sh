#!/usr/bin/env bash
# device call 1 (session 55): the row-split flat kernel: GPU tests, a probe, the A/B against 6ed81db
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
site=/tmp/site
for folder in .whl .peers; do
  ls $folder/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $folder/*.whl
done
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; date -u; } | tee $R/gpu.txt
git diff 6ed81db -- ropekit > $R/change.patch; cat .ab/REF > $R/ref.txt; cp exp/*.py exp/*.sh $R/
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_v4.py tests/test_launch.py tests/test_grid_dependency.py tests/test_angles.py tests/test_choice.py 2>&1 | tee $R/pytest.txt | tail -4
timeout 170 python3 exp/flat_probe.py > $R/flat_probe.txt 2>&1; tail -80 $R/flat_probe.txt; cp /tmp/flat_probe.json $R/ 2>/dev/null
OUT=$R ROPEKIT_AUTOTUNE=0 ROPEKIT_CACHE_DIR=$(mktemp -d) timeout 260 python3 tools/ab_versions.py --rounds 5 --time-budget 220 --out $R/ab > $R/ab.txt 2>&1; grep -v "^\[" $R/ab.txt | tail -45
date -u
