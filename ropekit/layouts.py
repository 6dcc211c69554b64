"""The tensor layouts ``apply_rope`` takes, and how each maps onto the kernels' ``(batch, seq, heads, head_dim)``.

Written once here; validation, the launch path, the module and the tools read these tables.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["LAYOUTS", "TO_BSHD", "to_bshd", "batch_and_seq_axes"]

LAYOUTS = ("bshd", "sbhd", "bhsd", "thd")
"""Every layout: ``b`` batch, ``s`` sequence, ``h`` heads, ``d`` head_dim; ``thd`` is packed varlen (tokens of every
sequence back to back, with ``cu_seqlens``)."""

TO_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}
"""For each 4-D layout, the permutation that views a tensor in it as ``(batch, seq, heads, head_dim)``. Each is an
involution, so the same permutation views a ``bshd`` tensor in that layout."""


def to_bshd(x: Optional[torch.Tensor], layout: str) -> Optional[torch.Tensor]:
    """``x`` (in ``layout``) as a ``(batch, seq, heads, head_dim)`` view (the kernels' view: the same data pointer);
    packed ``thd`` stays as it is, and None stays None. Its own inverse: a ``bshd`` tensor viewed in ``layout``."""
    return x if x is None or layout in ("thd", "bshd") else x.permute(TO_BSHD[layout])


def batch_and_seq_axes(layout: str) -> tuple[int, int]:
    """The axes of the batch and the sequence in a 4-D layout."""
    return TO_BSHD[layout][:2]
