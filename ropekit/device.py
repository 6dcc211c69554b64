"""Where ropekit's kernels run: a CUDA GPU when there is one, otherwise the Triton interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function, i.e. when ropekit's kernel modules are
imported. This module therefore has to run before any of them: ``ropekit/__init__.py`` imports it first, and the test
suite's ``conftest.py`` imports ropekit before anything else. The decision is process-wide.
"""

from __future__ import annotations

import os

import torch

__all__ = ["DEVICE", "INTERPRET", "describe", "default_device"]


def _decide() -> tuple[str, bool]:
    """Return (device, interpreted) and set TRITON_INTERPRET when the interpreter is needed."""
    forced = os.environ.get("TRITON_INTERPRET")
    if torch.cuda.is_available():
        # A user may still force the interpreter on a GPU machine (the course's touch pictures do, in a subprocess).
        return ("cpu", True) if forced == "1" else ("cuda", False)
    if forced not in (None, "", "1"):
        # TRITON_INTERPRET=0 on a machine without a GPU would leave Triton with no backend at all.
        raise RuntimeError(
            "ropekit: no CUDA device is available and TRITON_INTERPRET is set to "
            f"{forced!r}; unset it (ropekit then uses the Triton interpreter on the CPU)."
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu", True


DEVICE, INTERPRET = _decide()


def default_device() -> torch.device:
    """The torch device the kernels run on in this process."""
    return torch.device(DEVICE)


def describe() -> str:
    """One line for humans: where kernels run and why."""
    if INTERPRET:
        return "CPU through the Triton interpreter (TRITON_INTERPRET=1): correct but slow, never a benchmark"
    return f"CUDA: {torch.cuda.get_device_name()}"
