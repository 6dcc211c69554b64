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


def bump_versions(*written: Optional[torch.Tensor]) -> None:
    """Tell autograd that the tensors a call wrote in place changed (as every in-place PyTorch op does): a saved
    tensor rotated in place then fails backward loudly instead of giving a wrong gradient. None entries are skipped,
    and torch skips tensors made under inference mode (they have no version counter). One call for all of them: on a
    decode step's host path a call a tensor costs about a microsecond more. The custom op's dispatch does this by
    itself."""
    torch.autograd.graph.increment_version([t for t in written if t is not None])
