"""Deliberately wrong answers to exercise 02_warmup_angles, one per diagnosis (used by the tests only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def positions_from_one(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pairs = tl.arange(0, BLOCK_I)
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = (positions[:, None] + 1).to(tl.float32) * inv_freq[None, :]  # MISTAKE: positions counted from 1
    inside = (positions[:, None] < n_positions) & (pairs[None, :] < n_pairs)
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)


@triton.jit
def mask_on_positions_only(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pairs = tl.arange(0, BLOCK_I)
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = positions[:, None].to(tl.float32) * inv_freq[None, :]
    inside = positions[:, None] < n_positions  # MISTAKE: lanes past n_pairs store into the next row
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)


@triton.jit
def a_column_times_a_column(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pairs = tl.arange(0, BLOCK_I)
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = positions[:, None].to(tl.float32) * inv_freq[:, None]  # MISTAKE: (BLOCK_P, 1) * (BLOCK_I, 1)
    inside = (positions[:, None] < n_positions) & (pairs[None, :] < n_pairs)
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)


@triton.jit
def positions_not_converted(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pairs = tl.arange(0, BLOCK_I)
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = positions[:, None] * inv_freq[None, :]  # MISTAKE: int32 positions: a float16 INV_FREQ gives float16 math
    inside = (positions[:, None] < n_positions) & (pairs[None, :] < n_pairs)
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)


WRONG = {"position_shift": positions_from_one, "out_of_bounds": mask_on_positions_only,
         "raised": a_column_times_a_column, "half_precision_math": positions_not_converted}
