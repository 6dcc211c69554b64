"""Deliberately wrong answers to exercise 09_rope_cache_kernel, one per diagnosis (used by tests/test_course.py only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


@triton.jit
def turned_clockwise(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
    tl.store(out_row + lanes, q_a * cos + q_b * sin, mask=q_mask)  # MISTAKE: -θ
    tl.store(out_row + HALF + lanes, q_b * cos - q_a * sin, mask=q_mask)
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


@triton.jit
def next_position(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    position = tl.load(POS + token) + 1  # MISTAKE: the next row of the tables
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


@triton.jit
def padding_written(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
    if slot >= -1:  # MISTAKE: slot -1 (padding) is written too, to the row before the cache
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


@triton.jit
def values_half_copied(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
        # MISTAKE: the second half of each value head is never copied


@triton.jit
def slots_ignored(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
        cache_row = token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM  # MISTAKE: row `token`, not its slot
        tl.store(K_CACHE + cache_row + lanes, k_a * cos - k_b * sin, mask=kv_mask)
        tl.store(K_CACHE + cache_row + HALF + lanes, k_b * cos + k_a * sin, mask=kv_mask)
        v_row = V + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        tl.store(V_CACHE + cache_row + lanes, tl.load(v_row + lanes, mask=kv_mask), mask=kv_mask)
        tl.store(V_CACHE + cache_row + HALF + lanes, tl.load(v_row + HALF + lanes, mask=kv_mask), mask=kv_mask)



@triton.jit
def index_as_position(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    position = token  # MISTAKE: the token's index, not POS[token]
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



@triton.jit
def gptj_pairs(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
    q_a = tl.load(q_row + 2 * lanes, mask=q_mask)  # MISTAKE: GPT-J's neighbours (2i, 2i + 1), not NeoX's halves
    q_b = tl.load(q_row + 2 * lanes + 1, mask=q_mask)
    out_row = Q_OUT + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    tl.store(out_row + 2 * lanes, q_a * cos - q_b * sin, mask=q_mask)
    tl.store(out_row + 2 * lanes + 1, q_b * cos + q_a * sin, mask=q_mask)
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



@triton.jit
def row_start_without_heads(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
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
        cache_row = slot * HEAD_DIM + heads * HEAD_DIM  # MISTAKE: a slot's row holds n_heads_kv heads
        tl.store(K_CACHE + cache_row + lanes, k_a * cos - k_b * sin, mask=kv_mask)
        tl.store(K_CACHE + cache_row + HALF + lanes, k_b * cos + k_a * sin, mask=kv_mask)
        v_row = V + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        tl.store(V_CACHE + cache_row + lanes, tl.load(v_row + lanes, mask=kv_mask), mask=kv_mask)
        tl.store(V_CACHE + cache_row + HALF + lanes, tl.load(v_row + HALF + lanes, mask=kv_mask), mask=kv_mask)


WRONG = {
    "wrong_direction": turned_clockwise,
    "position_shift": next_position,
    "out_of_bounds": padding_written,
    "unwritten": values_half_copied,
    "wrong": slots_ignored,
    "wrong_positions": index_as_position,
    "other_pairing": gptj_pairs,
    "stray_rows": row_start_without_heads,
}
