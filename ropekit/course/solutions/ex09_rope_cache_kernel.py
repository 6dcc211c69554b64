import triton
import triton.language as tl


@triton.jit
def rope_cache_kernel(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program ``token`` rotates the token's query heads into Q_OUT and its key heads into the paged K_CACHE at slot
    SLOTS[token], and copies its value heads to V_CACHE at the same slot; slot -1 writes nothing to the caches.

    Q, Q_OUT: contiguous float32 (tokens, n_heads_q, HEAD_DIM); K, V: (tokens, n_heads_kv, HEAD_DIM); K_CACHE,
    V_CACHE: (num_blocks, block_size, n_heads_kv, HEAD_DIM), i.e. one row of n_heads_kv * HEAD_DIM per slot.
    POS: the token's position (int64), COS/SIN: float32 tables (table_len, HEAD_DIM/2). NeoX pairs (i, i + HEAD_DIM/2).
    BLOCK_H: a power of two >= both head counts.
    """
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    position = tl.load(POS + token)
    cos = tl.load(COS + position * HALF + lanes)
    sin = tl.load(SIN + position * HALF + lanes)
    # q: read once, rotate, write once
    q_mask = (heads < n_heads_q) & (lanes < HALF)
    q_row = Q + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    q_a = tl.load(q_row + lanes, mask=q_mask)
    q_b = tl.load(q_row + HALF + lanes, mask=q_mask)
    out_row = Q_OUT + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    tl.store(out_row + lanes, q_a * cos - q_b * sin, mask=q_mask)
    tl.store(out_row + HALF + lanes, q_b * cos + q_a * sin, mask=q_mask)
    # k and v: straight into the cache row of this token's slot (none for slot -1)
    slot = tl.load(SLOTS + token)
    if slot >= 0:
        kv_mask = (heads < n_heads_kv) & (lanes < HALF)
        k_row = K + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        k_a = tl.load(k_row + lanes, mask=kv_mask)
        k_b = tl.load(k_row + HALF + lanes, mask=kv_mask)
        cache_row = slot * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        tl.store(K_CACHE + cache_row + lanes, k_a * cos - k_b * sin, mask=kv_mask)
        tl.store(K_CACHE + cache_row + HALF + lanes, k_b * cos + k_a * sin, mask=kv_mask)
        v_row = V + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        tl.store(V_CACHE + cache_row + lanes, tl.load(v_row + lanes, mask=kv_mask), mask=kv_mask)
        tl.store(V_CACHE + cache_row + HALF + lanes, tl.load(v_row + HALF + lanes, mask=kv_mask), mask=kv_mask)
