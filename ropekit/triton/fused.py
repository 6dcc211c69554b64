"""The fused pre-processing kernels and their launcher: RMSNorm (per head, or across a token's heads), RoPE and the
KV-cache write in one launch (the forward), and the vector-Jacobian product of QK-norm + RoPE with the weight
gradients (the backward).

Two kernels, one algorithm each, as in Triton's layer-norm tutorial:

* :func:`fused_forward_kernel` normalises (``NORM = (place, weighted, over_heads)``: an RMSNorm of each head vector
  before the rotation, Qwen3's and Gemma 3's QK-norm, or after it, Llama 4's; with weights or without; the weight
  offset, 0 or Gemma's 1, is a runtime float; or of all heads of a token together, OLMo-2's, a program then holding
  every head of its tokens), rotates, stores the outputs (``WRITE_Q``/``WRITE_K``: an engine may only want the
  cache; ``WRITE_TAIL``: the channels past ``ROTARY_DIM`` too, out of place or normalised) and writes k and v into
  a cache (``CACHE`` 0: none, 1: a contiguous ``(batch, max_seq, heads, dim)`` cache at per-sequence offsets, 2: a paged
  ``(num_blocks, block_size, heads, dim)`` cache addressed by a slot per token, -1 skips, 3: the same cache addressed
  through a page table, a request and a position per token; the address map is ``fused_tiles.cache_slot``, and
  where the head axis lies is the cache's strides; ``HAS_V``: v's head vectors copied untouched; ``QUANT``: the
  quantising store, a constexpr tuple (format: the cache's dtype, float8 e4m3 or e5m2, int8, NVFP4; scales: per
  tensor, per kv head, or per (token, head) computed from the rotated head vector and written beside the cache, or
  NVFP4's e4m3 scale per 16 channels written beside it over a global scale; the GPU's float8 conversion instruction
  or integer arithmetic, the same bits), see :mod:`ropekit.triton.fused_tiles`).
* :func:`fused_backward_kernel` turns the incoming gradient by -θ and pushes it through the norm (a norm after the
  rotation: through the norm, then by -θ); each program sums its weight-gradient terms over ``TOKEN_BLOCKS`` token
  blocks, then adds them into ``DW``'s row for q or for k (``DW_ATOMIC``) or stores them in a row of its own.

Pairing, partial rotary, every position form, varlen and per-token cos/sin rows are v4's switches, read through v4's
helpers (``_cos_sin``, ``_rotate``); the tile loads and stores are :mod:`ropekit.triton.fused_tiles`.

Grid: (token groups, head blocks of q then of k, batch or sequence); with ``HEADS_INNER`` the first two axes are one,
head blocks inner, so that the q programs and the (heavier) k + v programs of a token group run side by side. A group
is one block of ``BLOCK_S`` tokens, or in the backward ``TOKEN_BLOCKS`` of them. q's head blocks hold ``BLOCK_H``
heads and k's ``BLOCK_HK``, no more than k has. A program reads its rows of q (or of k and the same heads of v) once
and writes each output once: the byte floor of the fused step. ``EVICT`` is the cache hint on activation loads and on
stores (streaming: each byte is touched once).

The host side: :func:`fused_config_for` is the launch choice, :func:`plan_fused` makes a plan (a
:class:`~ropekit.triton.launch.KernelLaunch`, or a :class:`FusedBackward` around one) once per call signature, and
the ops' front doors (``ropekit.fused``) keep it in :data:`ropekit.triton.launch.plans`.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import PositionSpec
from . import choice
from .configs import FusedConfig, FusedShape, cdiv, next_pow2
from .fused_tiles import BEFORE, E4M3, E5M2, NO_NORM, NO_QUANT, NORM_AFTER_C, NORM_BEFORE_C, NORM_NONE_C, \
    PER_HEAD, PER_TENSOR, PLAIN, STORE_PLAIN, cache_slot, channels_scale, group_sum, head_scale, load_head, \
    norm_switch, norm_weights, normed, rsqrt_mean_square, sequence_span, store_channels, store_head
from .launch import KernelLaunch, _position_strides, launching_directly, plans
from .v4 import _cos_sin, _rotate

__all__ = ["fused_forward_kernel", "fused_backward_kernel", "FusedConfig", "FusedShape", "fused_config_for",
           "forced_fused_config", "plan_fused", "FusedBackward",
           "launch_fused", "native_fp8", "CACHE_NONE", "CACHE_CONTIGUOUS", "CACHE_PAGED",
           "CACHE_PAGE_TABLE"]

# the cache address maps (fused_tiles.cache_slot): none, contiguous at per-sequence offsets, a slot per token, a page
# table with a request and a position per token
CACHE_NONE, CACHE_CONTIGUOUS, CACHE_PAGED, CACHE_PAGE_TABLE = 0, 1, 2, 3


# --------------------------------------------------------------------------------------------------------------------
# Device code shared by both kernels.
# --------------------------------------------------------------------------------------------------------------------

@triton.jit
def _token_block(first, seq_len, block, n_tokens, BLOCK_S: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """Token block ``block`` of a sequence that starts at row ``first``: each token's index in its sequence, its row,
    and whether it exists (varlen: whatever cu_seqlens hold, only rows of the packed tensor are touched)."""
    s_local = block * BLOCK_S + tl.arange(0, BLOCK_S)
    token_rows = first + s_local.to(INDEX_DTYPE)
    token_mask = (s_local < seq_len) & (token_rows >= 0) & (token_rows < n_tokens)
    return s_local, token_rows, token_mask


@triton.jit
def _rows(strides, outer, token_rows, heads):
    """Where each (token, head) vector of a tile starts: ``outer`` (a batch index, or a [BLOCK_S, 1] column of cache
    blocks) times the first stride, plus the token's row and the head by the next two."""
    return outer * strides[0] + token_rows[:, None] * strides[1] + heads[None, :] * strides[2]


# --------------------------------------------------------------------------------------------------------------------
# The forward.
# --------------------------------------------------------------------------------------------------------------------

@triton.jit
def _forward_heads(
    # the tensor (q, or k) and its output
    X, OUT, x_strides, out_strides,
    # the cache side (k's programs only): v, the caches, the slots, the page table
    V, K_CACHE, V_CACHE, SLOTS, v_strides, k_cache_strides, v_cache_strides, slot_stride,
    BATCH_INDICES, KV_INDICES, KV_INDPTR, page_table,
    # the caches' scales (QUANT), k's and v's, NVFP4's global scales, and the scales' (block, row, head) strides; the
    # output's scale (OUT_QUANT)
    K_SCALE, V_SCALE, K_GLOBAL, V_GLOBAL, scale_strides, OUT_SCALE,
    # the norm's weight
    W, w_stride, eps, weight_offset,
    # the angles and the positions
    COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
    # this program's tokens and heads
    pid_s, pid_b, first, seq_len, batch_index, first_head, n_heads, sizes,
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
    INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr, COS_PER_TOKEN: tl.constexpr,
    NORM: tl.constexpr, WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr,
    HAS_V: tl.constexpr, QUANT: tl.constexpr, OUT_QUANT: tl.constexpr, MATH_DTYPE: tl.constexpr,
    INDEX_DTYPE: tl.constexpr, EVICT: tl.constexpr,
):
    """BLOCK_S tokens x BLOCK_H heads of q, or of k with the same heads of v: normalise, rotate, store to the output
    and/or the cache (and v to the v cache)."""
    seqlen, table_len, n_tokens, cache_len, block_size = sizes[0], sizes[3], sizes[4], sizes[5], sizes[6]
    s_local, token_rows, token_mask = _token_block(first, seq_len, pid_s, n_tokens, BLOCK_S, INDEX_DTYPE)
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    head_mask = heads < n_heads
    mask = token_mask[:, None] & head_mask[None, :]
    # The tile's loads are issued first, v's with x's: they are in flight while the dependent chains position ->
    # table row -> cos/sin and token -> slot resolve. (v is read for every token of the tile, a skipped slot's too:
    # the store, not the load, honours -1.)
    x_a, x_b, x_t = load_head(X, _rows(x_strides, batch_index, token_rows, heads), mask, x_strides[3], ROTARY_DIM,
                              HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, MATH_DTYPE, EVICT)
    if HAS_V:
        v_channels = tl.arange(0, BLOCK_V)
        rows_v = _rows(v_strides, batch_index, token_rows, heads)
        v = tl.load(V + rows_v[:, :, None] + v_channels[None, None, :] * v_strides[3],
                    mask=mask[:, :, None] & (v_channels < V_DIM)[None, None, :], other=0.0, eviction_policy=EVICT)
    cos_a, sin_a, cos_b, sin_b = _cos_sin(
        COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
        cos_strides, position_strides, ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, False,
        MATH_DTYPE)
    cos_a, sin_a, cos_b, sin_b = cos_a[:, None, :], sin_a[:, None, :], cos_b[:, None, :], sin_b[:, None, :]
    if CACHE != 0:
        token = token_rows if IS_VARLEN else pid_b.to(tl.int64) * seqlen + s_local
        cache_block, cache_row, cache_mask = cache_slot(SLOTS, BATCH_INDICES, KV_INDICES, KV_INDPTR, slot_stride,
                                                        page_table, token, s_local, pid_b, token_mask, cache_len,
                                                        block_size, CACHE)
    if NORM[0] != NORM_NONE_C:
        w_a, w_b, w_t = norm_weights(W, w_stride, heads, head_mask, weight_offset, NORM, ROTARY_DIM, HEAD_DIM,
                                     BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, MATH_DTYPE)
    if NORM[0] == NORM_BEFORE_C:
        x_a, x_b, x_t, r = normed(x_a, x_b, x_t, w_a, w_b, w_t, eps, n_heads, NORM, ROTARY_DIM, HEAD_DIM, BLOCK_HALF,
                                  MATH_DTYPE)
    y_a, y_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
    if NORM[0] == NORM_AFTER_C:
        y_a, y_b, x_t, r = normed(y_a, y_b, x_t, w_a, w_b, w_t, eps, n_heads, NORM, ROTARY_DIM, HEAD_DIM, BLOCK_HALF,
                                  MATH_DTYPE)
    if WRITE_OUT:
        # the output in its dtype, or (OUT_QUANT: a float8 q for float8 attention) at one scale
        out_scale = head_scale((OUT_SCALE, OUT_SCALE, scale_strides[0]), None, None, heads, mask, y_a, y_b, x_t,
                               ROTARY_DIM, HEAD_DIM, BLOCK_HALF, BLOCK_TAIL, OUT_QUANT)
        store_head(OUT, _rows(out_strides, batch_index, token_rows, heads), mask, y_a, y_b, x_t, out_strides[3],
                   out_scale, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, WRITE_TAIL,
                   OUT_QUANT, EVICT, False)
    if CACHE != 0:
        c_mask = cache_mask[:, None] & head_mask[None, :]
        c_heads = heads.to(tl.int64)
        # the quantising store's scale: read, or (PER_TOKEN_HEAD) the head vector's absolute maximum over the
        # format's largest value, from the rotated values already in registers, and written beside the cache (NVFP4:
        # the global scale, and where the block scales the store computes go)
        k_scale = head_scale((K_SCALE, K_GLOBAL, scale_strides[0]), cache_block, cache_row, c_heads, c_mask, y_a,
                             y_b, x_t, ROTARY_DIM, HEAD_DIM, BLOCK_HALF, BLOCK_TAIL, QUANT)
        store_head(K_CACHE, _rows(k_cache_strides, cache_block[:, None], cache_row, c_heads), c_mask,
                   y_a, y_b, x_t, k_cache_strides[3], k_scale, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF,
                   BLOCK_TAIL, INTERLEAVED, True, QUANT, EVICT, False)
        if HAS_V:
            # v passes through: its head vectors as one "tail" of V_DIM channels
            v_channel_mask = (v_channels < V_DIM)[None, None, :]
            v_mask = c_mask[:, :, None] & v_channel_mask
            v_scale = channels_scale((V_SCALE, V_GLOBAL, scale_strides[1]), cache_block, cache_row, c_heads, c_mask,
                                     v, v_channel_mask, QUANT)
            rows_vc = _rows(v_cache_strides, cache_block[:, None], cache_row, c_heads)
            store_channels(V_CACHE, rows_vc, v_channels, v, v_mask, v_cache_strides[3], v_scale, QUANT, EVICT,
                           False)


@triton.jit
def fused_forward_kernel(
    # q and k: (batch, seq, heads, HEAD_DIM) views, or one packed (1, tokens, heads, HEAD_DIM) with IS_VARLEN, and
    # their outputs (stored with WRITE_Q / WRITE_K; an output that is its input is written in place). Strides are
    # (batch, seq, head, channel) tuples.
    Q, K, OUT_Q, OUT_K, q_strides, k_strides, out_q_strides, out_k_strides,
    # the cache side, read and written by k's programs (CACHE): v (HAS_V: k's tokens and heads, V_DIM channels), the
    # caches (float8 ones as uint8 bits), SLOTS (paged: a slot per token; contiguous: an offset per sequence; a page
    # table: a position per token). Cache strides: (block or sequence, row, head, channel), whichever of NHD and HND
    # the cache is stored in.
    V, K_CACHE, V_CACHE, SLOTS, v_strides, k_cache_strides, v_cache_strides, slot_stride,
    # the page table (CACHE 3, FlashInfer's): each token's request (-1: none) and the requests' pages, read by
    # fused_tiles.cache_slot; page_table: (BATCH_INDICES', KV_INDICES' and KV_INDPTR's strides, KV_INDICES' length,
    # the number of requests)
    BATCH_INDICES, KV_INDICES, KV_INDPTR, page_table,
    # the quantising stores (QUANT = (format, scales, native conversion); fused_tiles): k's and v's cache scales,
    # float32 read or (per token and head) written, or NVFP4's e4m3 block scales written beside the cache over the
    # float32 global scales K_GLOBAL, V_GLOBAL; their (block or sequence, row, head) strides, k's then v's; q's output
    # scale (OUT_QUANT: a float8 q at one float32 scale)
    K_SCALE, V_SCALE, K_GLOBAL, V_GLOBAL, scale_strides, Q_SCALE,
    # the QK-norm (NORM = (place, weighted, over_heads), fused_tiles: none, before or after the rotation; with or
    # without the weights, (HEAD_DIM,) or over all heads (n_heads * HEAD_DIM,)): the weights and their strides (q's,
    # k's), eps, the weight offset
    Q_W, K_W, weight_strides, eps, weight_offset,
    # the angles: a (table_len, ROTARY_DIM / 2) float32 table, or COS_PER_TOKEN rows; (sequence, row, column)
    COS, SIN, cos_strides,
    # positions: POS_MODE says what POSITIONS holds (position_strides: (sequence, token)); CU_SEQLENS the packed
    # sequences' starts
    POSITIONS, position_strides, CU_SEQLENS, position_offset,
    # (seqlen, n_heads_q, n_heads_k, table_len, n_tokens, cache_len, block_size)
    sizes,
    # the head vector and the tile
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    BLOCK_V: tl.constexpr, HEADS_INNER: tl.constexpr,
    # what the call asks for
    HAS_K: tl.constexpr, INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr,
    COS_PER_TOKEN: tl.constexpr, NORM: tl.constexpr, WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr,
    WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, HAS_V: tl.constexpr, QUANT: tl.constexpr,
    OUT_QUANT: tl.constexpr, MATH_DTYPE: tl.constexpr,
    # what the tensors allow
    INDEX_DTYPE: tl.constexpr, EVICT: tl.constexpr,
):
    """Grid: (token blocks, head blocks of q then of k, batch or sequence), or with HEADS_INNER (token blocks x head
    blocks, 1, batch or sequence). See the module docstring."""
    seqlen, n_heads_q, n_heads_k = sizes[0], sizes[1], sizes[2]
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if HEADS_INNER:
        n_head_blocks = n_head_blocks_q + (n_heads_k + BLOCK_HK - 1) // BLOCK_HK  # n_heads_k is 0 without k
        pid_s = tl.program_id(0) // n_head_blocks
        pid_h = tl.program_id(0) % n_head_blocks
    else:
        pid_s = tl.program_id(0)
        pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    first, seq_len, batch_index = sequence_span(CU_SEQLENS, pid_b, seqlen, IS_VARLEN, INDEX_DTYPE)
    if pid_s * BLOCK_S >= seq_len:
        return  # varlen: this sequence is shorter than the longest one
    if pid_h < n_head_blocks_q:
        _forward_heads(Q, OUT_Q, q_strides, out_q_strides,
                       None, None, None, None, v_strides, k_cache_strides, v_cache_strides, slot_stride,
                       None, None, None, page_table,
                       None, None, None, None, scale_strides, Q_SCALE,
                       Q_W, weight_strides[0], eps, weight_offset,
                       COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
                       pid_s, pid_b, first, seq_len, batch_index, pid_h * BLOCK_H, n_heads_q, sizes,
                       ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                       POS_MODE, IS_VARLEN, COS_PER_TOKEN, NORM, WRITE_Q, WRITE_TAIL, 0, False, STORE_PLAIN,
                       OUT_QUANT, MATH_DTYPE, INDEX_DTYPE, EVICT)
    elif HAS_K:
        _forward_heads(K, OUT_K, k_strides, out_k_strides,
                       V, K_CACHE, V_CACHE, SLOTS, v_strides, k_cache_strides, v_cache_strides, slot_stride,
                       BATCH_INDICES, KV_INDICES, KV_INDPTR, page_table,
                       K_SCALE, V_SCALE, K_GLOBAL, V_GLOBAL, scale_strides, None,
                       K_W, weight_strides[1], eps, weight_offset,
                       COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
                       pid_s, pid_b, first, seq_len, batch_index, (pid_h - n_head_blocks_q) * BLOCK_HK, n_heads_k,
                       sizes,
                       ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                       POS_MODE, IS_VARLEN, COS_PER_TOKEN, NORM, WRITE_K, WRITE_TAIL, CACHE, HAS_V, QUANT,
                       STORE_PLAIN, MATH_DTYPE, INDEX_DTYPE, EVICT)


# --------------------------------------------------------------------------------------------------------------------
# The backward. The norm N(u) = u r w with r = 1 / sqrt(mean(u^2) + eps) and w = weight_offset + weight (1 without
# weights) has the VJP  N'(u)^T h = r w h - u r^3 mean(h w u),  the means over the norm's group: a head vector's
# HEAD_DIM channels, or (NORM[2]) the n_heads x HEAD_DIM channels of a token's projection, all heads together (r, and
# the mean of h w u, one a token then). Its weight gradient sums h u r over tokens, and per head over the heads too (one
# weight a channel, every head's); over all heads each head has weights of its own, so that sum stops at the tokens.
# The rotation R is orthogonal: its VJP turns by -θ.
#   NORM BEFORE, y = R(N(x)):  u = x,          h = rotate(g, -θ),   dx = N'(u)^T h
#   NORM AFTER,  y = N(R(x)):  u = rotate(x, θ), h = g,              dx = rotate(N'(u)^T h, -θ)
# --------------------------------------------------------------------------------------------------------------------

@triton.jit
def _backward_heads(
    # the forward's input (q, or k), the incoming gradient and where the input's gradient goes
    X, G, DX, x_strides, g_strides, dx_strides,
    # the norm's weight, and where the weight gradient's row this program writes (DW_ATOMIC: adds into) starts in DW
    W, w_stride, eps, weight_offset, DW, dw_offset,
    # the angles and the positions
    COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
    # this program's tokens and heads
    pid_s, pid_b, first, seq_len, batch_index, first_head, n_heads, sizes,
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, TOKEN_BLOCKS: tl.constexpr, STAGES: tl.constexpr,
    INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, COS_PER_TOKEN: tl.constexpr, NORM: tl.constexpr,
    MATH_DTYPE: tl.constexpr, DW_ATOMIC: tl.constexpr, INDEX_DTYPE: tl.constexpr, EVICT: tl.constexpr,
):
    """TOKEN_BLOCKS consecutive blocks of BLOCK_S tokens x BLOCK_H heads of q or of k: the input gradient of each,
    and the weight-gradient terms summed element by element, then reduced over tokens (and per head over the heads)
    once (one cross-warp reduction a program, not one a block) and stored into (added to) DW's row at ``dw_offset``:
    HEAD_DIM values, or over all heads (NORM[2]) head h's HEAD_DIM at h * HEAD_DIM."""
    table_len, n_tokens = sizes[3], sizes[4]
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    head_mask = heads < n_heads
    w_a, w_b, w_t = norm_weights(W, w_stride, heads, head_mask, weight_offset, NORM, ROTARY_DIM, HEAD_DIM,
                                 BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, MATH_DTYPE)
    acc_a = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
    acc_b = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
    acc_t = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_TAIL], dtype=MATH_DTYPE)
    for i in tl.range(TOKEN_BLOCKS, num_stages=STAGES):
        s_local, token_rows, token_mask = _token_block(first, seq_len, pid_s * TOKEN_BLOCKS + i, n_tokens, BLOCK_S,
                                                       INDEX_DTYPE)
        mask = token_mask[:, None] & head_mask[None, :]
        x_a, x_b, x_t = load_head(X, _rows(x_strides, batch_index, token_rows, heads), mask, x_strides[3],
                                  ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED,
                                  MATH_DTYPE, EVICT)
        cos_a, sin_a, cos_b, sin_b = _cos_sin(
            COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
            cos_strides, position_strides, ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, True,
            MATH_DTYPE)  # conjugated: the rotation by -θ
        cos_a, sin_a, cos_b, sin_b = cos_a[:, None, :], sin_a[:, None, :], cos_b[:, None, :], sin_b[:, None, :]
        g_a, g_b, g_t = load_head(G, _rows(g_strides, batch_index, token_rows, heads), mask, g_strides[3],
                                  ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED,
                                  MATH_DTYPE, EVICT)
        # padding lanes (pairs past ROTARY_DIM / 2, rows past the block's tokens or heads) hold NaN from the table's
        # masked loads: keep them out of the sums
        pair_valid = mask[:, :, None] & (tl.arange(0, BLOCK_HALF) < ROTARY_DIM // 2)[None, None, :]
        if NORM[0] == NORM_AFTER_C:
            x_a, x_b = _rotate(x_a, x_b, cos_a, -sin_a, cos_b, -sin_b, MATH_DTYPE, False)  # u = rotate(x, θ)
            x_a, x_b = tl.where(pair_valid, x_a, 0.0), tl.where(pair_valid, x_b, 0.0)
        else:
            g_a, g_b = _rotate(g_a, g_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)  # h = rotate(g, -θ)
            g_a, g_b = tl.where(pair_valid, g_a, 0.0), tl.where(pair_valid, g_b, 0.0)
        r = rsqrt_mean_square(x_a, x_b, x_t, eps, n_heads, NORM, HEAD_DIM, MATH_DTYPE)
        dot = group_sum(tl.sum(g_a * w_a * x_a, 2) + tl.sum(g_b * w_b * x_b, 2) + tl.sum(g_t * w_t * x_t, 2), NORM)
        if NORM[2]:
            mean = dot / (n_heads * HEAD_DIM)
        else:
            mean = dot / HEAD_DIM
        c = r * r * r * mean[:, :, None]
        dx_a, dx_b, dx_t = r * w_a * g_a - c * x_a, r * w_b * g_b - c * x_b, r * w_t * g_t - c * x_t
        if NORM[0] == NORM_AFTER_C:
            dx_a, dx_b = _rotate(dx_a, dx_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
        store_head(DX, _rows(dx_strides, batch_index, token_rows, heads), mask, dx_a, dx_b, dx_t, dx_strides[3], 1.0,
                   ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, True, STORE_PLAIN,
                   EVICT, False)
        acc_a += g_a * x_a * r
        acc_b += g_b * x_b * r
        acc_t += g_t * x_t * r
    if NORM[2]:  # a weight a (head, channel): summed over the tokens, each head's at h * HEAD_DIM of the row
        dw_a, dw_b, dw_t = tl.sum(acc_a, 0)[None, :, :], tl.sum(acc_b, 0)[None, :, :], tl.sum(acc_t, 0)[None, :, :]
        origin = dw_offset + heads.to(tl.int64)[None, :] * HEAD_DIM
        where = head_mask[None, :]
    else:  # one weight a channel, shared by the heads: summed over the heads and the tokens
        dw_a = tl.sum(tl.sum(acc_a, 1), 0)[None, None, :]
        dw_b = tl.sum(tl.sum(acc_b, 1), 0)[None, None, :]
        dw_t = tl.sum(tl.sum(acc_t, 1), 0)[None, None, :]
        origin = tl.zeros([1, 1], dtype=tl.int64) + dw_offset
        where = origin >= 0
    store_head(DW, origin, where, dw_a, dw_b, dw_t, 1, 1.0, ROTARY_DIM, HEAD_DIM, 1, origin.shape[1], BLOCK_HALF,
               BLOCK_TAIL, INTERLEAVED, True, STORE_PLAIN, "", DW_ATOMIC)


@triton.jit
def fused_backward_kernel(
    # q and k (the forward's inputs) and the gradients of the forward's outputs: (batch, seq, heads, HEAD_DIM)
    # views, or packed with IS_VARLEN; strides are (batch, seq, head, channel) tuples
    Q, K, GQ, GK, q_strides, k_strides, gq_strides, gk_strides,
    # where the gradients of q and k go
    DQ, DK, dq_strides, dk_strides,
    # the norm (NORM: where it lies, before or after the rotation, whether it has weights, over each head or all
    # heads): the (HEAD_DIM,) or (n_heads * HEAD_DIM,) weights and their strides (q's, k's), eps, the weight offset;
    # DW the weight gradients, two rows (q's, k's) every program adds into with DW_ATOMIC, else a row a program, each
    # row sizes[5] values
    Q_W, K_W, weight_strides, eps, weight_offset, DW,
    # the angles and the positions, as the forward's
    COS, SIN, cos_strides, POSITIONS, position_strides, CU_SEQLENS, position_offset,
    # (seqlen, n_heads_q, n_heads_k, table_len, n_tokens, the length of a weight-gradient row)
    sizes,
    # the head vector and the tile
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, TOKEN_BLOCKS: tl.constexpr,
    STAGES: tl.constexpr, HEADS_INNER: tl.constexpr,
    # what the call asks for
    HAS_K: tl.constexpr, INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr,
    COS_PER_TOKEN: tl.constexpr, NORM: tl.constexpr, MATH_DTYPE: tl.constexpr, DW_ATOMIC: tl.constexpr,
    # what the tensors allow
    INDEX_DTYPE: tl.constexpr, EVICT: tl.constexpr,
):
    """Grid: (token-block groups, head blocks of q then of k, batch or sequence), or with HEADS_INNER (groups x head
    blocks, 1, batch or sequence); a group is TOKEN_BLOCKS blocks of BLOCK_S tokens."""
    seqlen, n_heads_q, n_heads_k = sizes[0], sizes[1], sizes[2]
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
        dw_row = (pid_h >= n_head_blocks_q).to(tl.int64)  # one row for q's weight gradient, one for k's
    else:
        dw_row = ((pid_b * n_head_blocks + pid_h) * n_groups + pid_s).to(tl.int64)
    dw_offset = dw_row * sizes[5]
    if pid_h < n_head_blocks_q:
        _backward_heads(Q, GQ, DQ, q_strides, gq_strides, dq_strides, Q_W, weight_strides[0], eps, weight_offset, DW,
                        dw_offset, COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
                        pid_s, pid_b, first, seq_len, batch_index, pid_h * BLOCK_H, n_heads_q, sizes,
                        ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, TOKEN_BLOCKS, STAGES,
                        INTERLEAVED, POS_MODE, COS_PER_TOKEN, NORM, MATH_DTYPE, DW_ATOMIC, INDEX_DTYPE, EVICT)
    elif HAS_K:
        _backward_heads(K, GK, DK, k_strides, gk_strides, dk_strides, K_W, weight_strides[1], eps, weight_offset, DW,
                        dw_offset, COS, SIN, cos_strides, POSITIONS, position_strides, position_offset,
                        pid_s, pid_b, first, seq_len, batch_index, (pid_h - n_head_blocks_q) * BLOCK_HK, n_heads_k,
                        sizes, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL, TOKEN_BLOCKS, STAGES,
                        INTERLEAVED, POS_MODE, COS_PER_TOKEN, NORM, MATH_DTYPE, DW_ATOMIC, INDEX_DTYPE, EVICT)


# --------------------------------------------------------------------------------------------------------------------
# The launch choice.
# --------------------------------------------------------------------------------------------------------------------

_forced_fused: FusedConfig | None = None


@contextlib.contextmanager
def forced_fused_config(config: FusedConfig | None):
    """Every fused launch planned inside the block that is not given ``config=`` uses ``config`` (None: the usual
    choice), whichever public op reaches it (:mod:`ropekit.fused`, autograd). For tools that measure launch
    configurations through the public API (``ropekit.bench.fused_tune``), as
    :func:`ropekit.triton.launch.forced_config` is for RoPE; plans are forgotten on entry and on exit."""
    global _forced_fused
    saved, _forced_fused = _forced_fused, config
    plans.clear()
    try:
        yield
    finally:
        _forced_fused = saved
        plans.clear()


def fused_config_for(shape: FusedShape, device, bench=None) -> FusedConfig:
    """The launch choice for a fused call of this shape on ``device``: inside :func:`forced_fused_config` the forced
    one; otherwise ``ropekit.triton.choice.choose_fused`` (the model's choice on this GPU's facts, refined by the
    autotune where ``bench`` is given and the bucket is worth timing; fixed tiles under the interpreter, where every
    program costs Python time)."""
    if _forced_fused is not None:
        return _forced_fused
    return choice.choose_fused(shape, device, bench=bench)


def _forward_values(call: dict) -> tuple:
    """:data:`FORWARD_PER_CALL`'s values from :func:`plan_fused`'s (or :func:`launch_fused`'s) arguments."""
    positions = call["positions"]
    return (call["q"], call["k"], call["out_q"], call["out_k"], call["v"], call["k_cache"], call["v_cache"],
            call["k_scale"], call["v_scale"], call["slots"], *(call["page_table"] or (None,) * 3), call["q_weight"],
            call["k_weight"], call["cos"], call["sin"], positions.tensor, positions.cu_seqlens, positions.offset,
            call["q_scale"], call["k_global"], call["v_global"])


def _tuned_forward_config(shape: FusedShape, call: dict) -> FusedConfig:
    """The choice for a forward call, where the autotune may time candidates on the call's own tensors.

    Every write of a forward launch (outputs, cache rows, scales) is a function of its inputs alone, so launching a
    candidate again writes the same bytes, except where an output is its own input (in place): those inputs are
    copied before the first candidate runs and restored after the last, so the call's own launch then reads them as
    the caller gave them."""
    saved: list = []

    def bench(config: FusedConfig) -> float:
        if not saved:
            saved.append([(x, x.clone()) for x, out in ((call["q"], call["out_q"]), (call["k"], call["out_k"]))
                          if x is not None and out is not None and out.numel() and out.data_ptr() == x.data_ptr()])
        launch = plan_fused(**{**call, "config": config})
        values = _forward_values(call)
        return choice.time_launch(lambda: launch(*values))

    try:
        return fused_config_for(shape, call["q"].device, bench)
    finally:
        for x, copy in (saved[0] if saved else ()):
            x.copy_(copy)


def native_fp8(device) -> bool:
    """Whether the kernel converts to float8 (e4m3, e5m2) with the GPU's own instruction (compute capability 8.9 and
    later: a saturating round-to-nearest-even conversion, two values an instruction) rather than with integer
    arithmetic on the float32 bits (the interpreter, older GPUs). Both give the same bits."""
    device = torch.device(device)
    return not _device.INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


# --------------------------------------------------------------------------------------------------------------------
# Plans and launches.
# --------------------------------------------------------------------------------------------------------------------

# What a forward plan takes at each call, in this order (a KernelLaunch's per-call arguments); None where the plan
# was made without that tensor
FORWARD_PER_CALL = ("Q", "K", "OUT_Q", "OUT_K", "V", "K_CACHE", "V_CACHE", "K_SCALE", "V_SCALE", "SLOTS",
                    "BATCH_INDICES", "KV_INDICES", "KV_INDPTR", "Q_W", "K_W", "COS", "SIN", "POSITIONS", "CU_SEQLENS",
                    "position_offset", "Q_SCALE", "K_GLOBAL", "V_GLOBAL")
# (a call whose plan stores q in its own dtype, or whose cache is not NVFP4, may stop before Q_SCALE or K_GLOBAL: the
# plan's None stays)
BACKWARD_PER_CALL = ("Q", "K", "GQ", "GK", "DQ", "DK", "Q_W", "K_W", "DW", "COS", "SIN", "POSITIONS", "CU_SEQLENS",
                     "position_offset")
# the per-tensor scale's strides: constants (its one float is read without them)
_ONE_SCALE = (1, 1, 1)

_MATH = {torch.float64: tl.float64}
_UNREAD = (1, 1, 1, 1)  # the strides of a tensor a launch does not read: constants to Triton


def _strides(t) -> tuple:
    return tuple(t.stride()) if t is not None else _UNREAD


def _reach_fits_int32(*tensors) -> bool:
    """Whether every element offset of these views (from their own data pointers) stays below 2**31."""
    return all(sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0) < 2**31
               for t in tensors if t is not None)


class FusedBackward:
    """A planned backward launch: allocates the weight-gradient rows a call's programs write, launches, and sums
    them. Called with :data:`BACKWARD_PER_CALL`'s tensors but ``DW``; returns ``(dw_q, dw_k)`` in the math dtype, of
    ``dw_lengths`` values (the weights' lengths: head_dim each, or over all heads q's and k's heads x head_dim)."""

    __slots__ = ("launch", "dw_shape", "dw_dtype", "dw_zeroed", "dw_atomic", "n_blocks_q", "dw_lengths")

    def __init__(self, launch, dw_shape, dw_dtype, dw_zeroed: bool, dw_atomic: bool, n_blocks_q: int,
                 dw_lengths: tuple):
        self.launch, self.dw_shape, self.dw_dtype = launch, dw_shape, dw_dtype  # launch None: nothing to compute
        self.dw_zeroed, self.dw_atomic, self.n_blocks_q = dw_zeroed, dw_atomic, n_blocks_q
        self.dw_lengths = dw_lengths

    def __call__(self, q, k, grad_q, grad_k, out_q, out_k, q_weight, k_weight, cos, sin, positions, cu_seqlens,
                 position_offset: int):
        length_q, length_k = self.dw_lengths
        if self.launch is None:
            return (torch.zeros(length_q, dtype=self.dw_dtype, device=q.device),
                    torch.zeros(length_k, dtype=self.dw_dtype, device=q.device))
        dw = (torch.zeros if self.dw_zeroed else torch.empty)(self.dw_shape, dtype=self.dw_dtype, device=q.device)
        self.launch(q, k, grad_q, grad_k, out_q, out_k, q_weight, k_weight, dw, cos, sin, positions, cu_seqlens,
                    position_offset)
        if self.dw_atomic:
            return dw[0, :length_q], dw[1, :length_k]
        return (dw[:, :self.n_blocks_q, :, :length_q].sum((0, 1, 2)),
                dw[:, self.n_blocks_q:, :, :length_k].sum((0, 1, 2)))


def plan_fused(q, k, cos, sin, *, positions: PositionSpec, rotary_dim: int, interleaved: bool = False,
               cos_per_token: bool = False, out_q=None, out_k=None, v=None, k_cache=None, v_cache=None,
               cache_mode: int = CACHE_NONE, slots=None, page_table=None, block_size: int = 1, cache_len: int = 0,
               k_scale=None, v_scale=None, quant: tuple = NO_QUANT[:2], q_format: int = PLAIN, q_scale=None,
               k_global=None, v_global=None, q_weight=None, k_weight=None, eps: float = 0.0,
               weight_offset: float = 0.0, norm: int | None = None, norm_over_heads: bool = False, grad_q=None,
               grad_k=None, config: FusedConfig | None = None):
    """The plan for :func:`launch_fused`'s arguments: for the forward a :class:`~ropekit.triton.launch.KernelLaunch`
    called with :data:`FORWARD_PER_CALL`'s tensors (None when there is nothing to do), for the backward (``grad_q``
    given) a :class:`FusedBackward`. Later calls pass tensors of the same shapes, strides and dtypes (or views of
    them with the same data pointers: the caller's own layout), and only their pointers are read."""
    call = dict(locals())  # the arguments as given: what the autotune re-plans a candidate from
    backward = grad_q is not None
    varlen = positions.is_varlen
    if varlen:
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
    fp8 = k_cache is not None and quant[0] != PLAIN  # a one-byte cache
    if norm is None:  # the norm's place: before the rotation when weights are given
        norm = BEFORE if q_weight is not None else NO_NORM
    norm_flags = norm_switch(norm, q_weight is not None, norm_over_heads)
    norm = norm != NO_NORM
    over_heads = norm and norm_over_heads
    if config is None:
        width = max(head_dim, v.shape[-1] if v is not None else 0)
        shape = FusedShape(n_batch * seqlen, max(n_heads_q, n_heads_k), width, q.element_size(), fp8, norm, backward,
                           over_heads)
        timed = not backward and q.device.type == "cuda" and launching_directly()
        config = _tuned_forward_config(shape, call) if timed else fused_config_for(shape, q.device)
    if over_heads:  # the norm's group, a token's heads, lies in one program (whatever configuration was forced)
        config = config._replace(block_h=next_pow2(max(n_heads_q, n_heads_k)))
    block_hk = min(config.block_h, next_pow2(n_heads_k))
    token_blocks = config.token_blocks if backward else 1
    n_blocks_q = cdiv(n_heads_q, config.block_h)
    n_blocks_s = cdiv(cdiv(seqlen, config.block_s), token_blocks)
    n_blocks_h = n_blocks_q + cdiv(n_heads_k, block_hk)
    grid = (n_blocks_s * n_blocks_h, 1, n_batch) if config.heads_inner else (n_blocks_s, n_blocks_h, n_batch)
    empty = grid[0] == 0 or n_batch == 0 or n_tokens == 0
    if backward:
        dw_atomic = not torch.are_deterministic_algorithms_enabled()
        dw_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        # the weights' lengths, and a row's: one weight a channel, or over all heads one a (head, channel)
        dw_lengths = (n_heads_q * head_dim, n_heads_k * head_dim) if over_heads else (head_dim, head_dim)
        dw_width = max(dw_lengths)
        # atomic: two rows every program adds into; else a row a program (varlen programs past their sequence's end
        # write none: zeroed)
        dw_shape = (2, dw_width) if dw_atomic else (n_batch, n_blocks_h, n_blocks_s, dw_width)
        dw_zeroed = dw_atomic or varlen
    if empty:
        return FusedBackward(None, (dw_width,), dw_dtype, True, True, 0, dw_lengths) if backward else None
    if cos_per_token:
        cos_strides, table_len = (0 if varlen else cos.stride(0), cos.stride(1), cos.stride(2)), 1
    else:
        cos_strides, table_len = (1, cos.stride(0), cos.stride(1)), cos.shape[0]
    pos = positions.tensor
    common = dict(
        Q=q, K=k, q_strides=_strides(q), k_strides=_strides(k),
        Q_W=q_weight, K_W=k_weight, eps=eps, weight_offset=weight_offset,
        weight_strides=(q_weight.stride(0) if q_weight is not None else 1,
                        k_weight.stride(0) if k_weight is not None else 1), NORM=norm_flags,
        COS=cos, SIN=sin, cos_strides=cos_strides,
        POSITIONS=pos, position_strides=_position_strides(positions), CU_SEQLENS=positions.cu_seqlens,
        position_offset=positions.offset,
        ROTARY_DIM=rotary_dim, HEAD_DIM=head_dim, BLOCK_S=config.block_s, BLOCK_H=config.block_h, BLOCK_HK=block_hk,
        BLOCK_HALF=next_pow2(rotary_dim // 2), BLOCK_TAIL=next_pow2(max(head_dim - rotary_dim, 1)),
        HEADS_INNER=config.heads_inner, HAS_K=k is not None, INTERLEAVED=interleaved, POS_MODE=positions.mode,
        IS_VARLEN=varlen, COS_PER_TOKEN=cos_per_token, MATH_DTYPE=_MATH.get(q.dtype, tl.float32),
        INDEX_DTYPE=tl.int32 if _reach_fits_int32(q, k, v, out_q, out_k, grad_q, grad_k, cos, sin, pos)
        else tl.int64,
        EVICT="evict_first" if config.evict_first else "")
    if backward:
        arguments = dict(
            common, GQ=grad_q, GK=grad_k, gq_strides=_strides(grad_q), gk_strides=_strides(grad_k),
            DQ=out_q, DK=out_k, dq_strides=_strides(out_q), dk_strides=_strides(out_k), DW=None,
            sizes=(seqlen, n_heads_q, n_heads_k, table_len, n_tokens, dw_width),
            TOKEN_BLOCKS=token_blocks, STAGES=config.stages, DW_ATOMIC=dw_atomic)
        launch = KernelLaunch(fused_backward_kernel, grid, config.num_warps, BACKWARD_PER_CALL, arguments)
        return FusedBackward(launch, dw_shape, dw_dtype, dw_zeroed, dw_atomic, n_blocks_q, dw_lengths)
    write_q, write_k = out_q is not None, out_k is not None
    batch_indices, kv_indices, kv_indptr = page_table or (None,) * 3
    # (an empty tensor's data pointer says nothing: q without heads is not "in place")
    in_place = any(out is not None and out.numel() > 0 and out.data_ptr() == x.data_ptr()
                   for x, out in ((q, out_q), (k, out_k)))
    v_dim = v.shape[-1] if v is not None else 1
    arguments = dict(
        common, OUT_Q=out_q, OUT_K=out_k, out_q_strides=_strides(out_q), out_k_strides=_strides(out_k),
        V=v, K_CACHE=k_cache, V_CACHE=v_cache, K_SCALE=k_scale, V_SCALE=v_scale, K_GLOBAL=k_global,
        V_GLOBAL=v_global, SLOTS=slots,
        v_strides=_strides(v), k_cache_strides=_strides(k_cache), v_cache_strides=_strides(v_cache),
        slot_stride=slots.stride(0) if slots is not None else 1,
        BATCH_INDICES=batch_indices, KV_INDICES=kv_indices, KV_INDPTR=kv_indptr,
        page_table=(batch_indices.stride(0), kv_indices.stride(0), kv_indptr.stride(0), kv_indices.shape[0],
                    kv_indptr.shape[0] - 1) if page_table is not None else (1, 1, 1, 0, 0),
        sizes=(seqlen, n_heads_q, n_heads_k, table_len, n_tokens, cache_len, block_size),
        V_DIM=v_dim, BLOCK_V=next_pow2(v_dim), WRITE_Q=write_q, WRITE_K=write_k,
        WRITE_TAIL=norm or not in_place, CACHE=cache_mode, HAS_V=v is not None and cache_mode != CACHE_NONE,
        QUANT=_quant(quant, k_cache, q.device), scale_strides=(_scale_strides(k_scale, quant),
                                                               _scale_strides(v_scale, quant)),
        Q_SCALE=q_scale, OUT_QUANT=_quant((q_format, PER_TENSOR), out_q, q.device))
    return KernelLaunch(fused_forward_kernel, grid, config.num_warps, FORWARD_PER_CALL, arguments)


def _quant(quant: tuple, target, device) -> tuple:
    """The kernel's QUANT (or OUT_QUANT) for a store into ``target`` (a cache, or q's output; None: no store): the
    call's (format, scales) and whether the GPU converts to float8 itself."""
    if target is None or quant[0] == PLAIN:
        return NO_QUANT
    return (quant[0], quant[1], quant[0] in (E4M3, E5M2) and native_fp8(device))


def _scale_strides(scale, quant: tuple) -> tuple:
    """A scale's (block or sequence, row, head) strides: a per-head ``(heads,)`` tensor's, or a per-(token, head)
    scale cache's, or NVFP4's block-scale cache's (whose last axis, the 16-blocks, is contiguous); a one-element
    scale's are not read."""
    if scale is None or quant[0] == PLAIN or quant[1] == PER_TENSOR:
        return _ONE_SCALE
    if quant[1] == PER_HEAD:
        return (0, 0, scale.stride(0))
    return tuple(scale.stride()[:3])


def launch_fused(q, k, cos, sin, *, positions: PositionSpec, rotary_dim: int, interleaved: bool = False,
                 cos_per_token: bool = False, out_q=None, out_k=None, v=None, k_cache=None, v_cache=None,
                 cache_mode: int = CACHE_NONE, slots=None, page_table=None, block_size: int = 1,
                 cache_len: int = 0, k_scale=None, v_scale=None, quant: tuple = NO_QUANT[:2], q_format: int = PLAIN,
                 q_scale=None, k_global=None, v_global=None, q_weight=None, k_weight=None, eps: float = 0.0,
                 weight_offset: float = 0.0, norm: int | None = None, norm_over_heads: bool = False, grad_q=None,
                 grad_k=None, config: FusedConfig | None = None):
    """Plan and launch the fused kernels on validated arguments (``ropekit.fused`` validates; this trusts its caller).

    q, k, v, the outputs and the incoming gradients are ``(batch, seq, heads, dim)`` views with any strides, or
    ``(tokens, heads, dim)`` when ``positions.is_varlen``; caches are ``(blocks or batch, rows, heads, dim)`` views
    (float8 caches as their uint8 bits; ``quant``: what the cache stores, ``(format, scales)`` of
    :mod:`ropekit.triton.fused_tiles`, with ``k_scale``/``v_scale`` one float32 each, ``(heads,)`` or, per (token,
    head), scale caches ``(blocks or batch, rows, heads)`` the launch writes; NVFP4 (``quant`` (NVFP4, PER_BLOCK)):
    the caches ``(..., dim / 2)`` bytes, ``k_scale``/``v_scale`` the block-scale caches ``(..., dim / 16)`` as bytes,
    written, ``k_global``/``v_global`` the one-element float32 global scales; ``q_format``: a float8 q output, ``out_q``
    as its uint8 bytes, at the one-element ``q_scale``). ``slots``: the contiguous cache's offsets (one a sequence),
    the paged cache's slots or the page table's positions (one a token); ``page_table``: ``(batch_indices,
    kv_indices, kv_indptr)`` with ``cache_mode`` CACHE_PAGE_TABLE. An output that is its input is written in place.
    ``out_q``/``out_k`` None: not written. With ``grad_q`` (the backward) the outputs receive the input gradients and
    the call returns the weight gradients ``(dw_q, dw_k)`` in the math dtype; otherwise None. The programs add their
    weight-gradient terms into two rows with atomic adds (no second reduction kernel; the float sum's rounding depends
    on the order the adds arrive in), or, under ``torch.use_deterministic_algorithms``, each program stores its own row
    and one reduction in a fixed order sums them. ``config`` forces a launch configuration (tools and tests).
    ``norm``: where the norm lies, :mod:`ropekit.triton.fused_tiles`' NO_NORM, BEFORE or AFTER the rotation (None:
    BEFORE when ``q_weight`` is given, else none); without weights a norm is weightless. ``norm_over_heads``: the
    norm's mean square runs over all heads of a token's q (or k) together, with ``(heads * dim,)`` weights, instead
    of over each head vector.
    """
    plan = plan_fused(q, k, cos, sin, positions=positions, rotary_dim=rotary_dim, interleaved=interleaved,
                      cos_per_token=cos_per_token, out_q=out_q, out_k=out_k, v=v, k_cache=k_cache, v_cache=v_cache,
                      cache_mode=cache_mode, slots=slots, page_table=page_table, block_size=block_size,
                      cache_len=cache_len, k_scale=k_scale, v_scale=v_scale, quant=quant, q_format=q_format,
                      q_scale=q_scale, k_global=k_global, v_global=v_global, q_weight=q_weight, k_weight=k_weight,
                      eps=eps, weight_offset=weight_offset, norm=norm, norm_over_heads=norm_over_heads,
                      grad_q=grad_q, grad_k=grad_k, config=config)
    if grad_q is not None:
        return plan(q, k, grad_q, grad_k, out_q, out_k, q_weight, k_weight, cos, sin, positions.tensor,
                    positions.cu_seqlens, positions.offset)
    if plan is not None:
        plan(*_forward_values(locals()))
    return None
