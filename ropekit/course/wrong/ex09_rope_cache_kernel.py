"""Deliberately wrong answers to exercise 09_rope_cache_kernel, one per diagnosis in ``WRONG`` (the tests check each
one's diagnosis).

Each is the solution with one mistake, marked ``# MISTAKE``.

Below ``WRONG``, more mistakes whose diagnosis a variant in it already holds: the tests of the checker's words
(tests/test_course_messages.py) import them by name and check what the message says about each.
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

# --- deliberately broken too, for the tests of the checker's words (see the module's docstring) ---------------------


@triton.jit
def cache_stores_masked_by_the_slot(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                                    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    position = tl.load(POS + token)
    cos = tl.load(COS + position * HALF + lanes)
    sin = tl.load(SIN + position * HALF + lanes)
    q_mask = (heads < n_heads_q) & (lanes < HALF)
    q_row = Q + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    q_a = tl.load(q_row + lanes, mask=q_mask)
    q_b = tl.load(q_row + HALF + lanes, mask=q_mask)
    out_row = Q_OUT + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    tl.store(out_row + lanes, q_a * cos - q_b * sin, mask=q_mask)
    tl.store(out_row + HALF + lanes, q_b * cos + q_a * sin, mask=q_mask)
    slot = tl.load(SLOTS + token)
    # MISTAKE (on a CPU): the padding test folded into the mask, as the task's words suggest; a GPU compiles it, the
    # Triton interpreter refuses a mask built from a loaded value
    kv_mask = (heads < n_heads_kv) & (lanes < HALF) & (slot >= 0)
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
def _cache_write_with(Q, K, V, COS, SIN, POS, SLOTS, Q_OUT, K_CACHE, V_CACHE, n_heads_q, n_heads_kv,
                      HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, V_FROM_K: tl.constexpr,
                      ROW_HEADS_Q: tl.constexpr):
    """The solution with the mistake its switches plant: V_FROM_K (0: none; MISTAKE 1: k's values, 2: k rotated,
    stored in the v cache), ROW_HEADS_Q (MISTAKE: a slot's cache row taken as n_heads_q heads long)."""
    token = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    position = tl.load(POS + token)
    cos = tl.load(COS + position * HALF + lanes)
    sin = tl.load(SIN + position * HALF + lanes)
    q_mask = (heads < n_heads_q) & (lanes < HALF)
    q_row = Q + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    q_a = tl.load(q_row + lanes, mask=q_mask)
    q_b = tl.load(q_row + HALF + lanes, mask=q_mask)
    out_row = Q_OUT + token * n_heads_q * HEAD_DIM + heads * HEAD_DIM
    tl.store(out_row + lanes, q_a * cos - q_b * sin, mask=q_mask)
    tl.store(out_row + HALF + lanes, q_b * cos + q_a * sin, mask=q_mask)
    slot = tl.load(SLOTS + token)
    if slot >= 0:
        kv_mask = (heads < n_heads_kv) & (lanes < HALF)
        k_row = K + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        k_a = tl.load(k_row + lanes, mask=kv_mask)
        k_b = tl.load(k_row + HALF + lanes, mask=kv_mask)
        row_heads = n_heads_q if ROW_HEADS_Q else n_heads_kv
        cache_row = slot * row_heads * HEAD_DIM + heads * HEAD_DIM
        tl.store(K_CACHE + cache_row + lanes, k_a * cos - k_b * sin, mask=kv_mask)
        tl.store(K_CACHE + cache_row + HALF + lanes, k_b * cos + k_a * sin, mask=kv_mask)
        v_row = V + token * n_heads_kv * HEAD_DIM + heads * HEAD_DIM
        v_a = tl.load(v_row + lanes, mask=kv_mask)
        v_b = tl.load(v_row + HALF + lanes, mask=kv_mask)
        if V_FROM_K == 1:
            v_a, v_b = k_a, k_b
        if V_FROM_K == 2:
            v_a, v_b = k_a * cos - k_b * sin, k_b * cos + k_a * sin
        tl.store(V_CACHE + cache_row + lanes, v_a, mask=kv_mask)
        tl.store(V_CACHE + cache_row + HALF + lanes, v_b, mask=kv_mask)


class _Switched:
    """``_cache_write_with`` with its mistake's switches bound, launched as the exercise launches the reader's."""

    def __init__(self, **switches):
        self.switches = switches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _cache_write_with[grid](*args, **kwargs, **self.switches)


v_cache_holds_k = _Switched(V_FROM_K=1, ROW_HEADS_Q=0)  # MISTAKE: k's values stored in the v cache
v_cache_holds_k_rotated = _Switched(V_FROM_K=2, ROW_HEADS_Q=0)  # MISTAKE: k rotated stored in the v cache
cache_row_of_qs_heads = _Switched(V_FROM_K=0, ROW_HEADS_Q=1)  # MISTAKE: a slot's row n_heads_q heads long
