"""The fused pre-processing kernel: per-head RMSNorm, RoPE and the KV-cache write in one launch.

One kernel, compile-time switches (no copies): ``NORM`` (QK-norm before the rotation; the weight offset, 0 or Gemma's
1, is a runtime float), ``CACHE`` (0: none, 1: a contiguous ``(batch, max_seq, heads, dim)`` cache written at
per-sequence offsets, 2: a paged ``(num_blocks, block_size, heads, dim)`` cache addressed by a slot per token, -1
skips), ``HAS_V`` (v's head vectors copied into the v cache untouched), ``FP8`` (the caches hold e4m3 bits of
``x / scale``; ``FP8_NATIVE``: converted by the GPU's instruction rather than integer arithmetic, same bits),
``WRITE_Q``/``WRITE_K`` (whether rotated q/k are stored at all: an engine may only want the cache), ``WRITE_TAIL``
(the channels past ``ROTARY_DIM`` are stored: out of place, or normalised), and ``BACKWARD`` (the vector-Jacobian
product of norm + rotation: the incoming gradient is rotated by -θ and pushed through the norm; each program adds its
partial weight gradient into ``DW``'s row for q or for k with ``DW_ATOMIC``, else stores it in a row of its own).
Pairing, partial rotary, every position form, varlen and per-token cos/sin rows are v4's switches, read through v4's
helpers (``_cos_sin``, ``_rotate``); the tile loads and stores are :mod:`ropekit.triton.fused_tiles`.

Grid: (token groups, head blocks of q then of k, batch or sequence); with ``HEADS_INNER`` the first two axes are one,
head blocks inner, so that the q programs and the (heavier) k + v programs of a token group run side by side. A group
is one block of ``BLOCK_S`` tokens, or in the backward ``TOKEN_BLOCKS`` of them (one reduction across warps and one
weight-gradient add or row a program). q's head blocks hold ``BLOCK_H`` heads and k's ``BLOCK_HK``, no more than k has.
A program reads its rows of q (or of k and the same heads of v) once and writes each output once: the byte floor of
the fused step. ``EVICT`` is the cache hint on activation loads and on stores (streaming: each byte is touched once).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import POSITION_IDS, PositionSpec
from .fused_tiles import (cache_slot, load_head, norm_weights, rsqrt_mean_square, sequence_span, store_channels,
                          store_head)
from .v4 import _cos_sin, _rotate

__all__ = ["fused_rope_kernel", "FusedConfig", "FUSED_LAUNCH_TABLE", "fused_shape_class", "fused_config",
           "forced_fused_config", "launch_fused", "native_fp8", "CACHE_NONE", "CACHE_CONTIGUOUS",
           "CACHE_PAGED"]

CACHE_NONE, CACHE_CONTIGUOUS, CACHE_PAGED = 0, 1, 2


@triton.jit
def _head_tile(OUT, G, W, KC, VC, K_SCALE, V_SCALE, x_a, x_b, x_t, v, cos_a, sin_a, cos_b, sin_b,
               batch_index, token_rows, heads, head_mask, mask, eps, weight_offset,
               cache_block, cache_row, cache_mask,
               sob, sos, soh, sod, sgb, sgs, sgh, sgd,
               skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
               ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
               INTERLEAVED: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, NORM: tl.constexpr,
               WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, HAS_V: tl.constexpr,
               FP8: tl.constexpr, FP8_NATIVE: tl.constexpr, BACKWARD: tl.constexpr, EVICT: tl.constexpr):
    """BLOCK_H heads of q or of k for the tile's tokens, loaded (``x_*``; ``v``: the same heads of v, for the v
    cache): normalise, rotate, store to the output and/or the cache (and v to the v cache); or, with BACKWARD, the
    gradient of all that. Returns the tile's per-element terms of the weight gradient (``g x r``, zero on padding
    lanes) with BACKWARD, else the loaded tile (unused)."""
    rows_out = batch_index * sob + token_rows[:, None] * sos + heads[None, :] * soh
    if NORM:
        w_a, w_b, w_t = norm_weights(W, stride_w, weight_offset, ROTARY_DIM, HEAD_DIM, BLOCK_HALF, BLOCK_TAIL,
                                     INTERLEAVED, MATH_DTYPE)
        r = rsqrt_mean_square(x_a, x_b, x_t, eps, HEAD_DIM, MATH_DTYPE)
    else:
        w_a, w_b, w_t, r = 1.0, 1.0, 1.0, 1.0  # (unread without NORM)
    if BACKWARD:
        # cos/sin arrive conjugated: the rotation's VJP turns the incoming gradient by -θ
        rows_g = batch_index * sgb + token_rows[:, None] * sgs + heads[None, :] * sgh
        g_a, g_b, g_t = load_head(G, rows_g, mask, sgd, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF,
                                  BLOCK_TAIL, INTERLEAVED, MATH_DTYPE, EVICT)
        g_a, g_b = _rotate(g_a, g_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
        # padding lanes (pairs past ROTARY_DIM / 2, rows past the tile's tokens or heads) hold NaN from the table's
        # masked loads: keep them out of the sums
        pair_valid = mask[:, :, None] & (tl.arange(0, BLOCK_HALF) < ROTARY_DIM // 2)[None, None, :]
        g_a, g_b = tl.where(pair_valid, g_a, 0.0), tl.where(pair_valid, g_b, 0.0)
        # n = x r w:  dx = r w g - x r^3 mean(g w x),  dw = sum over rows of g x r
        dot = tl.sum(g_a * w_a * x_a, 2) + tl.sum(g_b * w_b * x_b, 2) + tl.sum(g_t * w_t * x_t, 2)
        c = r * r * r * (dot / HEAD_DIM)[:, :, None]
        store_head(OUT, rows_out, mask, r * w_a * g_a - c * x_a, r * w_b * g_b - c * x_b,
                   r * w_t * g_t - c * x_t, sod, 1.0, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL,
                   INTERLEAVED, True, False, False, EVICT, False)
        terms = g_a * x_a * r, g_b * x_b * r, g_t * x_t * r
    else:
        terms = x_a, x_b, x_t
        _forward_tile(OUT, KC, VC, K_SCALE, V_SCALE, x_a, x_b, x_t, v, r, w_a, w_b, w_t, cos_a, sin_a, cos_b, sin_b,
                      heads, head_mask, mask, rows_out, cache_block, cache_row, cache_mask,
                      sod, skcb, skcs, skch, skcd, svcb, svcs, svch, svcd,
                      ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                      MATH_DTYPE, NORM, WRITE_OUT, WRITE_TAIL, CACHE, HAS_V, FP8, FP8_NATIVE, EVICT)
    return terms


@triton.jit
def _forward_tile(OUT, KC, VC, K_SCALE, V_SCALE, x_a, x_b, x_t, v, r, w_a, w_b, w_t, cos_a, sin_a, cos_b, sin_b,
                  heads, head_mask, mask, rows_out, cache_block, cache_row, cache_mask,
                  sod, skcb, skcs, skch, skcd, svcb, svcs, svch, svcd,
                  ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
                  INTERLEAVED: tl.constexpr, MATH_DTYPE: tl.constexpr, NORM: tl.constexpr, WRITE_OUT: tl.constexpr,
                  WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, HAS_V: tl.constexpr, FP8: tl.constexpr,
                  FP8_NATIVE: tl.constexpr, EVICT: tl.constexpr):
    """The forward of a loaded tile: normalise (NORM), rotate, store to the output and/or the cache, and store the
    loaded v (the same heads) into the v cache."""
    if NORM:
        x_a, x_b, x_t = x_a * r * w_a, x_b * r * w_b, x_t * r * w_t
    y_a, y_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
    if WRITE_OUT:
        store_head(OUT, rows_out, mask, y_a, y_b, x_t, sod, 1.0, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H,
                   BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, WRITE_TAIL, False, False, EVICT, False)
    if CACHE != 0:
        c_mask = cache_mask[:, None] & head_mask[None, :]
        rows_kc = cache_block[:, None] * skcb + cache_row[:, None] * skcs + heads[None, :].to(tl.int64) * skch
        k_scale = 1.0
        if FP8:
            k_scale = tl.load(K_SCALE)
        store_head(KC, rows_kc, c_mask, y_a, y_b, x_t, skcd, k_scale, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H,
                   BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, True, FP8, FP8_NATIVE, EVICT, False)
        if HAS_V:
            # v passes through: its head vectors as one "tail" of V_DIM channels
            channels = tl.arange(0, BLOCK_V)
            v_mask = c_mask[:, :, None] & (channels < V_DIM)[None, None, :]
            v_scale = 1.0
            if FP8:
                v_scale = tl.load(V_SCALE)
            rows_vc = cache_block[:, None] * svcb + cache_row[:, None] * svcs + heads[None, :].to(tl.int64) * svch
            store_channels(VC, rows_vc, channels, v, v_mask, svcd, v_scale, FP8, FP8_NATIVE, EVICT, False)


@triton.jit
def _token_block(X, OUT, G, W, V, KC, VC, K_SCALE, V_SCALE, COS, SIN, POSITIONS, SLOTS, block,
                 pid_b, first, seq_len, batch_index, seqlen, n_tokens, table_len, position_offset, cache_len,
                 block_size, first_head, n_heads, eps, weight_offset,
                 sxb, sxs, sxh, sxd, sob, sos, soh, sod, sgb, sgs, sgh, sgd, svb, svs, svh, svd,
                 skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
                 stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_slot,
                 ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
                 INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr,
                 COS_PER_TOKEN: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr,
                 NORM: tl.constexpr, WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr,
                 HAS_V: tl.constexpr, FP8: tl.constexpr, FP8_NATIVE: tl.constexpr, BACKWARD: tl.constexpr,
                 EVICT: tl.constexpr):
    """Token block ``block`` of sequence ``pid_b`` for one block of heads: its rows of x (and of v, for the v cache),
    its tokens' cos/sin rows and cache slots, then :func:`_head_tile`. Returns what ``_head_tile`` returns."""
    s_local = block * BLOCK_S + tl.arange(0, BLOCK_S)
    token_rows = first + s_local.to(INDEX_DTYPE)
    token_mask = (s_local < seq_len) & (token_rows >= 0) & (token_rows < n_tokens)
    # (varlen: whatever cu_seqlens hold, only rows of the packed tensor are touched)
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    head_mask = heads < n_heads
    mask = token_mask[:, None] & head_mask[None, :]
    # The tile's loads are issued first, v's with x's: they are in flight while the dependent chains position ->
    # table row -> cos/sin and token -> slot resolve. (v is read for every token of the tile, a skipped slot's too:
    # the store, not the load, honours -1.)
    rows_x = batch_index * sxb + token_rows[:, None] * sxs + heads[None, :] * sxh
    x_a, x_b, x_t = load_head(X, rows_x, mask, sxd, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF,
                              BLOCK_TAIL, INTERLEAVED, MATH_DTYPE, EVICT)
    v = 0.0
    if HAS_V and CACHE != 0 and not BACKWARD:
        v_channels = tl.arange(0, BLOCK_V)
        rows_v = batch_index * svb + token_rows[:, None] * svs + heads[None, :] * svh
        v = tl.load(V + rows_v[:, :, None] + v_channels[None, None, :] * svd,
                    mask=mask[:, :, None] & (v_channels < V_DIM)[None, None, :], other=0.0, eviction_policy=EVICT)
    cos_a, sin_a, cos_b, sin_b = _cos_sin(
        COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
        (stride_cos_b, stride_cos_s, stride_cos_d), (stride_pos_b, stride_pos_s),
        ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, BACKWARD, MATH_DTYPE)
    cos_a, sin_a, cos_b, sin_b = cos_a[:, None, :], sin_a[:, None, :], cos_b[:, None, :], sin_b[:, None, :]
    if CACHE != 0:
        if IS_VARLEN:
            token = token_rows
        else:
            token = pid_b.to(tl.int64) * seqlen + s_local
        cache_block, cache_row, cache_mask = cache_slot(SLOTS, token, s_local, pid_b, token_mask, cache_len,
                                                        block_size, stride_slot, CACHE)
    else:
        cache_block, cache_row, cache_mask = s_local, s_local, token_mask
    return _head_tile(OUT, G, W, KC, VC, K_SCALE, V_SCALE, x_a, x_b, x_t, v, cos_a, sin_a, cos_b, sin_b,
                      batch_index, token_rows, heads, head_mask, mask, eps, weight_offset,
                      cache_block, cache_row, cache_mask,
                      sob, sos, soh, sod, sgb, sgs, sgh, sgd,
                      skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
                      ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                      MATH_DTYPE, INDEX_DTYPE, NORM, WRITE_OUT, WRITE_TAIL, CACHE, HAS_V, FP8, FP8_NATIVE,
                      BACKWARD, EVICT)


@triton.jit
def _heads_program(X, OUT, G, W, DW, V, KC, VC, K_SCALE, V_SCALE, COS, SIN, POSITIONS, SLOTS, pid_s, dw_row,
                   pid_b, first, seq_len, batch_index, seqlen, n_tokens, table_len, position_offset, cache_len,
                   block_size, first_head, n_heads, eps, weight_offset,
                   sxb, sxs, sxh, sxd, sob, sos, soh, sod, sgb, sgs, sgh, sgd, svb, svs, svh, svd,
                   skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
                   stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_slot,
                   ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
                   BLOCK_V: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, STAGES: tl.constexpr,
                   INTERLEAVED: tl.constexpr,
                   POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr, COS_PER_TOKEN: tl.constexpr,
                   MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, NORM: tl.constexpr,
                   WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, HAS_V: tl.constexpr,
                   FP8: tl.constexpr, FP8_NATIVE: tl.constexpr, BACKWARD: tl.constexpr, DW_ATOMIC: tl.constexpr,
                   EVICT: tl.constexpr):
    """One program's work on one tensor (q, or k with v and the caches): TOKEN_BLOCKS consecutive token blocks (one
    outside the backward). With BACKWARD their weight-gradient terms are summed element by element and reduced over
    tokens and heads once (one cross-warp reduction a program, not one a tile), then stored into row ``dw_row`` of
    DW, or with DW_ATOMIC added to it."""
    if BACKWARD:
        acc_a = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
        acc_b = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
        acc_t = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_TAIL], dtype=MATH_DTYPE)
    for i in tl.range(TOKEN_BLOCKS, num_stages=STAGES):
        p_a, p_b, p_t = _token_block(
            X, OUT, G, W, V, KC, VC, K_SCALE, V_SCALE, COS, SIN, POSITIONS, SLOTS, pid_s * TOKEN_BLOCKS + i,
            pid_b, first, seq_len, batch_index, seqlen, n_tokens, table_len, position_offset, cache_len,
            block_size, first_head, n_heads, eps, weight_offset,
            sxb, sxs, sxh, sxd, sob, sos, soh, sod, sgb, sgs, sgh, sgd, svb, svs, svh, svd,
            skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
            stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_slot,
            ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
            POS_MODE, IS_VARLEN, COS_PER_TOKEN, MATH_DTYPE, INDEX_DTYPE, NORM, WRITE_OUT, WRITE_TAIL, CACHE,
            HAS_V, FP8, FP8_NATIVE, BACKWARD, EVICT)
        if BACKWARD:
            acc_a += p_a
            acc_b += p_b
            acc_t += p_t
    if BACKWARD:
        dw_a = tl.sum(tl.sum(acc_a, 1), 0)[None, None, :]
        dw_b = tl.sum(tl.sum(acc_b, 1), 0)[None, None, :]
        dw_t = tl.sum(tl.sum(acc_t, 1), 0)[None, None, :]
        origin = tl.zeros([1, 1], dtype=tl.int64) + dw_row * HEAD_DIM
        store_head(DW, origin, origin >= 0, dw_a, dw_b, dw_t, 1, 1.0, ROTARY_DIM, HEAD_DIM, 1, 1, BLOCK_HALF,
                   BLOCK_TAIL, INTERLEAVED, True, False, False, "", DW_ATOMIC)


@triton.jit
def fused_rope_kernel(
    Q, K, V, OUT_Q, OUT_K, GQ, GK, K_CACHE, V_CACHE, COS, SIN, POSITIONS, CU_SEQLENS, Q_W, K_W, DW, SLOTS,
    K_SCALE, V_SCALE,
    seqlen, n_heads_q, n_heads_k, table_len, position_offset, n_tokens, cache_len, block_size, eps, weight_offset,
    sqb, sqs, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd,
    soqb, soqs, soqh, soqd, sokb, soks, sokh, sokd,
    sgqb, sgqs, sgqh, sgqd, sgkb, sgks, sgkh, sgkd,
    skcb, skcs, skch, skcd, svcb, svcs, svch, svcd,
    stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_qw, stride_kw, stride_slot,
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    BLOCK_V: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, STAGES: tl.constexpr,
    INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr, COS_PER_TOKEN: tl.constexpr,
    HAS_K: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, NORM: tl.constexpr,
    WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr,
    HAS_V: tl.constexpr, FP8: tl.constexpr, FP8_NATIVE: tl.constexpr, BACKWARD: tl.constexpr,
    DW_ATOMIC: tl.constexpr, EVICT: tl.constexpr, HEADS_INNER: tl.constexpr,
):
    """Grid: (token-block groups, head blocks of q then of k, batch or sequence), or with HEADS_INNER (groups x head
    blocks, 1, batch or sequence), the head blocks of a group adjacent in launch order. A group is TOKEN_BLOCKS
    blocks of BLOCK_S tokens (one outside the backward). q's head blocks hold BLOCK_H heads, k's BLOCK_HK (k may
    have far fewer heads: MLA's one shared k_pe). See the module docstring."""
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    n_head_blocks = n_head_blocks_q + (n_heads_k + BLOCK_HK - 1) // BLOCK_HK  # n_heads_k is 0 without k
    n_groups = ((seqlen + BLOCK_S - 1) // BLOCK_S + TOKEN_BLOCKS - 1) // TOKEN_BLOCKS
    if HEADS_INNER:
        pid_s = tl.program_id(0) // n_head_blocks
        pid_h = tl.program_id(0) % n_head_blocks
    else:
        pid_s = tl.program_id(0)
        pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    first, seq_len, batch_index = sequence_span(CU_SEQLENS, pid_b, seqlen, IS_VARLEN, INDEX_DTYPE)
    if pid_s * TOKEN_BLOCKS * BLOCK_S >= seq_len:
        return  # varlen: this sequence is shorter than the longest one
    if DW_ATOMIC:
        dw_row = (pid_h >= n_head_blocks_q).to(tl.int32)  # one row for q's weight gradient, one for k's
    else:
        dw_row = (pid_b * n_head_blocks + pid_h) * n_groups + pid_s
    if pid_h < n_head_blocks_q:
        _heads_program(Q, OUT_Q, GQ, Q_W, DW, V, K_CACHE, V_CACHE, K_SCALE, V_SCALE, COS, SIN, POSITIONS, SLOTS,
                       pid_s, dw_row, pid_b, first, seq_len, batch_index, seqlen, n_tokens, table_len,
                       position_offset, cache_len, block_size, pid_h * BLOCK_H, n_heads_q, eps, weight_offset,
                       sqb, sqs, sqh, sqd, soqb, soqs, soqh, soqd, sgqb, sgqs, sgqh, sgqd, svb, svs, svh, svd,
                       skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_qw,
                       stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_slot,
                       ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, TOKEN_BLOCKS,
                       STAGES, INTERLEAVED, POS_MODE, IS_VARLEN, COS_PER_TOKEN, MATH_DTYPE, INDEX_DTYPE, NORM,
                       WRITE_Q, WRITE_TAIL, 0, False, False, False, BACKWARD, DW_ATOMIC, EVICT)
    elif HAS_K:
        _heads_program(K, OUT_K, GK, K_W, DW, V, K_CACHE, V_CACHE, K_SCALE, V_SCALE, COS, SIN, POSITIONS, SLOTS,
                       pid_s, dw_row, pid_b, first, seq_len, batch_index, seqlen, n_tokens, table_len,
                       position_offset, cache_len, block_size, (pid_h - n_head_blocks_q) * BLOCK_HK, n_heads_k, eps,
                       weight_offset,
                       skb, sks, skh, skd, sokb, soks, sokh, sokd, sgkb, sgks, sgkh, sgkd, svb, svs, svh, svd,
                       skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_kw,
                       stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, stride_slot,
                       ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL, BLOCK_V,
                       TOKEN_BLOCKS, STAGES, INTERLEAVED, POS_MODE, IS_VARLEN, COS_PER_TOKEN, MATH_DTYPE,
                       INDEX_DTYPE, NORM, WRITE_K, WRITE_TAIL, CACHE, HAS_V, FP8, FP8_NATIVE, BACKWARD, DW_ATOMIC,
                       EVICT)


class FusedConfig(NamedTuple):
    block_s: int  # tokens per program
    block_h: int  # heads per program (of q, or of k and v)
    num_warps: int
    evict_first: bool = False  # the streaming hint on activation loads and on every store
    heads_inner: bool = False  # launch order: the head blocks of one token block next to each other
    token_blocks: int = 1  # backward: token blocks a program walks, its weight-gradient terms summed in registers
    stages: int = 1  # backward: software-pipeline stages of that walk (>1: the next block's loads start early)


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The launch table, one entry a shape class (:func:`fused_shape_class`): block sizes for the fused kernel, chosen by the
# sweep ``python -m ropekit.bench.fused_tune`` (prefill-wide is not swept yet); the alternatives and their numbers live
# in docs/tuning.md#fused-launch-table. ``block_h`` is a ceiling: a program never takes more heads than the call has
# (rounded up to a power of two).
FUSED_LAUNCH_TABLE: dict = {
    "decode": FusedConfig(1, 8, 4),  # few tokens: one token a program, so that the grid covers the GPU
    "decode-fp8": FusedConfig(1, 4, 4),
    "decode-wide": FusedConfig(1, 32, 4),  # vectors wider than 128 channels (MLA's latent): more heads a program
    # prefill: the streaming hint and the heads-inner launch order on (see docs/tuning.md#fused-launch-table)
    "prefill": FusedConfig(2, 8, 4, evict_first=True, heads_inner=True),
    "prefill-norm": FusedConfig(4, 8, 4, evict_first=True, heads_inner=True),  # the norm holds more per program
    "prefill-fp8": FusedConfig(2, 8, 4, evict_first=True, heads_inner=True),
    "prefill-wide": FusedConfig(2, 8, 8),  # fewer tokens a program bound the registers a thread holds
    # the backward: one token x 8 heads a step, 16 steps a program (one weight-gradient reduction per 16 tokens),
    # the walk software-pipelined three deep
    "backward": FusedConfig(1, 8, 4, evict_first=True, heads_inner=True, token_blocks=16, stages=3),
}

_forced_fused: FusedConfig | None = None


@contextlib.contextmanager
def forced_fused_config(config: FusedConfig | None):
    """Every fused launch inside the block that is not given ``config=`` uses ``config`` instead of the launch table
    (None: the table), whichever public op reaches it (:mod:`ropekit.fused`, autograd). For tools that measure
    launch configurations through the public API (``ropekit.bench.fused_tune``); the same pattern as v4's
    ``ropekit.triton.launch.forced_config``."""
    global _forced_fused
    saved, _forced_fused = _forced_fused, config
    try:
        yield
    finally:
        _forced_fused = saved


def fused_shape_class(n_tokens: int, width: int, fp8: bool = False, norm: bool = False,
                      backward: bool = False) -> str:
    """The launch table's key for a call: "backward" for the QK-norm + RoPE backward (its own class: it reads twice
    what it writes, and reduces the weight gradient); else "decode" (at most 128 tokens) or "prefill", "-wide" when
    a program holds head vectors wider than 128 channels (``width``: k's or v's), else "-fp8" for a float8 cache,
    else "-norm" for a prefill with QK-norm (decode has one class: its programs are one token either way)."""
    if backward:
        return "backward"
    kind = "decode" if n_tokens <= 128 else "prefill"
    if width > 128:
        return kind + "-wide"
    if fp8:
        return kind + "-fp8"
    return kind + "-norm" if norm and kind == "prefill" else kind


def fused_config(n_tokens: int, n_heads: int, width: int, fp8: bool = False, norm: bool = False,
                 backward: bool = False) -> FusedConfig:
    """Block sizes for a call: :data:`FUSED_LAUNCH_TABLE` at the call's :func:`fused_shape_class`, heads a program
    capped at the call's (power-of-two) head count; inside :func:`forced_fused_config`, the forced configuration.
    Under the interpreter every program costs Python time: tiles as large as the shape allows."""
    if _forced_fused is not None:
        return _forced_fused
    heads = _next_pow2(n_heads)
    if _device.INTERPRET:
        return FusedConfig(min(_next_pow2(n_tokens), 16), min(heads, 8), 4)
    entry = FUSED_LAUNCH_TABLE[fused_shape_class(n_tokens, width, fp8, norm, backward)]
    return entry._replace(block_h=min(heads, entry.block_h))


def native_fp8(device) -> bool:
    """Whether the kernel converts to e4m3 with the GPU's own instruction (compute capability 8.9 and later: a
    saturating round-to-nearest-even conversion, two values an instruction) rather than with integer arithmetic
    on the float32 bits (the interpreter, older GPUs). Both give the same bits."""
    device = torch.device(device)
    return not _device.INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _reach_fits_int32(*tensors) -> bool:
    """Whether every element offset of these views (from their own data pointers) stays below 2**31."""
    return all(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0) < 2**31
               for t in tensors if t is not None)


def _strides(t, n: int = 4) -> tuple:
    return tuple(t.stride()) if t is not None else (1,) * n


_MATH = {torch.float64: tl.float64}


def _position_strides(spec: PositionSpec) -> tuple:
    """The (sequence, token) strides ``_cos_sin`` walks the positions with: per-sequence offsets ``(batch,)`` step by
    sequence, 1-D position ids (varlen) by packed token, 2-D ids by both; (1, 1) without a tensor (not read)."""
    t = spec.tensor
    if t is None:
        return 1, 1
    if t.ndim == 2:
        return t.stride(0), t.stride(1)
    return (0, t.stride(0)) if spec.mode == POSITION_IDS else (t.stride(0), 1)


def launch_fused(q, k, cos, sin, *, positions: PositionSpec, rotary_dim: int, interleaved: bool = False,
                 cos_per_token: bool = False, out_q=None, out_k=None, v=None, k_cache=None, v_cache=None,
                 cache_mode: int = CACHE_NONE, slots=None, block_size: int = 1, cache_len: int = 0,
                 k_scale=None, v_scale=None, q_weight=None, k_weight=None, eps: float = 0.0,
                 weight_offset: float = 0.0, grad_q=None, grad_k=None, config: FusedConfig | None = None):
    """Launch the fused kernel on validated arguments (``ropekit.fused`` validates; this trusts its caller).

    q, k, v, the outputs and the incoming gradients are ``(batch, seq, heads, dim)`` views with any strides, or
    ``(tokens, heads, dim)`` when ``positions.is_varlen``; caches are ``(blocks or batch, rows, heads, dim)`` views
    (float8 caches as their uint8 bits). An output that is its input is written in place. ``out_q``/``out_k`` None:
    not written. With ``grad_q`` (BACKWARD) the outputs receive the input gradients and the call returns the weight
    gradients ``(dw_q, dw_k)`` in the math dtype; otherwise None. The programs add their weight-gradient terms
    into two rows with atomic adds (no second reduction kernel; the float sum's rounding depends on the order the
    adds arrive in), or, under ``torch.use_deterministic_algorithms``, each program stores its own row and one
    reduction in a fixed order sums them.
    """
    backward = grad_q is not None
    if positions.is_varlen:
        q, k, v, out_q, out_k, grad_q, grad_k = (None if t is None else t.unsqueeze(0)
                                                  for t in (q, k, v, out_q, out_k, grad_q, grad_k))
        n_batch, seqlen, n_tokens = positions.cu_seqlens.shape[0] - 1, positions.max_seqlen, q.shape[1]
        if cos_per_token:
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    else:
        n_batch, seqlen = q.shape[0], q.shape[1]
        n_tokens = n_batch * seqlen
    head_dim, n_heads_q = q.shape[-1], q.shape[2]
    n_heads_k = k.shape[2] if k is not None else 0
    fp8 = k_cache is not None and k_cache.dtype == torch.uint8
    if config is None:
        config = fused_config(n_batch * seqlen, max(n_heads_q, n_heads_k),
                              max(head_dim, v.shape[-1] if v is not None else 0), fp8=fp8,
                              norm=q_weight is not None or k_weight is not None, backward=backward)
    block_hk = min(config.block_h, _next_pow2(n_heads_k))
    token_blocks = config.token_blocks if backward else 1
    n_blocks_q = _cdiv(n_heads_q, config.block_h)
    n_blocks_s = _cdiv(_cdiv(seqlen, config.block_s), token_blocks)
    n_blocks_h = n_blocks_q + _cdiv(n_heads_k, block_hk)
    grid = (n_blocks_s * n_blocks_h, 1, n_batch) if config.heads_inner else (n_blocks_s, n_blocks_h, n_batch)
    dw = None
    dw_atomic = backward and not torch.are_deterministic_algorithms_enabled()
    if backward:
        dw_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        if dw_atomic:
            dw = torch.zeros((2, head_dim), dtype=dw_dtype, device=q.device)
        else:
            # every program writes its row, except varlen programs past their sequence's end
            empty = torch.zeros if positions.is_varlen else torch.empty
            dw = empty((n_batch, n_blocks_h, n_blocks_s, head_dim), dtype=dw_dtype, device=q.device)
    if grid[0] == 0 or n_batch == 0 or n_tokens == 0:
        return None if dw is None else (dw.new_zeros(head_dim), dw.new_zeros(head_dim))
    if cos_per_token:
        cos_strides, table_len = (0 if positions.is_varlen else cos.stride(0), cos.stride(1), cos.stride(2)), 1
    else:
        cos_strides, table_len = (1, cos.stride(0), cos.stride(1)), cos.shape[0]
    pos = positions.tensor
    pos_strides = _position_strides(positions)
    norm = q_weight is not None
    write_q, write_k = out_q is not None, out_k is not None
    in_place = (write_q and out_q.data_ptr() == q.data_ptr()) or (write_k and out_k.data_ptr() == k.data_ptr())
    k_args = k if k is not None else q
    pointers = (q, k_args, v, out_q, out_k, grad_q, grad_k, k_cache, v_cache, cos, sin, pos, positions.cu_seqlens,
                q_weight, k_weight, dw, slots, k_scale, v_scale)
    ints = (seqlen, n_heads_q, n_heads_k, table_len, positions.offset, n_tokens, cache_len, block_size, eps,
            weight_offset, *_strides(q), *_strides(k_args), *_strides(v), *_strides(out_q), *_strides(out_k),
            *_strides(grad_q), *_strides(grad_k), *_strides(k_cache), *_strides(v_cache), *cos_strides,
            *pos_strides, *_strides(q_weight, 1), *_strides(k_weight, 1), *_strides(slots, 1))
    v_dim = v.shape[-1] if v is not None else 1
    constexprs = dict(
        ROTARY_DIM=rotary_dim, HEAD_DIM=head_dim, V_DIM=v_dim, BLOCK_S=config.block_s, BLOCK_H=config.block_h,
        BLOCK_HK=block_hk, BLOCK_HALF=_next_pow2(rotary_dim // 2), BLOCK_TAIL=_next_pow2(max(head_dim - rotary_dim, 1)),
        BLOCK_V=_next_pow2(v_dim), TOKEN_BLOCKS=token_blocks,
        STAGES=config.stages if backward else 1, INTERLEAVED=interleaved, POS_MODE=positions.mode,
        IS_VARLEN=positions.is_varlen, COS_PER_TOKEN=cos_per_token, HAS_K=k is not None,
        MATH_DTYPE=_MATH.get(q.dtype, tl.float32),
        INDEX_DTYPE=tl.int32 if _reach_fits_int32(q, k, v, out_q, out_k, grad_q, grad_k, cos, sin, pos)
        else tl.int64,
        NORM=norm, WRITE_Q=write_q, WRITE_K=write_k, WRITE_TAIL=backward or norm or not in_place, CACHE=cache_mode,
        HAS_V=v is not None, FP8=fp8, FP8_NATIVE=fp8 and native_fp8(q.device), BACKWARD=backward, DW_ATOMIC=dw_atomic,
        EVICT="evict_first" if config.evict_first else "", HEADS_INNER=config.heads_inner)
    if _device.INTERPRET:
        with _device.INTERPRETER_LOCK:
            fused_rope_kernel[grid](*pointers, *ints, **constexprs, num_warps=config.num_warps)
    else:
        fused_rope_kernel[grid](*pointers, *ints, **constexprs, num_warps=config.num_warps)
    if dw is None:
        return None
    if dw_atomic:
        return dw[0], dw[1]
    return dw[:, :n_blocks_q].sum((0, 1, 2)), dw[:, n_blocks_q:].sum((0, 1, 2))
