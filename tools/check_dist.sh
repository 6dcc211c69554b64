#!/usr/bin/env bash
# The distributions as a user gets them (CI runs this; a release runs it on the tag's build):
#   1. build the sdist and the wheel from this checkout and `twine check --strict` them;
#   2. install the wheel in a fresh venv and, from a directory outside the tree, run what the wheel ships:
#      --version, check, bench --help, stress --help and the course's exercise checker;
#   3. unpack the sdist, install it in another fresh venv and run its own tests (a subset, see SDIST_TESTS).
# The venvs reuse this Python's torch and triton (--system-site-packages); pip may fetch what they lack (setuptools).
# usage: tools/check_dist.sh [DIST_DIR]   (DIST_DIR: take the sdist and wheel from here instead of building them)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python}"
# The sdist's tests: the library's specification (reference, tables, validation, positions, layouts, outputs, the
# course's command line). The rest of the suite runs from the checkout in the same CI job; these show that the
# sdist's tests collect and pass against the installed package without the checkout, within CI's 15-minute budget.
SDIST_TESTS="${SDIST_TESTS:-test_reference.py test_validate.py test_positions.py test_layouts.py test_outputs.py test_course_cli.py}"

if [ $# -ge 1 ]; then dist="$(cd "$1" && pwd)"; else
    dist="$work/dist"
    "$python" -m build --no-isolation --sdist --wheel --outdir "$dist" "$repo" >"$work/build.log" 2>&1 \
        || { cat "$work/build.log"; exit 1; }
fi
wheel="$(ls "$dist"/ropekit-*.whl)"
sdist="$(ls "$dist"/ropekit-*.tar.gz)"
"$python" -m twine check --strict "$wheel" "$sdist"
wheel_files="$("$python" -m zipfile -l "$wheel")"; sdist_files="$(tar tzf "$sdist")"  # whole listings: grep -q
grep -q "dist-info/licenses/LICENSE" <<<"$wheel_files" || { echo "the wheel lacks LICENSE"; exit 1; }  # (no SIGPIPE)
for shipped in LICENSE tests/conftest.py tests/rope_cases.py; do
    grep -q "^ropekit-[^/]*/$shipped$" <<<"$sdist_files" || { echo "the sdist lacks $shipped"; exit 1; }
done

echo "== the wheel, installed in a fresh venv, run from outside the tree"
"$python" -m venv --system-site-packages "$work/wheel-venv"
py="$work/wheel-venv/bin/python"
"$py" -m pip install -q "$wheel"  # its dependencies resolve as for a user (torch and triton: already there)
run="$work/run"; mkdir -p "$run"; cd "$run"
"$py" -c "import ropekit, sys; assert ropekit.__file__.startswith('$work/wheel-venv'), ropekit.__file__"
"$py" -m ropekit --version
"$py" -m ropekit check
"$py" -m ropekit bench --help >/dev/null
"$py" -m ropekit stress --help >/dev/null
"$py" -m ropekit.course list >/dev/null
"$py" -m ropekit.course template 01_rotate_pair >mine.py
if "$py" -m ropekit.course check 01_rotate_pair mine.py; then echo "an untouched template passed"; exit 1; fi
"$py" -c "from ropekit.course import solution_source; print(solution_source('01_rotate_pair'))" >solved.py
"$py" -m ropekit.course check 01_rotate_pair solved.py

echo "== the sdist, unpacked and installed in a fresh venv, runs its tests"
"$python" -m venv --system-site-packages "$work/sdist-venv"
py="$work/sdist-venv/bin/python"
tar xzf "$sdist" -C "$work"
src="$(ls -d "$work"/ropekit-*/)"
"$py" -m pip install -q "$src"  # built as pip builds it for a user (isolated: setuptools>=77)
cd "$src/tests"  # not the unpacked root: its ropekit/ folder would shadow the installed package
"$py" -c "import ropekit; assert ropekit.__file__.startswith('$work/sdist-venv'), ropekit.__file__"
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider $SDIST_TESTS
echo "dist: ok"
