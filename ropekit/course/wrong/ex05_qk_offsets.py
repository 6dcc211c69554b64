"""Deliberately wrong answers to exercise 05_qk_offsets, one per diagnosis (the tests check each one's diagnosis).

Each is the solution with one mistake, marked ``# MISTAKE`` (the helper that rotates a block of heads is the
solution's own).

Below ``WRONG``, more mistakes whose diagnosis a variant in it already holds: the tests of the checker's words
(tests/test_course_messages.py) import them by name and check what the message says about each.
"""

import triton
import triton.language as tl

from ..solutions.ex05_qk_offsets import _rotate_block


@triton.jit
def one_past_the_cache(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                       stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                       stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                       HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                       NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens + 1  # MISTAKE: the new tokens placed one past the cache's end
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]  # shared by every head of the block
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks first, then k's
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                          stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                          stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


@triton.jit
def k_never_rotated(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                    stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                    NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens  # the first new token sits right after the cache
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]  # shared by every head of the block
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks first, then k's
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                       stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    elif head_block < 0:  # MISTAKE: k's head blocks are launched but never rotated
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                       stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


@triton.jit
def k_head_mask_too_loose(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                          stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                          stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                          HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                          NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens  # the first new token sits right after the cache
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]  # shared by every head of the block
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks first, then k's
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                             stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:
        # MISTAKE: k's head mask assumes k fills its last head block (BLOCK_H heads, not n_heads_k)
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, BLOCK_H,
                             stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


@triton.jit
def offsets_ignored(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                    stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                    NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tokens  # MISTAKE: positions restart at 0, the KV cache's length is ignored
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]  # shared by every head of the block
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:  # q's head blocks first, then k's
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                       stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                       stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


WRONG = {
    "position_shift": one_past_the_cache,
    "unwritten": k_never_rotated,
    "out_of_bounds": k_head_mask_too_loose,
    "wrong_positions": offsets_ignored,
}

# --- deliberately broken too, for the tests of the checker's words (see the module's docstring) ---------------------


@triton.jit
def k_head_offset_missed(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                         stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                         HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                         NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                      stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:  # MISTAKE: k's first head is head_block * BLOCK_H, q's blocks not subtracted (past k's heads: masked)
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


@triton.jit
def offsets_read_at_the_head_block(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                                   stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                                   stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 4,
                                   NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    HALF: tl.constexpr = HEAD_DIM // 2
    pairs = tl.arange(0, HALF)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + head_block % 2) + tokens  # MISTAKE: a head block's id, not the sequence's
    table = position[:, None] * HALF + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                      stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_k,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)


@triton.jit
def k_masked_with_qs_head_count(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                                stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                                HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 2,
                                NUM_WARPS: tl.constexpr = 4):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    head_block = tl.program_id(1)
    batch = tl.program_id(2)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    position = tl.load(OFFSETS + batch) + tokens
    table = position[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    n_q_blocks = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if head_block < n_q_blocks:
        _rotate_block(Q, OUT_Q, cos, sin, batch, tokens, token_ok, head_block * BLOCK_H, n_heads_q,
                      stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh, HEAD_DIM, BLOCK_H)
    else:  # MISTAKE: k's head lanes masked with q's head count
        _rotate_block(K, OUT_K, cos, sin, batch, tokens, token_ok, (head_block - n_q_blocks) * BLOCK_H, n_heads_q,
                      stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh, HEAD_DIM, BLOCK_H)
