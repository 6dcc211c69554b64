"""Every name the package and its tools use is defined: pyflakes over ropekit/ and tools/. Paths a CPU never runs (the
direct launch, GPU-only branches) are checked here too, before a GPU run finds them."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("pyflakes")


def test_no_undefined_names():
    result = subprocess.run([sys.executable, "-m", "pyflakes", "ropekit", "tools"], cwd=ROOT, capture_output=True,
                            text=True)
    undefined = [line for line in result.stdout.splitlines() if "undefined name" in line]
    assert not undefined, "\n".join(undefined)
