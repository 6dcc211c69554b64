#!/usr/bin/env bash
# The newcomer's path, timed: a fresh virtualenv, then only the README's two commands, from the repository root.
#   bash tools/verify_readme.sh [VENV_DIR]          (writes readme_*.log and readme_times.txt under $OUT)
# On a machine without network access, point pip at carried wheels first (pip reads these variables), e.g.
#   PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl $PWD/.whl-dev" bash tools/verify_readme.sh
# The venv sees the system's packages (--system-site-packages, or a .pth when python3 is itself a venv): the README
# asks for torch to be installed first.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
venv=${1:-/tmp/ropekit-readme-venv}
times="$OUT/readme_times.txt"
: >"$times"
timed() {  # timed LABEL COMMAND...: run, log to $OUT/readme_LABEL.log, append "LABEL rc seconds" to $times
  local label=$1; shift
  local t0=$(date +%s%N)
  "$@" >"$OUT/readme_$label.log" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-28s rc=%s %d.%d s\n' "$label" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$times"
  return $rc
}
rm -rf "$venv"
image_site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
timed venv python3 -m venv --system-site-packages "$venv" || exit 1
if [ "$(python3 -c 'import sys; print(sys.prefix != sys.base_prefix)')" = True ]; then
  # The image's python3 is itself a venv (the H100 image: /opt/torch/.venv): --system-site-packages reaches only the
  # base interpreter's packages, so expose the image venv's packages (torch, triton, ...) to the new venv with a .pth.
  echo "$image_site" >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image.pth"
  echo "image packages from $image_site" | tee -a "$times"
  # pip now counts the image's pytest as installed, but its console script runs the image's interpreter, which does
  # not see this venv (nbval, the editable ropekit): give the venv its own pytest (carried wheel, no resolution).
  timed venv_pytest "$venv/bin/pip" install --no-deps --ignore-installed pytest || exit 1
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
{ echo "PATH=$PATH"; env | grep '^PYTHON' ; command -v python pip pytest; python -c 'import sys; print(sys.path)'; } \
  >"$OUT/readme_environment.log" 2>&1
timed readme_command_check bash -c 'pip install -e ".[dev]" && python -m ropekit check'
timed readme_command_tests bash -c 'pip install -e ".[dev]" && pytest -n auto --dist loadfile'
{ pip show -f ropekit | tail -5; cd /tmp && python -c 'import ropekit; print(ropekit.__file__)'; } \
  >>"$OUT/readme_environment.log" 2>&1
tail -4 "$OUT/readme_readme_command_check.log"
tail -3 "$OUT/readme_readme_command_tests.log"
cat "$times"
