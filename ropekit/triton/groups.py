"""The compile-time groups the tile kernel (:mod:`ropekit.triton.v4`) and the fused kernels
(:mod:`ropekit.triton.fused`) share: each travels as one constexpr that device code reads by field
(``HEAD.ROTARY_DIM``), so a head vector, a position form and a tensor's types mean one thing in all three kernels."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Head", "PositionForm", "Types", "Dependency"]


class Head(NamedTuple):
    """The head vector as a tile lays it out: ROTARY_DIM rotated channels, paired (i, i + ROTARY_DIM / 2) or,
    INTERLEAVED, (2i, 2i + 1), each pair's halves in BLOCK_HALF lanes; the tail, the HEAD_DIM - ROTARY_DIM channels
    past them, in BLOCK_TAIL lanes."""

    ROTARY_DIM: int
    HEAD_DIM: int
    BLOCK_HALF: int
    BLOCK_TAIL: int
    INTERLEAVED: bool


class PositionForm(NamedTuple):
    """Where a token's angles come from: MODE, what the positions tensor holds (``ropekit.positions``; M-RoPE's
    sections too); IS_VARLEN, packed sequences (CU_SEQLENS); COS_PER_TOKEN, cos/sin rows per token instead of a
    table; ANGLES, no table: cos/sin computed from the inverse frequencies at each position, times ANGLE_SCALE (a
    float64 constant: the rope type's attention scaling); NOPE_FLOOR_SCALE > 0, a NoPE layer (Llama 4): no angles,
    cos the token's attention temperature at NOPE_ATTN_SCALE (``v4._nope_temperature``), sin 0."""

    MODE: int
    IS_VARLEN: bool
    COS_PER_TOKEN: bool
    ANGLES: bool = False
    ANGLE_SCALE: float = 1.0
    NOPE_FLOOR_SCALE: int = 0
    NOPE_ATTN_SCALE: float = 0.0


class Types(NamedTuple):
    """What the tensors allow: the math dtype, the integer type of element offsets (int32 where every view's reach
    fits), the eviction hint on activation loads and stores ("evict_first": each byte is touched once)."""

    MATH_DTYPE: object
    INDEX_DTYPE: object
    EVICT: str


class Dependency:
    """How a launch orders itself after the grid before it on its stream: the ``DEPENDENCY`` constexpr of every
    kernel (programmatic dependent launch, compute capability 9.0 and later; docs/tuning.md#grid-dependency).

    NONE: the stream's plain order (the interpreter, older GPUs, ``ROPEKIT_PDL=0``). WAIT: the launch may begin
    before the grid ahead of it has finished, and every program waits for that grid to finish, its writes visible,
    before its first load or store. RELEASE: WAIT, and each program then lets the grid after it launch early in
    turn, which waits the same way. ``ropekit.triton.model.grid_dependency`` chooses."""

    NONE, WAIT, RELEASE = 0, 1, 2
