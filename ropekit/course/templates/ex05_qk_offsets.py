import triton
import triton.language as tl


@triton.jit
def rope_qk_kernel(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                   stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                   stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 1, BLOCK_H: tl.constexpr = 1,
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
    n_q_blocks = tl.cdiv(n_heads_q, BLOCK_H)  # axis 1 holds q's head blocks first, then k's
    # Your code: the positions and their cos/sin rows [BLOCK_S, 1, HEAD_DIM/2]; then q's head block or k's, masked.
