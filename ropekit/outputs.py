"""Where a call writes: fresh outputs, and the version bump of tensors written in place (every op that writes uses
these, so a fused op and apply_rope allocate and report writes alike)."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["new_output", "bump_versions"]


def new_output(x: torch.Tensor) -> torch.Tensor:
    # The output is contiguous in the caller's layout, whatever the input's strides (documented in docs/api.md).
    # empty_like, not torch.empty(x.shape, dtype=..., device=...): one call that reads no attribute in Python, the
    # cheaper by far on a decode step's host path (docs/tuning.md#direct-launch)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def bump_versions(q: torch.Tensor, k: Optional[torch.Tensor]) -> None:
    """Tell autograd that q and k changed (as every in-place PyTorch op does): a saved tensor rotated in place then
    fails backward loudly instead of giving a wrong gradient. The custom op's dispatch does this by itself."""
    for t in (q, k):
        if t is not None and not t.is_inference():
            torch.autograd.graph.increment_version(t)
