"""Deliberately wrong answers to exercise 03_strided_kernel, one per diagnosis in ``WRONG`` (the tests check each
one's diagnosis).

Each is the solution with one mistake, marked ``# MISTAKE``.

Below ``WRONG``, more mistakes whose diagnosis a variant in it already holds: the tests of the checker's words
(tests/test_course_messages.py) import them by name and check what the message says about each.
"""

import triton
import triton.language as tl


@triton.jit
def mask_off_by_one(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                    stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2 - 1  # MISTAKE: the last pair is masked off
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty),
             mask=mask)


@triton.jit
def unmasked_stores(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                    stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty))  # MISTAKE: no mask
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty))


@triton.jit
def unit_channel_stride(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                        stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs, mask=mask, other=0.0).to(tl.float32)  # MISTAKE: channels assumed adjacent
    x_b = tl.load(x_row + pairs + HEAD_DIM // 2, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty),
             mask=mask)


@triton.jit
def math_in_x_dtype(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                    stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0)  # MISTAKE: x stays in its half dtype ...
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0).to(X.dtype.element_ty)  # ... cos too
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0).to(X.dtype.element_ty)
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty),
             mask=mask)


@triton.jit
def out_with_x_strides(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                       stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_xb + token * stride_xs + head * stride_xh  # MISTAKE: x's strides address OUT
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs * stride_xd, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_xd, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty),
             mask=mask)


WRONG = {
    "unwritten": mask_off_by_one,
    "out_of_bounds": unmasked_stores,
    "out_stride": out_with_x_strides,
    "stride_ignored": unit_channel_stride,
    "half_precision_math": math_in_x_dtype,
}

# --- deliberately broken too, for the tests of the checker's words (see the module's docstring) ---------------------


@triton.jit
def out_addressed_as_contiguous(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                                stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr,
                                BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + row * HEAD_DIM  # MISTAKE: out taken as contiguous, its strides ignored
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + pairs + HEAD_DIM // 2, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def second_half_at_the_block_width(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh, stride_xd,
                                   stride_ob, stride_os, stride_oh, stride_od, HEAD_DIM: tl.constexpr,
                                   BLOCK_HALF: tl.constexpr):
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    mask = pairs < HEAD_DIM // 2
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    # MISTAKE: the second half stored BLOCK_HALF channels in, not HEAD_DIM // 2
    tl.store(out_row + (pairs + BLOCK_HALF) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)
