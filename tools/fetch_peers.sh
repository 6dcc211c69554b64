#!/usr/bin/env bash
# Put the benchmark's optional peers into .peers/ (git-ignored; the lead carries it to the GPU machine).
# The package never imports them; `python -m ropekit bench` loads them when present and says so when not.
#
#   tools/fetch_peers.sh            # run on a machine with network access, from anywhere in the checkout
#
# 1. Liger-Kernel: the pure-Python wheel (py3-none-any, needs only torch >= 2.1.2 and triton >= 2.3.1, so it runs on
#    torch 2.11 / triton 3.6 and on torch 2.13 / triton 3.9), downloaded without dependencies and unpacked into
#    .peers/site (the harness appends that folder to sys.path; the GPU machine cannot pip-install from an index).
# 2. flash-attention cannot be installed on the GPU machine (it needs a CUDA build); the harness loads one file by path:
#    flash_attn/ops/triton/rotary.py (torch + triton only) saved as .peers/flash_attn_rotary.py. It was taken from
#    Dao-AILab/flash-attention at the pinned commit below; this script downloads that exact file when it is missing
#    and checks its hash either way.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.peers
mkdir -p "$dest"

LIGER_VERSION=${LIGER_VERSION:-0.8.5}
if ! ls "$dest"/liger_kernel-"$LIGER_VERSION"-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" "liger-kernel==$LIGER_VERSION"
fi
rm -rf "$dest/site"
python3 -m zipfile -e "$dest"/liger_kernel-"$LIGER_VERSION"-*.whl "$dest/site"
echo "liger-kernel $LIGER_VERSION unpacked into $dest/site"

FLASH_REPO=Dao-AILab/flash-attention
FLASH_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced
FLASH_SHA256=d2037e623854c702fb075784fe4292d4a89d6b9ac1ae33cab3d6788f8f94f240
flash="$dest/flash_attn_rotary.py"
if [ ! -f "$flash" ]; then
  curl -fsSL "https://raw.githubusercontent.com/$FLASH_REPO/$FLASH_COMMIT/flash_attn/ops/triton/rotary.py" -o "$flash" \
    || { echo "could not download $flash; copy flash_attn/ops/triton/rotary.py of $FLASH_REPO@$FLASH_COMMIT there" >&2; exit 1; }
fi
actual=$(sha256sum "$flash" | cut -d' ' -f1)
if [ "$actual" != "$FLASH_SHA256" ]; then
  echo "warning: $flash has sha256 $actual, expected $FLASH_SHA256 (a different revision of the file)" >&2
fi
echo "$FLASH_REPO@$FLASH_COMMIT flash_attn/ops/triton/rotary.py" > "$dest/flash_attn_rotary.SOURCE"
echo "flash-attention rotary.py in $flash"
du -sh "$dest"
