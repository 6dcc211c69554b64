"""Deliberately wrong answers to exercise 05_decode_kernel, one per diagnosis (used by tests/test_course.py only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def conjugate_ignored(X, COS, SIN, OUT, OFFSETS, seq_len, n_heads,
                      HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, CONJUGATE: tl.constexpr):
    row = tl.program_id(0)
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    position = tl.load(OFFSETS + batch) + token
    pairs = tl.arange(0, ROTARY_DIM // 2)
    cos = tl.load(COS + position * (ROTARY_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (ROTARY_DIM // 2) + pairs)  # MISTAKE: CONJUGATE never negates sin
    x = X + row * HEAD_DIM
    out = OUT + row * HEAD_DIM
    x_a = tl.load(x + pairs)
    x_b = tl.load(x + ROTARY_DIM // 2 + pairs)
    tl.store(out + pairs, x_a * cos - x_b * sin)
    tl.store(out + ROTARY_DIM // 2 + pairs, x_b * cos + x_a * sin)
    if ROTARY_DIM < HEAD_DIM:
        tail = ROTARY_DIM + tl.arange(0, HEAD_DIM - ROTARY_DIM)
        tl.store(out + tail, tl.load(x + tail))


@triton.jit
def one_past_the_cache(X, COS, SIN, OUT, OFFSETS, seq_len, n_heads,
                       HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, CONJUGATE: tl.constexpr):
    row = tl.program_id(0)
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    position = tl.load(OFFSETS + batch) + token + 1  # MISTAKE: the new token placed one past the cache length
    pairs = tl.arange(0, ROTARY_DIM // 2)
    cos = tl.load(COS + position * (ROTARY_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (ROTARY_DIM // 2) + pairs)
    if CONJUGATE:
        sin = -sin
    x = X + row * HEAD_DIM
    out = OUT + row * HEAD_DIM
    x_a = tl.load(x + pairs)
    x_b = tl.load(x + ROTARY_DIM // 2 + pairs)
    tl.store(out + pairs, x_a * cos - x_b * sin)
    tl.store(out + ROTARY_DIM // 2 + pairs, x_b * cos + x_a * sin)
    if ROTARY_DIM < HEAD_DIM:
        tail = ROTARY_DIM + tl.arange(0, HEAD_DIM - ROTARY_DIM)
        tl.store(out + tail, tl.load(x + tail))


@triton.jit
def whole_head_turns(X, COS, SIN, OUT, OFFSETS, seq_len, n_heads,
                     HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, CONJUGATE: tl.constexpr):
    row = tl.program_id(0)
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    position = tl.load(OFFSETS + batch) + token
    pairs = tl.arange(0, HEAD_DIM // 2)  # MISTAKE: ROTARY_DIM forgotten, every channel turns
    cos = tl.load(COS + position * (ROTARY_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (ROTARY_DIM // 2) + pairs)
    if CONJUGATE:
        sin = -sin
    x = X + row * HEAD_DIM
    out = OUT + row * HEAD_DIM
    x_a = tl.load(x + pairs)
    x_b = tl.load(x + HEAD_DIM // 2 + pairs)
    tl.store(out + pairs, x_a * cos - x_b * sin)
    tl.store(out + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)


@triton.jit
def tail_not_copied(X, COS, SIN, OUT, OFFSETS, seq_len, n_heads,
                    HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, CONJUGATE: tl.constexpr):
    row = tl.program_id(0)
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    position = tl.load(OFFSETS + batch) + token
    pairs = tl.arange(0, ROTARY_DIM // 2)
    cos = tl.load(COS + position * (ROTARY_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (ROTARY_DIM // 2) + pairs)
    if CONJUGATE:
        sin = -sin
    x = X + row * HEAD_DIM
    out = OUT + row * HEAD_DIM
    x_a = tl.load(x + pairs)
    x_b = tl.load(x + ROTARY_DIM // 2 + pairs)
    tl.store(out + pairs, x_a * cos - x_b * sin)
    tl.store(out + ROTARY_DIM // 2 + pairs, x_b * cos + x_a * sin)
    # MISTAKE: out of place, but the tail is never copied


WRONG = {
    "wrong_direction": conjugate_ignored,
    "position_shift": one_past_the_cache,
    "tail_touched": whole_head_turns,
    "unwritten": tail_not_copied,
}
