import triton
import triton.language as tl


@triton.jit
def _rotate_block(X, OUT, cos, sin, batch, tokens, token_ok, first_head, n_heads, stride_b, stride_s, stride_h,
                  out_stride_b, out_stride_s, out_stride_h, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotate heads [first_head, +BLOCK_H) of the tile's tokens."""
    heads = first_head + tl.arange(0, BLOCK_H)
    HALF: tl.constexpr = HEAD_DIM // 2  # pairs per head vector: a block length, so a constexpr (notebook 02, 1.2)
    pairs = tl.arange(0, HALF)
    mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]
    x = X + batch * stride_b + tokens[:, None, None] * stride_s + heads[None, :, None] * stride_h + pairs[None, None, :]
    out = (OUT + batch * out_stride_b + tokens[:, None, None] * out_stride_s + heads[None, :, None] * out_stride_h
           + pairs[None, None, :])
    x_a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out + HALF, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rope_qk_kernel(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                   stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                   stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 4,
                   NUM_WARPS: tl.constexpr = 4):
    """Rotate q and k in one launch; token s of sequence b sits at position OFFSETS[b] + s.

    Grid: (cdiv(seq_len, BLOCK_S), cdiv(n_heads_q, BLOCK_H) + cdiv(n_heads_k, BLOCK_H), batch). Program (t, h, b)
    rotates tokens [t*BLOCK_S, +BLOCK_S) of sequence b: head block h of q while h < cdiv(n_heads_q, BLOCK_H), else
    head block h - cdiv(n_heads_q, BLOCK_H) of k. q and k: (batch, seq, heads, HEAD_DIM) with channels contiguous,
    any float dtype (compute in float32); k may have fewer heads than q. NeoX pairs (i, i + HEAD_DIM/2). COS/SIN:
    contiguous float32 tables (table_len, HEAD_DIM/2); OFFSETS: (batch,) integers. The tile is yours: the launch
    reads BLOCK_S, BLOCK_H and NUM_WARPS (the warps per program) from this signature's defaults.
    """
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    HALF: tl.constexpr = HEAD_DIM // 2  # pairs per head vector: a block length, so a constexpr (notebook 02, 1.2)
    pairs = tl.arange(0, HALF)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens  # the first new token sits right after the cache
    table = position[:, None] * HALF + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]  # shared by every head of the block
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks first, then k's
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                      stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)
