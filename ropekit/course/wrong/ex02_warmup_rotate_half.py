"""Deliberately wrong answers to exercise 02_warmup_rotate_half, one per diagnosis (used by the tests only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def half_not_constexpr(X, OUT, D: tl.constexpr):
    row = tl.program_id(0)
    HALF = D // 2  # MISTAKE: an ordinary variable; tl.arange(0, HALF) refuses it
    lanes = tl.arange(0, HALF)
    first = tl.load(X + row * D + lanes)
    second = tl.load(X + row * D + HALF + lanes)
    tl.store(OUT + row * D + lanes, -second)
    tl.store(OUT + row * D + HALF + lanes, first)


@triton.jit
def negates_the_other_half(X, OUT, D: tl.constexpr):
    row = tl.program_id(0)
    HALF: tl.constexpr = D // 2
    lanes = tl.arange(0, HALF)
    first = tl.load(X + row * D + lanes)
    second = tl.load(X + row * D + HALF + lanes)
    tl.store(OUT + row * D + lanes, second)  # MISTAKE: cat(x2, -x1), a quarter turn the other way
    tl.store(OUT + row * D + HALF + lanes, -first)


@triton.jit
def first_half_only(X, OUT, D: tl.constexpr):
    row = tl.program_id(0)
    HALF: tl.constexpr = D // 2
    lanes = tl.arange(0, HALF)
    second = tl.load(X + row * D + HALF + lanes)
    tl.store(OUT + row * D + lanes, -second)  # MISTAKE: OUT's second half is never stored


WRONG = {"raised": half_not_constexpr, "wrong_direction": negates_the_other_half, "unwritten": first_half_only}
