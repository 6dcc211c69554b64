"""Ladder step 1 — q and k in one launch (a teaching copy: the ladder's first rung after v3).

v3 rotates one tensor per launch, so a model's q and k take two launches, and two launches pay two launch latencies
and two tails of half-empty waves. Here the grid's head axis covers q's head blocks first and then k's: a program
compares its head-block index with the number of q blocks to know which tensor it works on. q and k may have
different head counts (GQA: Llama-3-8B has 32 q heads and 8 k heads; MQA: 1 k head). A program owns a tile of
``BLOCK_S`` tokens x ``BLOCK_H`` heads and loads its tokens' cos/sin rows once for all of them, as v3 does.
Positions are 0..seq-1; NeoX pairs; the whole head rotates; forward only; int32 offsets.
"""

import triton
import triton.language as tl

FEATURES = ("q+k",)


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
def rope_step1_kernel(
    Q, K, OUT_Q, OUT_K, COS, SIN, seqlen, n_heads_q, n_heads_k,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_oqb, stride_oqs, stride_oqh,
    stride_okb, stride_oks, stride_okh, HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Program (t, h, b): tokens [t*BLOCK_S, +BLOCK_S) of sequence b; head block h of q, or of k past q's blocks."""
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    token_mask = tokens < seqlen
    pairs = tl.arange(0, BLOCK_HALF)
    cs = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]  # token s is at position s: row s of the table
    cs_mask = token_mask[:, None] & (pairs < HEAD_DIM // 2)[None, :]
    cos = tl.load(COS + cs, mask=cs_mask, other=0.0)[:, None, :]  # [BLOCK_S, 1, BLOCK_HALF]: shared by the heads
    sin = tl.load(SIN + cs, mask=cs_mask, other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks come first on the grid's head axis
        _rotate_heads(Q, OUT_Q, cos, sin, batch, tokens, token_mask, head_block * BLOCK_H, n_heads_q, stride_qb,
                      stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H,
                      BLOCK_HALF)
    else:  # then k's
        _rotate_heads(K, OUT_K, cos, sin, batch, tokens, token_mask, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM,
                      BLOCK_H, BLOCK_HALF)


KERNEL = rope_step1_kernel
