"""Deliberately wrong answers to exercise 04_tiled_kernel, one per diagnosis (used by tests/test_course.py only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def token_mask_too_tight(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                         stride_ob, stride_os, stride_oh,
                         HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len - 1  # MISTAKE: off by one, the last token is dropped
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]
    x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
        + pairs[None, None, :]
    out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
        + pairs[None, None, :]
    x_a = tl.load(x, mask=mask, other=0.0)
    x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
    tl.store(out, x_a * cos - x_b * sin, mask=mask)
    tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


@triton.jit
def stores_without_token_mask(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                              stride_ob, stride_os, stride_oh,
                              HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]
    store_mask = (heads < n_heads)[None, :, None]  # MISTAKE: the stores forget the token mask
    x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
        + pairs[None, None, :]
    out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
        + pairs[None, None, :]
    x_a = tl.load(x, mask=mask, other=0.0)
    x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
    tl.store(out, x_a * cos - x_b * sin, mask=store_mask)
    tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=store_mask)


@triton.jit
def table_row_plus_one(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                       stride_ob, stride_os, stride_oh,
                       HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    table = (tokens[:, None] + 1) * (HEAD_DIM // 2) + pairs[None, :]  # MISTAKE: the next token's row
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]
    x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
        + pairs[None, None, :]
    out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
        + pairs[None, None, :]
    x_a = tl.load(x, mask=mask, other=0.0)
    x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
    tl.store(out, x_a * cos - x_b * sin, mask=mask)
    tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


@triton.jit
def cos_sin_per_head(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                     stride_ob, stride_os, stride_oh,
                     HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    for head in tl.static_range(BLOCK_H):
        head_ok = (tl.zeros([BLOCK_S], tl.int32) + head) < n_heads  # (a vector: the interpreter wants one)
        mask = (token_ok & head_ok)[:, None]
        # MISTAKE (speed, not values): the same cos/sin rows are loaded again for every head
        cos = tl.load(COS + table, mask=mask, other=0.0)
        sin = tl.load(SIN + table, mask=mask, other=0.0)
        x = X + batch * stride_xb + tokens[:, None] * stride_xs + head * stride_xh + pairs[None, :]
        out = OUT + batch * stride_ob + tokens[:, None] * stride_os + head * stride_oh + pairs[None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
        tl.store(out, x_a * cos - x_b * sin, mask=mask)
        tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


WRONG = {
    "unwritten": token_mask_too_tight,
    "out_of_bounds": stores_without_token_mask,
    "position_shift": table_row_plus_one,
    "cos_sin_reloaded": cos_sin_per_head,
}
