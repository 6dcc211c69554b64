"""The inputs the checker feeds a reader's RoPE code: small, random, and laid out to expose mistakes.

A :class:`RopeCase` describes one run (shapes, dtype, pairing, direction, positions, memory layouts);
:func:`make_inputs` builds it: ``x`` and the cos/sin table inside guarded allocations (see ``buffers``), an output
buffer poisoned and surrounded by canaries, and the float64 answer from ``ropekit.reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import reference
from ..frequencies import cos_sin_table
from .buffers import CANARY, CONTIGUOUS, POISON, GuardedTensor, Layout, guarded

__all__ = ["RopeCase", "RopeInputs", "make_inputs"]

GUARD = 160  # elements of canaries before and after an output (more than any tested mask overshoot)


@dataclass(frozen=True)
class RopeCase:
    label: str  # what this case exercises, in words (shown in the checker's messages)
    batch: int
    seq: int
    heads: int
    head_dim: int
    rotary_dim: int | None = None  # None: the whole head turns
    dtype: torch.dtype = torch.float32
    base: float = 10000.0
    interleaved: bool = False  # GPT-J pairs (2i, 2i+1) instead of NeoX (i, i + rotary_dim/2)
    conjugate: bool = False  # rotate by -θ (the backward)
    offsets: tuple[int, ...] | None = None  # per-sequence start positions (decode: the KV-cache lengths)
    position_ids: tuple[tuple[int, ...], ...] | None = None  # explicit (batch, seq) positions
    x_layout: Layout = CONTIGUOUS
    out_layout: Layout | None = CONTIGUOUS  # None: the code returns a new tensor (no output buffer)
    table_len: int | None = 16  # rows of the cos/sin table given to the code; None: the code makes its own angles
    seed: int = 0

    @property
    def rot(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seq, self.heads, self.head_dim)

    def positions(self) -> torch.Tensor:
        """(batch, seq) int64 positions of the tokens."""
        if self.position_ids is not None:
            return torch.tensor(self.position_ids, dtype=torch.int64)
        return reference.token_positions(self.batch, self.seq,
                                         offsets=torch.tensor(self.offsets) if self.offsets else 0)


@dataclass
class RopeInputs:
    case: RopeCase
    x: GuardedTensor
    positions: torch.Tensor  # (batch, seq) int64, CPU
    offsets: torch.Tensor | None  # (batch,) int32 on the device, when the case has per-sequence offsets
    cos: GuardedTensor | None
    sin: GuardedTensor | None
    out: GuardedTensor | None
    expected: torch.Tensor  # float64, CPU
    inputs_before: dict[str, torch.Tensor]  # CPU copies of the input allocations, to notice stores into them


def make_inputs(case: RopeCase, device) -> RopeInputs:
    generator = torch.Generator().manual_seed(case.seed)
    values = torch.randn(case.shape, generator=generator)
    gap_values = torch.randn(case.batch * case.seq * case.heads * case.head_dim * 8 + 4 * GUARD, generator=generator)
    x = guarded(case.shape, case.x_layout, dtype=case.dtype, device=device, guard=GUARD,
                fill_view=values, fill_rest=gap_values)
    positions = case.positions()
    offsets = torch.tensor(case.offsets, dtype=torch.int32, device=device) if case.offsets else None
    cos = sin = None
    if case.table_len is not None:
        half = case.rot // 2
        cos_table, sin_table = cos_sin_table(case.table_len, case.rot, base=case.base)
        # Rows before and after the table hold NaN: a kernel reading outside the table gets a loud NaN.
        cos = guarded(cos_table.shape, dtype=torch.float32, device=device, guard=4 * half,
                      fill_view=cos_table, fill_rest=float("nan"))
        sin = guarded(sin_table.shape, dtype=torch.float32, device=device, guard=4 * half,
                      fill_view=sin_table, fill_rest=float("nan"))
    out = None
    if case.out_layout is not None:
        out = guarded(case.shape, case.out_layout, dtype=case.dtype, device=device, guard=GUARD,
                      fill_view=POISON, fill_rest=CANARY)
    expected = reference.rope(x.view, positions, base=case.base, rotary_dim=case.rot,
                              interleaved=case.interleaved, conjugate=case.conjugate)
    before = {name: t.storage.detach().cpu().clone() for name, t in (("x", x), ("cos", cos), ("sin", sin))
              if t is not None}
    return RopeInputs(case, x, positions, offsets, cos, sin, out, expected, before)
