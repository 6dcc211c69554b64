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
    # Your code: the cos/sin row of POS[token]; rotate the q heads into Q_OUT; then read SLOTS[token] and, unless
    # it is -1 (`if slot >= 0:` works on a scalar), write the rotated k heads and the unchanged v heads to that
    # slot's row of K_CACHE and V_CACHE.
