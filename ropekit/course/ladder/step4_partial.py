"""Ladder step 4 — partial rotary (a teaching copy of step 3 with one idea added; notebook 05 shows the diff).

Some models rotate only the first ``ROTARY_DIM`` channels of each head (GPT-NeoX a quarter; Phi a fraction) and pass
the rest through. The tables are ``ROTARY_DIM/2`` wide and pairs are (i, i + ROTARY_DIM/2). Out of place, the
output's tail must be a copy of the input's (``COPY_TAIL``, ``BLOCK_TAIL`` lanes); in place it is simply not touched.
"""

import triton
import triton.language as tl

FEATURES = ("q+k", "positions", "gptj", "partial")


@triton.jit
def _rotate_heads(X, OUT, cos, sin, batch, tokens, token_mask, first_head, n_heads, stride_b, stride_s, stride_h,
                  out_stride_b, out_stride_s, out_stride_h, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
                  INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr):
    """Rotate heads [first_head, +BLOCK_H) of the tile's tokens (channels contiguous), masked to what exists."""
    heads = first_head + tl.arange(0, BLOCK_H)
    b, t, h = batch, tokens[:, None, None], heads[None, :, None]
    x = X + b * stride_b + t * stride_s + h * stride_h  # [BLOCK_S, BLOCK_H, 1] first channel of each head vector
    out = OUT + b * out_stride_b + t * out_stride_s + h * out_stride_h
    row_mask = token_mask[:, None, None] & (heads < n_heads)[None, :, None]
    pairs = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = row_mask & (pairs < ROTARY_DIM // 2)
    if INTERLEAVED:  # GPT-J: pair i is channels (2i, 2i + 1), neighbours
        first, second = 2 * pairs, 2 * pairs + 1
    else:  # NeoX: pair i is channels (i, i + ROTARY_DIM/2), the two halves
        first, second = pairs, pairs + ROTARY_DIM // 2
    x_a = tl.load(x + first, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x + second, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + first, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + second, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)
    if COPY_TAIL:  # partial rotary, out of place: channels ROTARY_DIM .. HEAD_DIM pass through unchanged
        tail = ROTARY_DIM + tl.arange(0, BLOCK_TAIL)[None, None, :]
        tail_mask = row_mask & (tail < HEAD_DIM)
        tl.store(out + tail, tl.load(x + tail, mask=tail_mask), mask=tail_mask)


@triton.jit
def rope_step4_kernel(
    Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, seqlen, n_heads_q, n_heads_k, table_len, position_offset,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_oqb, stride_oqs, stride_oqh,
    stride_okb, stride_oks, stride_okh, stride_pos_b, stride_pos_s, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    POS_MODE: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr,
):
    """Program (t, h, b): tokens [t*BLOCK_S, +BLOCK_S) of sequence b; head block h of q, or of k past q's blocks."""
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    token_mask = tokens < seqlen
    if POS_MODE == 0:  # a scalar offset: token s sits at offset + s
        position = tokens + position_offset
    elif POS_MODE == 1:  # per-sequence offsets: token s of sequence b sits at offsets[b] + s
        position = tokens + tl.load(POSITIONS + batch * stride_pos_b)
    else:  # position ids: ids[b, s]
        position = tl.load(POSITIONS + batch * stride_pos_b + tokens * stride_pos_s, mask=token_mask, other=0)
    pairs = tl.arange(0, BLOCK_HALF)
    in_table = token_mask & (position >= 0) & (position < table_len)  # never read outside the table
    cs = position[:, None] * (ROTARY_DIM // 2) + pairs[None, :]
    cs_mask = in_table[:, None] & (pairs < ROTARY_DIM // 2)[None, :]
    cos = tl.load(COS + cs, mask=cs_mask, other=float("nan"))[:, None, :]  # NaN: a position outside the table
    sin = tl.load(SIN + cs, mask=cs_mask, other=float("nan"))[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks come first on the grid's head axis
        _rotate_heads(Q, OUT_Q, cos, sin, batch, tokens, token_mask, head_block * BLOCK_H, n_heads_q, stride_qb,
                      stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, ROTARY_DIM, BLOCK_H,
                      BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, COPY_TAIL)
    else:  # then k's
        _rotate_heads(K, OUT_K, cos, sin, batch, tokens, token_mask, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, ROTARY_DIM,
                      BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, COPY_TAIL)


KERNEL = rope_step4_kernel
