"""Deliberately wrong answers to exercise 02_row_kernel, one per diagnosis (used by tests/test_course.py only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def minus_theta(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos + x_b * sin)  # MISTAKE: signs of the sin terms swapped
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos - x_a * sin)


@triton.jit
def second_channel_sign(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos - x_a * sin)  # MISTAKE: - a sin, not + a sin


@triton.jit
def neighbour_pairs(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + 2 * pairs)  # MISTAKE: GPT-J's pairs (2i, 2i+1)
    x_b = tl.load(X + row * HEAD_DIM + 2 * pairs + 1)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + 2 * pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + 2 * pairs + 1, x_b * cos + x_a * sin)


@triton.jit
def next_position(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len + 1  # MISTAKE: positions counted from 1
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)


@triton.jit
def first_half_only(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    # MISTAKE: the second half is never stored


@triton.jit
def position_without_modulo(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = row // n_heads  # MISTAKE: the token's index in the whole batch, not in its sequence
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)


@triton.jit
def half_not_constexpr(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    H = HEAD_DIM // 2  # MISTAKE: a runtime value; tl.arange needs `H: tl.constexpr = HEAD_DIM // 2`
    pairs = tl.arange(0, H)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + H + pairs)
    cos = tl.load(COS + position * H + pairs)
    sin = tl.load(SIN + position * H + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + H + pairs, x_b * cos + x_a * sin)


@triton.jit
def position_from_the_row(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = row % seq_len  # MISTAKE: the row index, not the row's token: heads of one token differ
    pairs = tl.arange(0, HEAD_DIM // 2)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)


WRONG = {
    "broadcast": position_from_the_row,
    "wrong_direction": minus_theta,
    "sign_in_one_channel": second_channel_sign,
    "other_pairing": neighbour_pairs,
    "position_shift": next_position,
    "unwritten": first_half_only,
    "wrong_positions": position_without_modulo,
    "compile_error": half_not_constexpr,
}
