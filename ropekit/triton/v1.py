"""v1 — the math, one program per row.

The first rung of the ladder does nothing but the rotation, in the simplest shape a Triton kernel can have:

* ``x`` is a contiguous float32 ``(batch, seq, heads, head_dim)`` tensor, ``head_dim`` a power of two;
* one program rotates one head vector (one *row*: a token of one head), so the grid has ``batch * seq * heads``
  programs and program ``pid`` owns row ``pid`` of ``x`` viewed as ``(rows, head_dim)``;
* NeoX pairing: pair ``i`` is channels ``(i, i + head_dim/2)``, so a row is two contiguous half-rows;
* token ``s`` sits at position ``s`` (0..seq-1) and reads row ``s`` of the half-width float32 cos/sin tables
  (``ropekit.frequencies.cos_sin_table``); the math is fp32.

What it does not do yet is the subject of the next rungs: any strides, masks for other head sizes, half-precision
inputs (v2); reusing one cos/sin row for every head of a token (v3); q and k together, offsets, GPT-J pairing,
partial rotary and the rest (v4). The launcher says so with a ``ValueError`` naming the argument.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rope_v1_kernel", "rope_v1"]


@triton.jit
def rope_v1_kernel(X, COS, SIN, OUT, seqlen, n_heads, HALF: tl.constexpr):
    """Rotate row ``program_id(0)`` of the contiguous ``(batch * seq * heads, 2 * HALF)`` view of ``X`` into ``OUT``.

    ``HALF`` = head_dim / 2, the number of pairs per row, is a compile-time constant: block shapes must be known
    when the kernel is compiled (one compiled kernel per head size).
    """
    row = tl.program_id(0)
    # The flat row index is ((batch * seqlen) + token) * n_heads + head: peel the fastest-varying index first.
    head = row % n_heads
    token = (row // n_heads) % seqlen
    batch = row // (n_heads * seqlen)
    # Where the row starts. For a contiguous tensor this is just row * head_dim; writing it out from (batch, token,
    # head) is the form v2 generalises to arbitrary strides.
    row_start = ((batch * seqlen + token) * n_heads + head) * (2 * HALF)

    # One lane per pair: tl.arange needs a power-of-two length, which is why v1 only takes power-of-two head_dim.
    pairs = tl.arange(0, HALF)
    x_a = tl.load(X + row_start + pairs)  # first channel of every pair: the first half-row
    x_b = tl.load(X + row_start + HALF + pairs)  # second channel: the second half-row
    # Every head of a token uses the same angles: row `token` of the half-width tables (position == token index).
    cos = tl.load(COS + token * HALF + pairs)
    sin = tl.load(SIN + token * HALF + pairs)

    # The 2-D rotation of every pair (a, b) by its angle.
    tl.store(OUT + row_start + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row_start + HALF + pairs, x_b * cos + x_a * sin)


def rope_v1(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``x`` (contiguous float32 ``(batch, seq, heads, head_dim)``) at positions ``0..seq-1``; return ``out``.

    ``cos``/``sin``: contiguous float32 half-width tables ``(>= seq, head_dim/2)`` on x's device (row ``p`` holds
    position ``p``). ``out``: a contiguous tensor like ``x`` not sharing its memory (allocated when None).
    Raises ``ValueError`` naming the argument for anything v1 does not support.
    """
    _check(x, cos, sin, out)
    if out is None:
        out = torch.empty_like(x)
    batch, seqlen, n_heads, head_dim = x.shape
    n_rows = batch * seqlen * n_heads
    if n_rows:
        rope_v1_kernel[(n_rows,)](x, cos, sin, out, seqlen, n_heads, HALF=head_dim // 2)
    return out


def _check(x, cos, sin, out) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError(f"x must be a 4-D (batch, seq, heads, head_dim) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32 in v1 (half precision arrives in v2), got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous in v1 (strides arrive in v2), got strides {x.stride()}")
    head_dim = x.shape[-1]
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"x's head_dim must be even (channels rotate in pairs), got {head_dim}")
    if head_dim & (head_dim - 1):
        raise ValueError(f"x's head_dim must be a power of two in v1 (masks for other sizes arrive in v2), "
                         f"got {head_dim}")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; v1 addresses with 32-bit integers (int64 arrives in v4)")
    seqlen = x.shape[1]
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor) or table.ndim != 2:
            raise ValueError(f"{name} must be a 2-D (positions, head_dim/2) table")
        if table.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the half-width table), got {table.dtype}")
        if table.shape[1] != head_dim // 2 or table.shape[0] < seqlen:
            raise ValueError(f"{name} must have shape (>= {seqlen}, {head_dim // 2}) for x of shape "
                             f"{tuple(x.shape)}, got {tuple(table.shape)}")
        if not table.is_contiguous():
            raise ValueError(f"{name} must be contiguous in v1, got strides {table.stride()}")
        if table.device != x.device:
            raise ValueError(f"{name} is on {table.device} but x is on {x.device}")
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"out must be a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous in v1, got strides {out.stride()}")
        if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError("out must not share memory with x (in-place rotation arrives in v4)")
