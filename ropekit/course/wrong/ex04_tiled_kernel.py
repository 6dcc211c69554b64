"""Deliberately wrong answers to exercise 04_tiled_kernel, one per diagnosis (the tests check each one's diagnosis).

Each is the solution with one mistake, marked ``# MISTAKE``. ``cos_sin_per_head`` computes the right values: it is
a performance mistake, which only a record of the loads (under the Triton interpreter) shows.

Below ``WRONG``, more mistakes whose diagnosis a variant in it already holds: the tests of the checker's words
(tests/test_course_messages.py) import them by name and check what the message says about each.
"""

import triton
import triton.language as tl


@triton.jit
def no_head_loop(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                 stride_ob, stride_os, stride_oh,
                 HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    for first_head in range(0, 1):  # MISTAKE: no loop over the heads, only the first BLOCK_H are rotated
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
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
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):  # the head loop: every step reuses the same cos/sin
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
        x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
        store_mask = (heads < n_heads)[None, :, None]  # MISTAKE: the stores forget the token mask
        tl.store(out, x_a * cos - x_b * sin, mask=store_mask)
        tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=store_mask)


@triton.jit
def table_loads_without_token_mask(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                                   stride_ob, stride_os, stride_oh,
                                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table)[:, None, :]  # MISTAKE: no token mask: the last tile reads rows past the table
    sin = tl.load(SIN + table)[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):  # the head loop: every step reuses the same cos/sin
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
        x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
        tl.store(out, x_a * cos - x_b * sin, mask=mask)
        tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


@triton.jit
def table_row_plus_one(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                       stride_ob, stride_os, stride_oh,
                       HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = (tokens[:, None] + 1) * (HEAD_DIM // 2) + pairs[None, :]  # MISTAKE: the next token's row
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):  # the head loop: every step reuses the same cos/sin
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
        x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
        tl.store(out, x_a * cos - x_b * sin, mask=mask)
        tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


@triton.jit
def no_head_broadcast(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                      stride_ob, stride_os, stride_oh,
                      HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[None, :, :]  # MISTAKE: [1, BLOCK_S, HALF]: the
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[None, :, :]  # token axis lines up with the heads
    for first_head in range(0, n_heads, BLOCK_H):  # the head loop: every step reuses the same cos/sin
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
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
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        # MISTAKE (speed, not values): the same cos/sin rows are loaded again in every step of the head loop
        cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
        sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
        x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
        tl.store(out, x_a * cos - x_b * sin, mask=mask)
        tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


WRONG = {
    "unwritten": no_head_loop,
    "out_of_bounds": stores_without_token_mask,
    "load_out_of_bounds": table_loads_without_token_mask,
    "position_shift": table_row_plus_one,
    "compile_error": no_head_broadcast,  # [1, BLOCK_S, HALF] does not broadcast against the block
    "cos_sin_reloaded": cos_sin_per_head,
}

# --- deliberately broken too, for the tests of the checker's words (see the module's docstring) ---------------------


@triton.jit
def tile_without_the_batch_offset(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                                  stride_ob, stride_os, stride_oh, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                                  BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    HALF: tl.constexpr = HEAD_DIM // 2
    pairs = tl.arange(0, HALF)
    inside = tokens < seq_len
    rows = tokens[:, None] * HALF + pairs[None, :]
    cos = tl.load(COS + rows, mask=inside[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + rows, mask=inside[:, None], other=0.0)[:, None, :]
    for first in range(0, n_heads, BLOCK_H):
        heads = first + tl.arange(0, BLOCK_H)
        mask = inside[:, None, None] & (heads < n_heads)[None, :, None]
        x = X + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh + pairs  # MISTAKE: no batch
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh + pairs
        a = tl.load(x, mask=mask)
        b = tl.load(x + HALF, mask=mask)
        tl.store(out, a * cos - b * sin, mask=mask)
        tl.store(out + HALF, b * cos + a * sin, mask=mask)
