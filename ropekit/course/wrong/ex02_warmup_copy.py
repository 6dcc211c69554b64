"""Deliberately wrong answers to exercise 02_warmup_copy, one per diagnosis (used by the tests only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def store_unmasked(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=inside))  # MISTAKE: the store has no mask


@triton.jit
def every_program_copies_block_zero(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)  # MISTAKE: the program's own block (pid * BLOCK) is never added
    inside = offsets < n
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=inside), mask=inside)


@triton.jit
def load_unmasked(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    tl.store(DST + offsets, tl.load(SRC + offsets), mask=inside)  # MISTAKE: the load has no mask


WRONG = {"out_of_bounds": store_unmasked, "unwritten": every_program_copies_block_zero,
         "load_out_of_bounds": load_unmasked}
