"""Inputs for one case (fresh random q/k, positions, cos/sin in every form the implementations take) and the check
that an implementation computed the rotation before it is timed.

Every implementation gets its own freshly drawn q and k (a seed per case *and* implementation): an output buffer that
the caching allocator hands over from a previous implementation then holds the wrong numbers, so a kernel that leaves
elements unwritten fails the check instead of passing on a neighbour's result.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from ..frequencies import cos_sin_table
from .cases import ROPE_BASE, TABLE_POSITIONS, Case

__all__ = ["Tables", "CaseData", "make_tables", "make_data", "expected_output", "check_outputs", "seed_for",
           "CHECK_TOLERANCE"]

# Per-token relative error ||out_t - ref_t|| / ||ref_t|| allowed by the pre-timing check. A sanity check, not the
# precision test (tests/ hold those): peers compute in the model dtype with cos/sin rounded to it, as transformers does.
# A wrong pairing, a wrong position or an unwritten token gives errors of order 1.
CHECK_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass
class Tables:
    """cos/sin shared by every buffer set of a case (they are shared by every layer of a model, too)."""

    cos_half: torch.Tensor  # (8192, rotary/2) float32: ropekit's and flash-attention's tables
    sin_half: torch.Tensor
    cos_rows: torch.Tensor  # full-width per-token rows in the model dtype, transformers' form (see make_tables)
    sin_rows: torch.Tensor
    positions: torch.Tensor  # int64, the case's token shape: the position of every token (for the reference)
    offsets: torch.Tensor | None  # int32 (batch,) per-sequence offsets, or None
    cu_seqlens: torch.Tensor | None  # int32 (n_seqs + 1,), thd only
    max_seqlen: int | None


@dataclass
class CaseData:
    """One buffer set: q and k in the case's layout, and upstream gradients for the backward pass."""

    q: torch.Tensor
    k: torch.Tensor
    grad_q: torch.Tensor | None = None
    grad_k: torch.Tensor | None = None


def seed_for(*names: str) -> int:
    """A stable 31-bit seed from names (``hash()`` is salted per process)."""
    return zlib.crc32("/".join(names).encode()) & 0x7FFFFFFF


def make_tables(case: Case, device) -> Tables:
    """Positions and cos/sin for ``case``; per-sequence offsets are drawn from a seed of the case name.

    ``cos_rows`` follow transformers: rows of the token shape with the head axis missing (bshd ``(1 or b, s, R)``,
    sbhd ``(s, 1, R)``, thd ``(t, R)``), in q's dtype; NeoX rows are ``cat(c, c)``, GPT-J rows repeat each value twice.
    """
    generator = torch.Generator().manual_seed(seed_for(case.name, "positions"))
    cos_half, sin_half = cos_sin_table(TABLE_POSITIONS, case.rotary, base=ROPE_BASE, device=device)
    offsets = cu_seqlens = max_seqlen = None
    if case.layout == "thd":
        lengths = torch.tensor(case.seq_lens, dtype=torch.int64)
        cu = torch.zeros(len(case.seq_lens) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(lengths, 0)
        positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in case.seq_lens])
        cu_seqlens, max_seqlen = cu.to(torch.int32).to(device), max(case.seq_lens)
    else:
        if case.positions == "offsets":
            # each sequence's cache length; the last token (offset + seqlen - 1) stays inside the table
            offsets_cpu = torch.randint(0, TABLE_POSITIONS - case.seqlen + 1, (case.batch,), generator=generator)
            offsets = offsets_cpu.to(torch.int32).to(device)
            positions = offsets_cpu[:, None] + torch.arange(case.seqlen)[None, :]  # (batch, seq)
        else:
            positions = torch.arange(case.seqlen).expand(case.batch, case.seqlen)
        if case.layout == "sbhd":
            positions = positions.t()
    positions = positions.contiguous().to(device)
    rows_for = positions
    if case.layout == "bshd" and case.positions == "none":
        rows_for = positions[:1]  # (1, s): one row per position, broadcast over the batch (what transformers builds)
    elif case.layout == "sbhd":
        rows_for = positions[:, :1]  # (s, 1)
    cos_rows, sin_rows = (_full_rows(t[rows_for], case.interleaved).to(case.dtype) for t in (cos_half, sin_half))
    return Tables(cos_half, sin_half, cos_rows, sin_rows, positions, offsets, cu_seqlens, max_seqlen)


def _full_rows(half: torch.Tensor, interleaved: bool) -> torch.Tensor:
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


def make_data(case: Case, device, seed: int, *, backward: bool = False) -> CaseData:
    """Fresh standard-normal q and k (and upstream gradients when ``backward``), never zeros."""
    generator = torch.Generator(device=device).manual_seed(seed)
    draw = lambda shape: torch.randn(shape, generator=generator, device=device, dtype=case.dtype)  # noqa: E731
    data = CaseData(draw(case.q_shape), draw(case.k_shape))
    if backward:
        data.grad_q, data.grad_k = draw(case.q_shape), draw(case.k_shape)
    return data


def expected_output(case: Case, tables: Tables, x: torch.Tensor, *, conjugate: bool = False) -> torch.Tensor:
    """The rotation of ``x`` (case layout) in float32 from the float32 tables, on x's device.

    Written independently of every implementation under test (gather the table rows by position, rotate pairs).
    """
    rotary = case.rotary
    x32 = x.to(torch.float32)
    cos = tables.cos_half[tables.positions].unsqueeze(-2)  # token shape + (1, rotary/2)
    sin = tables.sin_half[tables.positions].unsqueeze(-2)
    if conjugate:
        sin = -sin
    rot = x32[..., :rotary]
    if case.interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out_rot = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        a, b = rot[..., : rotary // 2], rot[..., rotary // 2:]
        out_rot = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((out_rot, x32[..., rotary:]), dim=-1)


def check_outputs(case: Case, outputs, expected) -> tuple[float, str | None]:
    """(worst per-token relative error, None or a message) for the implementation's ``(q_out, k_out)``."""
    worst = 0.0
    tolerance = CHECK_TOLERANCE[case.dtype]
    for name, out, ref in zip(("q", "k"), outputs, expected):
        if out is None:
            return float("inf"), f"{name}: no output"
        if tuple(out.shape) != tuple(ref.shape):
            return float("inf"), f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        out32 = out.detach().to(torch.float32)
        if not bool(torch.isfinite(out32).all()):
            return float("inf"), f"{name}: {int((~torch.isfinite(out32)).sum())} non-finite elements"
        diff_rows, ref_rows = _token_rows(out32 - ref), _token_rows(ref)
        errors = torch.linalg.vector_norm(diff_rows, dim=1) / torch.linalg.vector_norm(ref_rows, dim=1).clamp_min(1e-30)
        error = float(errors.max()) if errors.numel() else 0.0
        worst = max(worst, error)
        if error > tolerance:
            token = int(errors.argmax())
            return worst, (f"{name}: token {token} has relative error {error:.3g} > {tolerance:g} "
                           f"({int((errors > tolerance).sum())} of {errors.numel()} tokens wrong)")
    return worst, None


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """``(tokens, heads * head_dim)``: one row per token whatever the layout's number of token dimensions."""
    n_token_dims = x.ndim - 2
    return x.flatten(n_token_dims).flatten(0, n_token_dims - 1)
