"""v2 — strides, masks and dtypes.

Same grid and same math as v1 (one program per (token, head) row, NeoX pairing, positions 0..seq-1, fp32 math), with
three things v1 could not do:

* **Strides.** v1 found a row at ``row * head_dim``, which is true only for a contiguous ``(batch, seq, heads,
  head_dim)`` tensor. v2 takes the four strides of ``x`` (and of ``out``) and computes
  ``batch * stride_b + token * stride_s + head * stride_h + channel * stride_d``. One kernel then serves every layout
  as a view: ``(seq, batch, heads, head_dim)`` ("sbhd") passed as ``x.transpose(0, 1)``, ``(batch, heads, seq,
  head_dim)`` ("bhsd") as ``x.transpose(1, 2)``, q sliced out of a fused qkv projection, ... — no copies. Triton
  specialises integer arguments equal to 1, so the usual ``stride_d == 1`` still compiles to contiguous vector loads.
* **Masks.** ``tl.arange`` needs a power-of-two length; head_dim 80 or 96 has 40 or 48 pairs. The program uses the
  next power of two lanes (64) and masks off the lanes past the last pair: masked loads read nothing, masked stores
  write nothing.
* **Dtypes.** fp16 / bf16 / fp32 in; each element is converted to fp32 on load, rotated in fp32 with the float32
  cos/sin, and rounded once to the input dtype on store: within one ulp of the exact value. The eager
  ``x * cos + rotate_half(x) * sin`` in bf16 rounds cos, sin, both products and the sum, and lands several ulps away
  for a few percent of the outputs, far more where the two products cancel (notebook 03 measures it).

Addresses are still 32-bit integers (the launcher refuses tensors that would need more; v4 computes in int64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rope_v2_kernel", "rope_v2", "check_arguments", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def rope_v2_kernel(
    X, COS, SIN, OUT, seqlen, n_heads,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_cs_s, stride_cs_d,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """Rotate row ``program_id(0)`` (a (batch, token, head) triple, as in v1) of the strided view ``X`` into ``OUT``.

    ``HALF`` pairs per row, processed by ``BLOCK_HALF`` (the next power of two) lanes.
    """
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seqlen
    batch = row // (n_heads * seqlen)
    # The row's first element, from the strides: this is the only place the layout enters.
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh

    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HALF  # lanes past the last pair do nothing (head_dim 80: 40 of 64 lanes work)
    # Load in the input dtype, compute in fp32 (other=0.0: masked lanes hold a harmless value, never stored).
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HALF) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * stride_cs_s + pairs * stride_cs_d, mask=mask, other=0.0)
    sin = tl.load(SIN + token * stride_cs_s + pairs * stride_cs_d, mask=mask, other=0.0)

    out_a = x_a * cos - x_b * sin
    out_b = x_b * cos + x_a * sin
    # One rounding, to the output's dtype, at the very end.
    tl.store(out_row + pairs * stride_od, out_a.to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HALF) * stride_od, out_b.to(OUT.dtype.element_ty), mask=mask)


def rope_v2(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``x`` at positions ``0..seq-1``; return ``out``.

    ``x``: a ``(batch, seq, heads, head_dim)``-indexed view with any strides (sbhd/bhsd layouts as permuted views),
    fp16/bf16/fp32, any even head_dim. ``cos``/``sin``: float32 half-width tables ``(>= seq, head_dim/2)`` with equal
    strides (row ``p`` holds position ``p``). ``out``: like ``x`` (same shape and dtype, any strides, not sharing x's
    memory); when None it is allocated with x's memory layout (``torch.empty_like``).
    Raises ``ValueError`` naming the argument for anything v2 does not support.
    """
    check_arguments(x, cos, sin, out, version="v2")
    if out is None:
        out = torch.empty_like(x)  # keeps x's dense layout (an sbhd input gives an sbhd output)
    batch, seqlen, n_heads, head_dim = x.shape
    n_rows = batch * seqlen * n_heads
    if n_rows:
        rope_v2_kernel[(n_rows,)](
            x, cos, sin, out, seqlen, n_heads, *x.stride(), *out.stride(), *cos.stride(),
            HALF=head_dim // 2, BLOCK_HALF=triton.next_power_of_2(head_dim // 2))
    return out


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset a view reaches from its first element (what 32-bit addressing must hold)."""
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()) if size > 0)


def check_arguments(x, cos, sin, out, *, version: str) -> None:
    """The contract of v2 (and v3, which keeps it): raise ``ValueError`` naming the first unsupported argument."""
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError(f"x must be a 4-D (batch, seq, heads, head_dim)-indexed view, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x must be float16, bfloat16 or float32 in {version}, got {x.dtype}")
    head_dim = x.shape[-1]
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"x's head_dim must be even (channels rotate in pairs), got {head_dim}")
    if _max_offset(x) >= 2**31:
        raise ValueError(f"x spans more than 2**31 elements; {version} addresses with 32-bit integers "
                         "(int64 arrives in v4)")
    seqlen = x.shape[1]
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor) or table.ndim != 2:
            raise ValueError(f"{name} must be a 2-D (positions, head_dim/2) table")
        if table.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the half-width table), got {table.dtype}")
        if table.shape[1] != head_dim // 2 or table.shape[0] < seqlen:
            raise ValueError(f"{name} must have shape (>= {seqlen}, {head_dim // 2}) for x of shape "
                             f"{tuple(x.shape)}, got {tuple(table.shape)}")
        if table.device != x.device:
            raise ValueError(f"{name} is on {table.device} but x is on {x.device}")
    if cos.stride() != sin.stride():
        raise ValueError(f"sin must have the same strides as cos (one set of table strides), got {sin.stride()} "
                         f"and {cos.stride()}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype \
                or out.device != x.device:
            raise ValueError(f"out must be a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device} (the output "
                             f"is in the input dtype)")
        if any(stride == 0 and size > 1 for size, stride in zip(out.shape, out.stride())):
            raise ValueError(f"out must not be a broadcast view (stride 0), got strides {out.stride()}")
        if _max_offset(out) >= 2**31:
            raise ValueError(f"out spans more than 2**31 elements; {version} addresses with 32-bit integers")
        if out.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError("out must not share memory with x (in-place rotation arrives in v4)")
