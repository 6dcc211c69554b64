"""Ladder step 7 — one program, every head of q and of k (a teaching copy of step 1 with one idea added).

Steps 2-6 added features and no speed; steps 7 and 8 add speed to step 1 (positions 0..seq-1, NeoX pairs, the whole
head, forward, int32 offsets: all the timed Llama-3-8B prefill needs), so that each stays a small diff. Here the
grid's head axis is gone: a program takes ``BLOCK_S`` tokens x *every* head of q (a ``BLOCK_H`` tile) and of k (a
``BLOCK_HK`` tile), issues all four loads before either store, and fetches its tokens' cos/sin rows once for both
tensors. Fewer, larger programs, and one table fetch where step 1 has ``heads / BLOCK_H`` of them: the production
tile's ``TILE.FUSED_QK`` switch (``ropekit.triton.v4``). The launcher sizes both tiles from the head counts; its
config gives the tokens and warps.
"""

import triton
import triton.language as tl

FEATURES = ("q+k",)
BASE = "step1_qk"  # the step this one is a copy of


@triton.jit
def _load_heads(X, batch, tokens, token_mask, n_heads, stride_b, stride_s, stride_h, HEAD_DIM: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Heads [0, BLOCK_H) of the tile's tokens as the two halves of their pairs, in fp32, and the tile's mask."""
    heads = tl.arange(0, BLOCK_H)
    x = X + batch * stride_b + tokens[:, None, None] * stride_s + heads[None, :, None] * stride_h
    pairs = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = token_mask[:, None, None] & (heads < n_heads)[None, :, None] & (pairs < HEAD_DIM // 2)
    x_a = tl.load(x + pairs, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x + pairs + HEAD_DIM // 2, mask=mask, other=0.0).to(tl.float32)
    return x_a, x_b, mask


@triton.jit
def _store_heads(OUT, x_a, x_b, cos, sin, mask, batch, tokens, stride_b, stride_s, stride_h, HEAD_DIM: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate a loaded tile by its tokens' cos/sin (shared by every head) and store it."""
    heads = tl.arange(0, BLOCK_H)
    out = OUT + batch * stride_b + tokens[:, None, None] * stride_s + heads[None, :, None] * stride_h
    pairs = tl.arange(0, BLOCK_HALF)[None, None, :]
    tl.store(out + pairs, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + pairs + HEAD_DIM // 2, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rope_step7_kernel(
    Q, K, OUT_Q, OUT_K, COS, SIN, seqlen, n_heads_q, n_heads_k,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_oqb, stride_oqs, stride_oqh,
    stride_okb, stride_oks, stride_okh, HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    """Program (t, 0, b): tokens [t*BLOCK_S, +BLOCK_S) of sequence b, every head of q and of k."""
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(2)
    token_mask = tokens < seqlen
    # every load first: q's tile, k's tile, then the table, before any store
    q_a, q_b, q_mask = _load_heads(Q, batch, tokens, token_mask, n_heads_q, stride_qb, stride_qs, stride_qh,
                                   HEAD_DIM, BLOCK_H, BLOCK_HALF)
    k_a, k_b, k_mask = _load_heads(K, batch, tokens, token_mask, n_heads_k, stride_kb, stride_ks, stride_kh,
                                   HEAD_DIM, BLOCK_HK, BLOCK_HALF)
    pairs = tl.arange(0, BLOCK_HALF)
    cs = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]  # token s is at position s: row s of the table
    cs_mask = token_mask[:, None] & (pairs < HEAD_DIM // 2)[None, :]
    cos = tl.load(COS + cs, mask=cs_mask, other=0.0)[:, None, :]  # one fetch a token, for q and k alike
    sin = tl.load(SIN + cs, mask=cs_mask, other=0.0)[:, None, :]
    _store_heads(OUT_Q, q_a, q_b, cos, sin, q_mask, batch, tokens, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM,
                 BLOCK_H, BLOCK_HALF)
    _store_heads(OUT_K, k_a, k_b, cos, sin, k_mask, batch, tokens, stride_okb, stride_oks, stride_okh, HEAD_DIM,
                 BLOCK_HK, BLOCK_HALF)


KERNEL = rope_step7_kernel
