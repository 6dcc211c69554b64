"""Ladder step 2 — where each token is (a teaching copy of step 1 with one idea added; notebook 05 shows the diff).

During decode, sequence b continues a KV cache of ``offsets[b]`` tokens; some models pass explicit position ids.
``POS_MODE`` (a compile-time switch, ``ropekit.positions``) says how to find token s of sequence b: 0 a scalar offset
(``offset + s``), 1 per-sequence offsets (``offsets[b] + s``), 2 position ids (``ids[b, s]``, strides may be 0 for a
broadcast). The positions stay on the device: no host sync, so a decode step can be captured in a CUDA graph. A
position outside the table is never read (masked load); its token comes out NaN, which is loud.
"""

import triton
import triton.language as tl

FEATURES = ("q+k", "positions")


@triton.jit
def _rotate_heads(X, OUT, cos, sin, batch, tokens, token_mask, first_head, n_heads, stride_b, stride_s, stride_h,
                  out_stride_b, out_stride_s, out_stride_h, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    """Rotate heads [first_head, +BLOCK_H) of the tile's tokens (channels contiguous), masked to what exists."""
    heads = first_head + tl.arange(0, BLOCK_H)
    b, t, h = batch, tokens[:, None, None], heads[None, :, None]
    x = X + b * stride_b + t * stride_s + h * stride_h  # [BLOCK_S, BLOCK_H, 1] first channel of each head vector
    out = OUT + b * out_stride_b + t * out_stride_s + h * out_stride_h
    row_mask = token_mask[:, None, None] & (heads < n_heads)[None, :, None]
    pairs = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = row_mask & (pairs < HEAD_DIM // 2)
    first, second = pairs, pairs + HEAD_DIM // 2  # NeoX: pair i is channels (i, i + HEAD_DIM/2), the two halves
    x_a = tl.load(x + first, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x + second, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + first, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + second, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rope_step2_kernel(
    Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, seqlen, n_heads_q, n_heads_k, table_len, position_offset,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_oqb, stride_oqs, stride_oqh,
    stride_okb, stride_oks, stride_okh, stride_pos_b, stride_pos_s, HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, POS_MODE: tl.constexpr,
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
    cs = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cs_mask = in_table[:, None] & (pairs < HEAD_DIM // 2)[None, :]
    cos = tl.load(COS + cs, mask=cs_mask, other=float("nan"))[:, None, :]  # NaN: a position outside the table
    sin = tl.load(SIN + cs, mask=cs_mask, other=float("nan"))[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks come first on the grid's head axis
        _rotate_heads(Q, OUT_Q, cos, sin, batch, tokens, token_mask, head_block * BLOCK_H, n_heads_q, stride_qb,
                      stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H,
                      BLOCK_HALF)
    else:  # then k's
        _rotate_heads(K, OUT_K, cos, sin, batch, tokens, token_mask, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM,
                      BLOCK_H, BLOCK_HALF)


KERNEL = rope_step2_kernel
