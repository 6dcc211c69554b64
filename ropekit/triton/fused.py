"""The fused pre-processing kernels and their launcher: RMSNorm (per head, or across a token's heads), RoPE and the
KV-cache write in one launch (the forward), and the vector-Jacobian product of QK-norm + RoPE with the weight
gradients (the backward).

Two kernels, one algorithm each, as in Triton's layer-norm tutorial:

* :func:`fused_forward_kernel` normalises (``NORM = (place, weighted, over_heads)``: an RMSNorm of each head vector
  before the rotation, Qwen3's and Gemma 3's QK-norm, or after it, Llama 4's; with weights or without; the weight
  offset, 0 or Gemma's 1, is a runtime float; or of all heads of a token together, OLMo-2's, a program then holding
  every head of its tokens), rotates, stores the outputs (``WRITE``: q's, k's (an engine may only want the cache),
  the channels past ``ROTARY_DIM`` too, out of place or normalised) and writes k and v into a cache (``CACHE.MODE``
  0: none, 1: a contiguous ``(batch, max_seq, heads, dim)`` cache at per-sequence offsets, 2: a paged
  ``(num_blocks, block_size, heads, dim)`` cache addressed by a slot per token, -1 skips, 3: the same cache addressed
  through a page table, a request and a position per token; the address map is ``fused_tiles.cache_slot``, and
  where the head axis lies is the cache's strides; ``CACHE.HAS_V``: v's head vectors copied untouched;
  ``QUANT``: the quantising store, a constexpr tuple (format: the cache's dtype, float8 e4m3 or e5m2, int8,
  NVFP4; scales: per tensor, per kv head, or per (token, head) computed from the rotated head vector and written
  beside the cache, or NVFP4's e4m3 scale per 16 channels written beside it over a global scale; the GPU's float8
  conversion instruction or integer arithmetic, the same bits), see :mod:`ropekit.triton.fused_tiles`).
* :func:`fused_backward_kernel` turns the incoming gradient by -θ and pushes it through the norm (a norm after the
  rotation: through the norm, then by -θ); each program sums its weight-gradient terms over ``TILE.TOKEN_BLOCKS``
  token blocks, then adds them into the weight gradient's row for q or for k (``DW_ATOMIC``) or stores them in a
  row of its own.

Pairing, partial rotary, every position form, varlen and per-token cos/sin rows are v4's switches, read through v4's
helpers (``_cos_sin``, ``_rotate``); the tile loads and stores are :mod:`ropekit.triton.fused_tiles`.

The arguments travel in groups, as their comments in the signatures say: a tensor with its strides, ``(tensor,
strides)``; an output or a cache as a store with its scales (``fused_tiles``); the cache's address map; the angles
with the table's length; the positions with their strides, the packed sequences' starts and the offset. The
compile-time switches are grouped too, in named tuples read by field (``HEAD.ROTARY_DIM``, ``TILE.BLOCK_S``): the
head vector (:class:`~ropekit.triton.groups.Head`), the tile (:class:`Tile`), the positions' form
(:class:`~ropekit.triton.groups.PositionForm`), the outputs (:class:`Writes`), the cache write
(:class:`CacheWrite`), the types (:class:`~ropekit.triton.groups.Types`; Head, PositionForm and Types are the tile
kernel's too). A plan names a per-call tensor by its group and its place in it (:data:`FORWARD_PER_CALL`).

Grid: (token groups, head blocks of q then of k (then of v, with ``CACHE.V_APART``), batch or sequence); with
``TILE.HEADS_INNER`` the first two axes are one, head blocks inner, so that the q programs and the (heavier) k + v
programs of a token group run side by side. A group is one block of ``TILE.BLOCK_S`` tokens, or in the backward
``TILE.TOKEN_BLOCKS`` of them. q's head blocks hold ``TILE.BLOCK_H`` heads and k's (and v's) ``TILE.BLOCK_HK``, no
more than k has. A program reads its rows of q (or of k and the same heads of v, or with ``CACHE.V_APART`` of k, or
of v) once and writes each output once: the byte floor of the fused step. ``TYPES.EVICT`` is the cache
hint on activation loads and on stores (streaming: each byte is touched once).

The host side: :func:`fused_config_for` is the launch choice, :func:`plan_fused` makes a plan (a
:class:`~ropekit.triton.launch.KernelLaunch`, or a :class:`FusedBackward` around one) once per call signature, and
the ops' front doors (``ropekit.fused``) keep it in :data:`ropekit.triton.launch.plans`.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import PositionSpec
from . import choice
from .configs import FusedConfig, FusedShape, cdiv, next_pow2
from .fused_tiles import BEFORE, E4M3, E5M2, INT8, NO_NORM, NO_QUANT, NVFP4, NORM_AFTER_C, NORM_BEFORE_C, NORM_NONE_C, \
    PER_HEAD, PER_TENSOR, PLAIN, STORE_PLAIN, cache_slot, channel_dot, channels_scale, group_sum, head_scale, \
    load_head, norm_switch, norm_weights, normed, one_scale, read_scale, reciprocal, rsqrt_mean_square, \
    sequence_span, store_channels, store_head
from .launch import KernelLaunch, _position_strides, launching_directly, plans
from .groups import Dependency, Head, PositionForm, Types
from .v4 import _cos_sin, _rotate, after_grid_before, program_blocks

__all__ = ["fused_forward_kernel", "fused_backward_kernel", "FusedConfig", "FusedShape", "fused_config_for",
           "forced_fused_config", "plan_fused", "FusedBackward",
           "launch_fused", "native_fp8", "CACHE_NONE", "CACHE_CONTIGUOUS", "CACHE_PAGED",
           "CACHE_PAGE_TABLE"]

# the cache address maps (fused_tiles.cache_slot): none, contiguous at per-sequence offsets, a slot per token, a page
# table with a request and a position per token
CACHE_NONE, CACHE_CONTIGUOUS, CACHE_PAGED, CACHE_PAGE_TABLE = 0, 1, 2, 3
# (as device code reads it) a grid that releases the grid after it is a small one, a decode step, whose time is its
# chain of round trips (ropekit.triton.model.grid_dependency)
RELEASE_C = tl.constexpr(Dependency.RELEASE)


# --------------------------------------------------------------------------------------------------------------------
# The kernels' compile-time groups, read by field in device code (a kernel takes each as one constexpr).
# --------------------------------------------------------------------------------------------------------------------

class Tile(NamedTuple):
    """The launch tile: BLOCK_S tokens by BLOCK_H heads of q, BLOCK_HK of k; HEADS_INNER: the grid's first axis runs
    over (token groups x head blocks), head blocks inner; the backward's TOKEN_BLOCKS token blocks a program, its loop
    pipelined over STAGES (the forward's: 1, 1)."""

    BLOCK_S: int
    BLOCK_H: int
    BLOCK_HK: int
    HEADS_INNER: bool
    TOKEN_BLOCKS: int = 1
    STAGES: int = 1


class Writes(NamedTuple):
    """Which outputs the forward stores: q's, k's (an engine may only want the cache), and the channels past
    ROTARY_DIM (out of place, or normalised)."""

    Q: bool
    K: bool
    TAIL: bool


class CacheWrite(NamedTuple):
    """The forward's cache write: MODE, the address map (CACHE_NONE, CACHE_CONTIGUOUS, CACHE_PAGED,
    CACHE_PAGE_TABLE; ``fused_tiles.cache_slot``) and, through a page table, the rows a page holds (PAGE_SIZE, a
    constant: the page lookup's division and remainder are then a shift and a mask at the usual powers of two); HAS_V,
    v's head vectors of V_DIM channels (BLOCK_V lanes) copied untouched, in k's programs or (V_APART) in programs of
    their own after k's; QUANT, k's quantising store (``fused_tiles``: (format, scales, native conversion)), and
    V_QUANT v's: the same but where one cache entry holds both in formats of their own (DeepSeek's fp8_ds_mla: the
    latent in float8 tiles, the rotated part in the model's dtype)."""

    MODE: int
    PAGE_SIZE: int
    HAS_V: bool
    V_DIM: int
    BLOCK_V: int
    QUANT: tuple
    V_APART: bool
    V_QUANT: tuple


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


@triton.jit
def _head_block(first_head, n_heads, BLOCK_H: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """The heads of a program's block, from ``first_head``, and whether each exists."""
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    return heads, heads < n_heads


@triton.jit
def _angles(angles, positions, pid_b, batch_index, s_local, token_rows, token_mask, HEAD: tl.constexpr,
            POSITION: tl.constexpr, CONJUGATE: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """cos and sin of each token's pairs (v4's ``_cos_sin``: from the table, per-token rows or, POSITION.ANGLES, the
    inverse frequencies; M-RoPE's pairs each at its axis' position; a NoPE layer's temperature as cos, sin 0), as
    [BLOCK_S, 1, BLOCK_HALF] tiles shared by the heads; CONJUGATE: of -θ."""
    cos_a, sin_a, cos_b, sin_b = _cos_sin(
        angles[0], angles[1], positions[0], pid_b, batch_index, s_local, token_rows, token_mask, angles[3],
        positions[3], angles[2], positions[1], HEAD.ROTARY_DIM, HEAD.BLOCK_HALF, HEAD.INTERLEAVED, POSITION.MODE,
        POSITION.COS_PER_TOKEN, CONJUGATE, MATH_DTYPE, INDEX_DTYPE, POSITION.ANGLES, POSITION.ANGLE_SCALE,
        POSITION.NOPE_FLOOR_SCALE, POSITION.NOPE_ATTN_SCALE)
    return cos_a[:, None, :], sin_a[:, None, :], cos_b[:, None, :], sin_b[:, None, :]


# --------------------------------------------------------------------------------------------------------------------
# The forward.
# --------------------------------------------------------------------------------------------------------------------

@triton.jit
def _slots(cache_rows, s_local, token_rows, token_mask, pid_b, seqlen, POSITION: tl.constexpr, CACHE: tl.constexpr):
    """Each token's cache block, its row there and whether it is written (fused_tiles.cache_slot). The slots and the
    page table number a token by its packed row (varlen), else by sequence * seqlen + its index."""
    token = token_rows if POSITION.IS_VARLEN else pid_b.to(tl.int64) * seqlen + s_local
    return cache_slot(cache_rows, token, s_local, pid_b, token_mask, CACHE.MODE, CACHE.PAGE_SIZE)


@triton.jit
def _load_values(v, batch_index, token_rows, heads, mask, CACHE: tl.constexpr, EVICT: tl.constexpr):
    """v's head vectors of a tile, each one run of V_DIM channels ([BLOCK_S, BLOCK_H, BLOCK_V]), and the channels'
    mask ([1, 1, BLOCK_V]). v is read for every token of the tile, a skipped slot's too: the store, not the load,
    honours -1."""
    V, v_strides = v
    channels = tl.arange(0, CACHE.BLOCK_V)
    channel_mask = (channels < CACHE.V_DIM)[None, None, :]
    values = tl.load(V + _rows(v_strides, batch_index, token_rows, heads)[:, :, None] + channels[None, None, :] *
                     v_strides[3], mask=mask[:, :, None] & channel_mask, other=0.0, eviction_policy=EVICT)
    return values, channel_mask


@triton.jit
def _store_values(v_cache, cache_block, cache_row, heads, mask, read, values, channel_mask, QUANT: tl.constexpr,
                  EVICT: tl.constexpr):
    """v's head vectors into the v cache at their slots, in the cache's format: at the scale ``read``
    (fused_tiles.read_scale), or per (token, head) (or per tile of its channels) at one computed and written beside
    the cache, or NVFP4's."""
    scale = channels_scale(v_cache, cache_block, cache_row, heads, mask, read, values, channel_mask, QUANT)
    V_CACHE, strides = v_cache[0], v_cache[1]
    store_channels(V_CACHE, _rows(strides, cache_block[:, None], cache_row, heads), 0, values,
                   mask[:, :, None] & channel_mask, strides[3], scale, QUANT, EVICT, False)


@triton.jit
def _forward_heads(
    # the tensor (q, or k) as (tensor, strides), and its output store
    x, out,
    # the cache side (k's programs only), as the kernel's: v, the caches' stores, where each token's row is
    v, k_cache, v_cache, cache_rows,
    # the norm's weight (tensor, stride), and (eps, weight offset)
    weight, norm,
    # the angles and the positions, as the kernel's
    angles, positions,
    # this program's tokens (token block, sequence, its first row, its length, its batch index); its heads, from
    # first_head, of n_heads; the kernel's sizes
    tokens, first_head, n_heads, sizes,
    HEAD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, POSITION: tl.constexpr, NORM: tl.constexpr,
    WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, TO_CACHE: tl.constexpr,
    OUT_QUANT: tl.constexpr, TYPES: tl.constexpr, SMALL_GRID: tl.constexpr,
):
    """BLOCK_S tokens x BLOCK_H heads of q, or of k with the same heads of v: normalise, rotate, store to the output
    and/or (TO_CACHE: k's programs) write the cache as CACHE says (and, unless CACHE.V_APART gives v programs of its
    own, v to the v cache). SMALL_GRID: the grid is one the model releases (groups.Dependency.RELEASE: a decode
    step), where per-head scales load with the tile."""
    X, x_strides = x
    OUT, out_strides = out[0], out[1]
    pid_s, pid_b, first, seq_len, batch_index = tokens
    seqlen, n_tokens = sizes[0], sizes[3]
    eps, weight_offset = norm
    MATH_DTYPE: tl.constexpr = TYPES.MATH_DTYPE
    EVICT: tl.constexpr = TYPES.EVICT
    CACHE_MODE: tl.constexpr = CACHE.MODE if TO_CACHE else 0
    HAS_V: tl.constexpr = CACHE.HAS_V and not CACHE.V_APART if TO_CACHE else False
    QUANT: tl.constexpr = CACHE.QUANT
    V_QUANT: tl.constexpr = CACHE.V_QUANT
    s_local, token_rows, token_mask = _token_block(first, seq_len, pid_s, n_tokens, BLOCK_S, TYPES.INDEX_DTYPE)
    heads, head_mask = _head_block(first_head, n_heads, BLOCK_H, TYPES.INDEX_DTYPE)
    mask = token_mask[:, None] & head_mask[None, :]
    # The tile's loads are issued first, v's with x's: they are in flight while the dependent chains position ->
    # table row -> cos/sin and token -> slot resolve.
    x_a, x_b, x_t = load_head(X, _rows(x_strides, batch_index, token_rows, heads), mask, x_strides[3], HEAD, BLOCK_S,
                              BLOCK_H, MATH_DTYPE, EVICT)
    if HAS_V:
        v_values, v_channel_mask = _load_values(v, batch_index, token_rows, heads, mask, CACHE, EVICT)
    # So are the loads whose address is fixed: the scales the stores read (one float, or one a head:
    # fused_tiles.read_scale), and a head vector's norm weights (one row; a norm over all heads loads them after the
    # angles: its weights are a tile as large as x's, whose registers it would hold through the round trips).
    out_read = read_scale(out, heads, head_mask, OUT_QUANT, SMALL_GRID)
    if CACHE_MODE != 0:
        k_read = read_scale(k_cache, heads, head_mask, QUANT, SMALL_GRID)
        if HAS_V:
            v_read = read_scale(v_cache, heads, head_mask, V_QUANT, SMALL_GRID)
    if NORM[0] != NORM_NONE_C and not NORM[2]:
        w_a, w_b, w_t = norm_weights(weight, heads, head_mask, weight_offset, NORM, HEAD, MATH_DTYPE)
    cos_a, sin_a, cos_b, sin_b = _angles(angles, positions, pid_b, batch_index, s_local, token_rows, token_mask, HEAD,
                                         POSITION, False, MATH_DTYPE, TYPES.INDEX_DTYPE)
    if CACHE_MODE != 0:
        cache_block, cache_row, cache_mask = _slots(cache_rows, s_local, token_rows, token_mask, pid_b, seqlen,
                                                    POSITION, CACHE)
    if NORM[0] != NORM_NONE_C and NORM[2]:
        w_a, w_b, w_t = norm_weights(weight, heads, head_mask, weight_offset, NORM, HEAD, MATH_DTYPE)
    if NORM[0] == NORM_BEFORE_C:
        x_a, x_b, x_t, r = normed(x_a, x_b, x_t, w_a, w_b, w_t, eps, n_heads, NORM, HEAD, MATH_DTYPE)
    # A rotated tile that only one store at one float scale reads (a float8 q; k into a float8 or int8 cache at a
    # per-tensor scale, k's own output not written) turns by the angles times the scale's reciprocal: its values
    # are then the quotients, stored without a division of their own. These stores are bound by the instructions
    # each byte costs, not by the bytes (docs/tuning.md#fused-launch-table). A norm after the rotation needs the
    # values themselves.
    # A NoPE layer (POSITION.NOPE_FLOOR_SCALE > 0) rotates nothing: q is multiplied by its temperature (cos, with no
    # sin term: an infinite partner must not spoil its neighbour), k passes as it is, into the cache's store.
    NOPE: tl.constexpr = POSITION.NOPE_FLOOR_SCALE > 0
    if TO_CACHE:
        SCALED: tl.constexpr = one_scale(QUANT) and CACHE_MODE != 0 and not WRITE_OUT and NORM[0] != NORM_AFTER_C \
            and not NOPE
    else:
        SCALED: tl.constexpr = one_scale(OUT_QUANT) and WRITE_OUT and NORM[0] != NORM_AFTER_C
    if SCALED:
        inverse = reciprocal(k_read if TO_CACHE else out_read, False)
        cos_a, sin_a, cos_b, sin_b = cos_a * inverse, sin_a * inverse, cos_b * inverse, sin_b * inverse
    if NOPE and TO_CACHE:
        y_a, y_b = x_a, x_b
    elif NOPE:
        y_a, y_b = x_a * cos_a, x_b * cos_b
    else:
        y_a, y_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
    if NORM[0] == NORM_AFTER_C:
        y_a, y_b, x_t, r = normed(y_a, y_b, x_t, w_a, w_b, w_t, eps, n_heads, NORM, HEAD, MATH_DTYPE)
    if WRITE_OUT:
        # the output in its dtype, or (OUT_QUANT: a float8 q for float8 attention) at one scale
        out_scale = head_scale(out, None, None, heads, mask, out_read, y_a, y_b, x_t, HEAD, OUT_QUANT)
        store_head(OUT, _rows(out_strides, batch_index, token_rows, heads), mask, y_a, y_b, x_t, out_strides[3],
                   out_scale, HEAD, BLOCK_S, BLOCK_H, WRITE_TAIL, OUT_QUANT, EVICT, False, SCALED)
    if CACHE_MODE != 0:
        c_mask = cache_mask[:, None] & head_mask[None, :]
        c_heads = heads.to(tl.int64)
        # the quantising store's scale: read, or (PER_TOKEN_HEAD) the head vector's absolute maximum over the
        # format's largest value, from the rotated values already in registers, and written beside the cache (NVFP4:
        # the global scale, and where the block scales the store computes go)
        k_scale = head_scale(k_cache, cache_block, cache_row, c_heads, c_mask, k_read, y_a, y_b, x_t, HEAD, QUANT)
        K_CACHE, k_cache_strides = k_cache[0], k_cache[1]
        store_head(K_CACHE, _rows(k_cache_strides, cache_block[:, None], cache_row, c_heads), c_mask, y_a, y_b, x_t,
                   k_cache_strides[3], k_scale, HEAD, BLOCK_S, BLOCK_H, True, QUANT, EVICT, False, SCALED)
        if HAS_V:  # v passes through
            _store_values(v_cache, cache_block, cache_row, c_heads, c_mask, v_read, v_values, v_channel_mask,
                          V_QUANT, EVICT)


@triton.jit
def _cache_values(v, v_cache, cache_rows, tokens, first_head, n_heads, sizes, BLOCK_S: tl.constexpr,
                  BLOCK_H: tl.constexpr, POSITION: tl.constexpr, CACHE: tl.constexpr, TYPES: tl.constexpr,
                  SMALL_GRID: tl.constexpr):
    """v's own programs (CACHE.V_APART): BLOCK_S tokens x BLOCK_H heads of v into the v cache. v passes the
    rotation untouched, so these programs wait for no position and no table row, only for the tokens' slots."""
    pid_s, pid_b, first, seq_len, batch_index = tokens
    EVICT: tl.constexpr = TYPES.EVICT
    QUANT: tl.constexpr = CACHE.V_QUANT
    s_local, token_rows, token_mask = _token_block(first, seq_len, pid_s, sizes[3], BLOCK_S, TYPES.INDEX_DTYPE)
    heads, head_mask = _head_block(first_head, n_heads, BLOCK_H, TYPES.INDEX_DTYPE)
    values, channel_mask = _load_values(v, batch_index, token_rows, heads, token_mask[:, None] & head_mask[None, :],
                                        CACHE, EVICT)
    read = read_scale(v_cache, heads, head_mask, QUANT, SMALL_GRID)
    cache_block, cache_row, cache_mask = _slots(cache_rows, s_local, token_rows, token_mask, pid_b, sizes[0], POSITION,
                                                CACHE)
    _store_values(v_cache, cache_block, cache_row, heads.to(tl.int64), cache_mask[:, None] & head_mask[None, :], read,
                  values, channel_mask, QUANT, EVICT)


@triton.jit
def fused_forward_kernel(
    # q and k as (tensor, strides): (batch, seq, heads, HEAD_DIM) views, or one packed (1, tokens, heads, HEAD_DIM)
    # with POSITION.IS_VARLEN; strides (batch, seq, head, channel)
    q, k,
    # their outputs, stores (fused_tiles: (tensor, strides, scale, scale strides, global scale)), written with
    # WRITE.Q / WRITE.K (an output that is its input is written in place); q's at one float32 scale with OUT_QUANT
    # (a float8 q)
    out_q, out_k,
    # the cache side, read and written by k's programs (and by v's own, CACHE.V_APART; CACHE): v (tensor, strides),
    # k's tokens and heads, V_DIM channels; the caches' stores (float8 ones as uint8 bits; strides (block or
    # sequence, row, head, channel), whichever of NHD and HND; scales float32 read or (per token and head) written,
    # or NVFP4's e4m3 block scales written beside the cache over a float32 global scale, their strides (block or
    # sequence, row, head)); where each token's row is (fused_tiles.cache_slot: the slots or the page table,
    # cache_len, block_size (with a page table: CACHE.PAGE_SIZE))
    v, k_cache, v_cache, cache_rows,
    # the QK-norm (NORM = (place, weighted, over_heads), fused_tiles): the weights (tensor, stride), (HEAD_DIM,) or
    # over all heads (n_heads * HEAD_DIM,); (eps, weight offset)
    q_weight, k_weight, norm,
    # the angles: (COS, SIN, (sequence, row, column) strides, table_len), a (table_len, ROTARY_DIM / 2) float32
    # table or COS_PER_TOKEN rows
    angles,
    # the positions: (POSITIONS, (sequence, token) strides, CU_SEQLENS, position offset); POSITION.MODE says what
    # POSITIONS holds, CU_SEQLENS are the packed sequences' starts
    positions,
    # (seqlen, n_heads_q, n_heads_k, n_tokens)
    sizes,
    # the head vector (groups.Head), the tile (Tile), the positions' form (groups.PositionForm)
    HEAD: tl.constexpr, TILE: tl.constexpr, POSITION: tl.constexpr,
    # what the call asks for: k's programs, the norm, the outputs (Writes), the cache write (CacheWrite), q's store
    HAS_K: tl.constexpr, NORM: tl.constexpr, WRITE: tl.constexpr, CACHE: tl.constexpr, OUT_QUANT: tl.constexpr,
    # what the tensors allow (Types); how the launch follows the grid before it (groups.Dependency)
    TYPES: tl.constexpr, DEPENDENCY: tl.constexpr,
):
    """Grid: (token blocks, head blocks of q then of k (then of v: CACHE.V_APART), batch or sequence), or with
    TILE.HEADS_INNER (token blocks x head blocks, 1, batch or sequence). See the module docstring."""
    after_grid_before(DEPENDENCY)
    # Each group holding a tuple is rebuilt from its items before any branch: Triton 3.6 keeps a stale type for a
    # tuple nested in a tuple argument, and a branch's copy of the group follows the type (a stride of 1 then reads
    # as None)
    q, k, v = (q[0], q[1]), (k[0], k[1]), (v[0], v[1])
    out_q = (out_q[0], out_q[1], out_q[2], out_q[3], out_q[4])
    out_k = (out_k[0], out_k[1], out_k[2], out_k[3], out_k[4])
    k_cache = (k_cache[0], k_cache[1], k_cache[2], k_cache[3], k_cache[4])
    v_cache = (v_cache[0], v_cache[1], v_cache[2], v_cache[3], v_cache[4])
    cache_rows = (cache_rows[0], cache_rows[1], cache_rows[2], cache_rows[3], cache_rows[4], cache_rows[5],
                  cache_rows[6], cache_rows[7])
    angles = (angles[0], angles[1], angles[2], angles[3])
    positions = (positions[0], positions[1], positions[2], positions[3])
    BLOCK_S: tl.constexpr = TILE.BLOCK_S
    BLOCK_H: tl.constexpr = TILE.BLOCK_H
    BLOCK_HK: tl.constexpr = TILE.BLOCK_HK
    seqlen, n_heads_q, n_heads_k = sizes[0], sizes[1], sizes[2]
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    n_head_blocks_k = (n_heads_k + BLOCK_HK - 1) // BLOCK_HK  # n_heads_k is 0 without k
    n_head_blocks = n_head_blocks_q + n_head_blocks_k * (2 if CACHE.V_APART else 1)  # v's own blocks last
    pid_s, pid_h = program_blocks(n_head_blocks, TILE.HEADS_INNER)
    pid_b = tl.program_id(2)
    first, seq_len, batch_index = sequence_span(positions[2], pid_b, seqlen, POSITION.IS_VARLEN, TYPES.INDEX_DTYPE)
    if pid_s * BLOCK_S >= seq_len:
        return  # varlen: this sequence is shorter than the longest one
    tokens = (pid_s, pid_b, first, seq_len, batch_index)
    if pid_h < n_head_blocks_q:
        _forward_heads(q, out_q, v, k_cache, v_cache, cache_rows, q_weight, norm, angles, positions, tokens,
                       pid_h * BLOCK_H, n_heads_q, sizes, HEAD, BLOCK_S, BLOCK_H, POSITION, NORM, WRITE.Q, WRITE.TAIL,
                       CACHE, False, OUT_QUANT, TYPES, DEPENDENCY == RELEASE_C)
    elif CACHE.V_APART and pid_h >= n_head_blocks_q + n_head_blocks_k:
        _cache_values(v, v_cache, cache_rows, tokens, (pid_h - n_head_blocks_q - n_head_blocks_k) * BLOCK_HK,
                      n_heads_k, sizes, BLOCK_S, BLOCK_HK, POSITION, CACHE, TYPES, DEPENDENCY == RELEASE_C)
    elif HAS_K:
        _forward_heads(k, out_k, v, k_cache, v_cache, cache_rows, k_weight, norm, angles, positions, tokens,
                       (pid_h - n_head_blocks_q) * BLOCK_HK, n_heads_k, sizes, HEAD, BLOCK_S, BLOCK_HK, POSITION, NORM,
                       WRITE.K, WRITE.TAIL, CACHE, True, STORE_PLAIN, TYPES, DEPENDENCY == RELEASE_C)


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
    # the forward's input (q, or k), the incoming gradient and where the input's gradient goes: (tensor, strides)
    x, grad, dx,
    # the norm's weight (tensor, stride), (eps, weight offset), the weight gradient (rows, a row's length) and where
    # the row this program writes (DW_ATOMIC: adds into) starts
    weight, norm, dw, dw_offset,
    # the angles and the positions, as the kernel's
    angles, positions,
    # this program's tokens (token group, sequence, its first row, its length, its batch index); its heads, from
    # first_head, of n_heads; the kernel's sizes
    tokens, first_head, n_heads, sizes,
    HEAD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, TILE: tl.constexpr, POSITION: tl.constexpr,
    NORM: tl.constexpr, DW_ATOMIC: tl.constexpr, TYPES: tl.constexpr,
):
    """TILE.TOKEN_BLOCKS consecutive blocks of BLOCK_S tokens x BLOCK_H heads of q or of k: the input gradient of
    each, and the weight-gradient terms summed element by element, then reduced over tokens (and per head over the
    heads) once (one cross-warp reduction a program, not one a block) and stored into (added to) the weight
    gradient's row at ``dw_offset``: HEAD_DIM values, or over all heads (NORM[2]) head h's HEAD_DIM at h * HEAD_DIM."""
    X, x_strides = x
    G, g_strides = grad
    DX, dx_strides = dx
    pid_s, pid_b, first, seq_len, batch_index = tokens
    MATH_DTYPE: tl.constexpr = TYPES.MATH_DTYPE
    EVICT: tl.constexpr = TYPES.EVICT
    TOKEN_BLOCKS: tl.constexpr = TILE.TOKEN_BLOCKS
    n_tokens = sizes[3]
    eps, weight_offset = norm
    heads, head_mask = _head_block(first_head, n_heads, BLOCK_H, TYPES.INDEX_DTYPE)
    w_a, w_b, w_t = norm_weights(weight, heads, head_mask, weight_offset, NORM, HEAD, MATH_DTYPE)
    BLOCK_HALF: tl.constexpr = HEAD.BLOCK_HALF  # (a shape's extents are constexprs, not fields)
    BLOCK_TAIL: tl.constexpr = HEAD.BLOCK_TAIL
    acc_a = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
    acc_b = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_HALF], dtype=MATH_DTYPE)
    acc_t = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_TAIL], dtype=MATH_DTYPE)
    for i in tl.range(TOKEN_BLOCKS, num_stages=TILE.STAGES):
        s_local, token_rows, token_mask = _token_block(first, seq_len, pid_s * TOKEN_BLOCKS + i, n_tokens, BLOCK_S,
                                                       TYPES.INDEX_DTYPE)
        mask = token_mask[:, None] & head_mask[None, :]
        x_a, x_b, x_t = load_head(X, _rows(x_strides, batch_index, token_rows, heads), mask, x_strides[3], HEAD,
                                  BLOCK_S, BLOCK_H, MATH_DTYPE, EVICT)
        cos_a, sin_a, cos_b, sin_b = _angles(angles, positions, pid_b, batch_index, s_local, token_rows, token_mask,
                                             HEAD, POSITION, True, MATH_DTYPE, TYPES.INDEX_DTYPE)  # the rotation by -θ
        g_a, g_b, g_t = load_head(G, _rows(g_strides, batch_index, token_rows, heads), mask, g_strides[3], HEAD,
                                  BLOCK_S, BLOCK_H, MATH_DTYPE, EVICT)
        # padding lanes (pairs past ROTARY_DIM / 2, rows past the block's tokens or heads) hold NaN from the table's
        # masked loads: keep them out of the sums
        pair_valid = mask[:, :, None] & (tl.arange(0, HEAD.BLOCK_HALF) < HEAD.ROTARY_DIM // 2)[None, None, :]
        if NORM[0] == NORM_AFTER_C:
            # u = rotate(x, θ): the forward's sines from the transpose's (sin_a = -θ's sin_b, sin_b = -θ's sin_a,
            # which differ where per-token rows' halves do)
            x_a, x_b = _rotate(x_a, x_b, cos_a, -sin_b, cos_b, -sin_a, MATH_DTYPE, False)
            x_a, x_b = tl.where(pair_valid, x_a, 0.0), tl.where(pair_valid, x_b, 0.0)
        else:
            g_a, g_b = _rotate(g_a, g_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)  # h = rotate(g, -θ)
            g_a, g_b = tl.where(pair_valid, g_a, 0.0), tl.where(pair_valid, g_b, 0.0)
        r = rsqrt_mean_square(x_a, x_b, x_t, eps, n_heads, NORM, HEAD.HEAD_DIM, MATH_DTYPE)
        dot = group_sum(channel_dot(g_a * w_a, x_a, g_b * w_b, x_b, g_t * w_t, x_t), NORM)
        if NORM[2]:
            mean = dot / (n_heads * HEAD.HEAD_DIM)
        else:
            mean = dot / HEAD.HEAD_DIM
        c = r * r * r * mean[:, :, None]
        dx_a, dx_b, dx_t = r * w_a * g_a - c * x_a, r * w_b * g_b - c * x_b, r * w_t * g_t - c * x_t
        if NORM[0] == NORM_AFTER_C:
            dx_a, dx_b = _rotate(dx_a, dx_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
        store_head(DX, _rows(dx_strides, batch_index, token_rows, heads), mask, dx_a, dx_b, dx_t, dx_strides[3], 1.0,
                   HEAD, BLOCK_S, BLOCK_H, True, STORE_PLAIN, EVICT, False, False)
        acc_a += g_a * x_a * r
        acc_b += g_b * x_b * r
        acc_t += g_t * x_t * r
    if NORM[2]:  # a weight a (head, channel): summed over the tokens, each head's at h * HEAD_DIM of the row
        dw_a, dw_b, dw_t = tl.sum(acc_a, 0)[None, :, :], tl.sum(acc_b, 0)[None, :, :], tl.sum(acc_t, 0)[None, :, :]
        origin = dw_offset + heads.to(tl.int64)[None, :] * HEAD.HEAD_DIM
        where = head_mask[None, :]
    else:  # one weight a channel, shared by the heads: summed over the heads and the tokens
        dw_a = tl.sum(tl.sum(acc_a, 1), 0)[None, None, :]
        dw_b = tl.sum(tl.sum(acc_b, 1), 0)[None, None, :]
        dw_t = tl.sum(tl.sum(acc_t, 1), 0)[None, None, :]
        origin = tl.zeros([1, 1], dtype=tl.int64) + dw_offset
        where = origin >= 0
    store_head(dw[0], origin, where, dw_a, dw_b, dw_t, 1, 1.0, HEAD, 1, origin.shape[1], True, STORE_PLAIN, "",
               DW_ATOMIC, False)


@triton.jit
def fused_backward_kernel(
    # q and k (the forward's inputs) and the gradients of the forward's outputs, as (tensor, strides):
    # (batch, seq, heads, HEAD_DIM) views, or packed with POSITION.IS_VARLEN; strides (batch, seq, head, channel)
    q, k, grad_q, grad_k,
    # where the gradients of q and k go, as (tensor, strides)
    dq, dk,
    # the norm (NORM: where it lies, before or after the rotation, whether it has weights, over each head or all
    # heads): the (HEAD_DIM,) or (n_heads * HEAD_DIM,) weights (tensor, stride), (eps, weight offset); the weight
    # gradients (rows, a row's length): two rows (q's, k's) every program adds into with DW_ATOMIC, else a row a
    # program
    q_weight, k_weight, norm, dw,
    # the angles and the positions, as the forward's
    angles, positions,
    # (seqlen, n_heads_q, n_heads_k, n_tokens)
    sizes,
    # the head vector (groups.Head), the tile (Tile), the positions' form (groups.PositionForm)
    HEAD: tl.constexpr, TILE: tl.constexpr, POSITION: tl.constexpr,
    # what the call asks for: k's programs, the norm, how the weight gradient is summed
    HAS_K: tl.constexpr, NORM: tl.constexpr, DW_ATOMIC: tl.constexpr,
    # what the tensors allow (Types); how the launch follows the grid before it (groups.Dependency)
    TYPES: tl.constexpr, DEPENDENCY: tl.constexpr,
):
    """Grid: (token-block groups, head blocks of q then of k, batch or sequence), or with TILE.HEADS_INNER (groups x
    head blocks, 1, batch or sequence); a group is TILE.TOKEN_BLOCKS blocks of TILE.BLOCK_S tokens."""
    after_grid_before(DEPENDENCY)
    # (rebuilt before any branch, as the forward's groups)
    q, k, grad_q, grad_k = (q[0], q[1]), (k[0], k[1]), (grad_q[0], grad_q[1]), (grad_k[0], grad_k[1])
    dq, dk = (dq[0], dq[1]), (dk[0], dk[1])
    angles = (angles[0], angles[1], angles[2], angles[3])
    positions = (positions[0], positions[1], positions[2], positions[3])
    BLOCK_S: tl.constexpr = TILE.BLOCK_S
    BLOCK_H: tl.constexpr = TILE.BLOCK_H
    BLOCK_HK: tl.constexpr = TILE.BLOCK_HK
    TOKEN_BLOCKS: tl.constexpr = TILE.TOKEN_BLOCKS
    seqlen, n_heads_q, n_heads_k = sizes[0], sizes[1], sizes[2]
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    n_head_blocks = n_head_blocks_q + (n_heads_k + BLOCK_HK - 1) // BLOCK_HK  # n_heads_k is 0 without k
    n_groups = ((seqlen + BLOCK_S - 1) // BLOCK_S + TOKEN_BLOCKS - 1) // TOKEN_BLOCKS
    pid_s, pid_h = program_blocks(n_head_blocks, TILE.HEADS_INNER)
    pid_b = tl.program_id(2)
    first, seq_len, batch_index = sequence_span(positions[2], pid_b, seqlen, POSITION.IS_VARLEN, TYPES.INDEX_DTYPE)
    if pid_s * TOKEN_BLOCKS * BLOCK_S >= seq_len:
        return  # varlen: this sequence is shorter than the longest one
    if DW_ATOMIC:
        dw_row = (pid_h >= n_head_blocks_q).to(tl.int64)  # one row for q's weight gradient, one for k's
    else:
        dw_row = ((pid_b * n_head_blocks + pid_h) * n_groups + pid_s).to(tl.int64)
    dw_offset = dw_row * dw[1]
    tokens = (pid_s, pid_b, first, seq_len, batch_index)
    if pid_h < n_head_blocks_q:
        _backward_heads(q, grad_q, dq, q_weight, norm, dw, dw_offset, angles, positions, tokens, pid_h * BLOCK_H,
                        n_heads_q, sizes, HEAD, BLOCK_S, BLOCK_H, TILE, POSITION, NORM, DW_ATOMIC, TYPES)
    elif HAS_K:
        _backward_heads(k, grad_k, dk, k_weight, norm, dw, dw_offset, angles, positions, tokens,
                        (pid_h - n_head_blocks_q) * BLOCK_HK, n_heads_k, sizes, HEAD, BLOCK_S, BLOCK_HK, TILE,
                        POSITION, NORM, DW_ATOMIC, TYPES)


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


def fused_config_for(shape: FusedShape, device, bench=None, registers=None) -> FusedConfig:
    """The launch choice for a fused call of this shape on ``device``: inside :func:`forced_fused_config` the forced
    one; otherwise ``ropekit.triton.choice.choose_fused`` (the model's choice on this GPU's facts and, where
    ``registers`` is given, the compiled kernel's registers, refined by the autotune where ``bench`` is given and the
    bucket is worth timing; fixed tiles under the interpreter, where every program costs Python time)."""
    if _forced_fused is not None:
        return _forced_fused
    return choice.choose_fused(shape, device, bench=bench, registers=registers)


def _forward_values(call: dict) -> tuple:
    """:data:`FORWARD_PER_CALL`'s values from :func:`plan_fused`'s (or :func:`launch_fused`'s) arguments."""
    positions = call["positions"]
    return (call["q"], call["k"], call["out_q"], call["out_k"], call["v"], call["k_cache"], call["v_cache"],
            call["k_scale"], call["v_scale"], call["slots"], *(call["page_table"] or (None,) * 3), call["q_weight"],
            call["k_weight"], *_angle_tensors(call), positions.tensor, positions.cu_seqlens, positions.offset,
            call["q_scale"], call["k_global"], call["v_global"])


def _angle_tensors(call: dict) -> tuple:
    """What a launch reads as its angles: the table's (or the rows') cos and sin, or the inverse frequencies."""
    return (call["cos"], call["sin"]) if call["inv_freq"] is None else (call["inv_freq"], None)


def _tuned_forward_config(shape: FusedShape, call: dict) -> FusedConfig:
    """The choice for a forward call, where the model may count a candidate's registers (its launch compiled for the
    call's own tensors) and the autotune may time candidates on them.

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
        return choice.time_launch(lambda: launch(*values), device=call["q"].device)

    counted: dict = {}

    def registers(config: FusedConfig) -> int | None:
        if config not in counted:  # the model asks again for a tile it has counted
            launch = plan_fused(**{**call, "config": config})
            counted[config] = None if launch is None else launch.registers(_forward_values(call))
        return counted[config]

    try:
        return fused_config_for(shape, call["q"].device, bench, registers)
    finally:
        for x, copy in (saved[0] if saved else ()):
            x.copy_(copy)


def native_fp8(device) -> bool:
    """Whether the kernel converts to float8 (e4m3, e5m2; NVFP4's e4m3 block scales too) with the GPU's own
    instruction (an NVIDIA GPU of compute capability 8.9 and later: a saturating round-to-nearest-even conversion, two
    values an instruction), and to int8 there with the PTX instruction ``cvt.rni.sat.s8.f32``, rather than with integer
    arithmetic on the float32 bits (the interpreter, older GPUs, ROCm builds, which report their GPUs as "cuda" but
    compile no PTX). Both give the same bits."""
    device = torch.device(device)
    return (not _device.INTERPRET and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 9))


# --------------------------------------------------------------------------------------------------------------------
# Plans and launches.
# --------------------------------------------------------------------------------------------------------------------

# What a forward plan takes at each call, in this order (a KernelLaunch's per-call values, each a tensor (or the
# position offset) by its group and its place in the group); None where the plan was made without that tensor
FORWARD_PER_CALL = (("q", 0), ("k", 0), ("out_q", 0), ("out_k", 0), ("v", 0), ("k_cache", 0), ("v_cache", 0),
                    ("k_cache", 2), ("v_cache", 2), ("cache_rows", 0), ("cache_rows", 2), ("cache_rows", 3),
                    ("cache_rows", 4), ("q_weight", 0), ("k_weight", 0), ("angles", 0), ("angles", 1),
                    ("positions", 0), ("positions", 2), ("positions", 3), ("out_q", 2), ("k_cache", 4),
                    ("v_cache", 4))
# (a call whose plan stores q in its own dtype, or whose cache is not NVFP4, may stop before q's scale or k's global
# scale: the plan's None stays)
BACKWARD_PER_CALL = (("q", 0), ("k", 0), ("grad_q", 0), ("grad_k", 0), ("dq", 0), ("dk", 0), ("q_weight", 0),
                     ("k_weight", 0), ("dw", 0), ("angles", 0), ("angles", 1), ("positions", 0), ("positions", 2),
                     ("positions", 3))
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
    them. Called with :data:`BACKWARD_PER_CALL`'s tensors but the weight gradient's rows; returns ``(dw_q, dw_k)``
    in the math dtype, of ``dw_lengths`` values (the weights' lengths: head_dim each, or over all heads q's and k's
    heads x head_dim)."""

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
               grad_k=None, inv_freq=None, angle_scale: float = 1.0, nope: tuple | None = None,
               config: FusedConfig | None = None, v_quant: tuple | None = None):
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
    if norm is None:  # the norm's place: before the rotation when weights are given
        norm = BEFORE if q_weight is not None else NO_NORM
    norm_flags = norm_switch(norm, q_weight is not None, norm_over_heads)
    norm = norm != NO_NORM
    over_heads = norm and norm_over_heads
    if config is None:
        width = max(head_dim, v.shape[-1] if v is not None else 0)
        # the cache's format and scales as written: a quantised cache's, else PLAIN (its own dtype, or no cache)
        cache_format, cache_scales = quant[:2] if k_cache is not None and quant[0] != PLAIN else (PLAIN, PER_TENSOR)
        shape = FusedShape(n_batch * seqlen, max(n_heads_q, n_heads_k), width, q.element_size(), norm=norm,
                           backward=backward, norm_over_heads=over_heads, cache_format=cache_format,
                           cache_scales=cache_scales, q_format=q_format, head_dim=head_dim if width > head_dim else 0)
        timed = not backward and q.device.type == "cuda" and launching_directly()
        config = _tuned_forward_config(shape, call) if timed else fused_config_for(shape, q.device)
    if over_heads:  # the norm's group, a token's heads, lies in one program (whatever configuration was forced)
        config = config._replace(block_h=next_pow2(max(n_heads_q, n_heads_k)))
    block_hk = min(config.block_h, next_pow2(n_heads_k))
    token_blocks = config.token_blocks if backward else 1
    n_blocks_q = cdiv(n_heads_q, config.block_h)
    n_blocks_s = cdiv(cdiv(seqlen, config.block_s), token_blocks)
    has_v = v is not None and cache_mode != CACHE_NONE and not backward
    v_apart = has_v and config.v_apart  # v's head blocks after k's (CacheWrite.V_APART)
    n_blocks_h = n_blocks_q + cdiv(n_heads_k, block_hk) * (2 if v_apart else 1)
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
    angles = inv_freq is not None
    if angles:  # the kernel reads the frequencies where a table would be: columns only
        cos, sin, cos_strides, table_len = inv_freq, None, (1, 1, inv_freq.stride(0)), 1
    elif nope is not None:  # a NoPE layer reads no angles
        cos, sin, cos_strides, table_len = None, None, (1, 1, 1), 1
    elif cos_per_token:
        cos_strides, table_len = (0 if varlen else cos.stride(0), cos.stride(1), cos.stride(2)), 1
    else:
        cos_strides, table_len = (1, cos.stride(0), cos.stride(1)), cos.shape[0]
    pos = positions.tensor
    common = dict(
        q=(q, _strides(q)), k=(k, _strides(k)),
        q_weight=(q_weight, q_weight.stride(0) if q_weight is not None else 1),
        k_weight=(k_weight, k_weight.stride(0) if k_weight is not None else 1), norm=(eps, weight_offset),
        angles=(cos, sin, cos_strides, table_len),
        positions=(pos, _position_strides(positions), positions.cu_seqlens, positions.offset),
        sizes=(seqlen, n_heads_q, n_heads_k, n_tokens),
        HEAD=Head(rotary_dim, head_dim, next_pow2(rotary_dim // 2), next_pow2(max(head_dim - rotary_dim, 1)),
                  interleaved),
        POSITION=PositionForm(positions.mode, varlen, cos_per_token, angles, float(angle_scale) if angles else 1.0,
                              *((nope[0], float(nope[1])) if nope is not None else ())),
        HAS_K=k is not None, NORM=norm_flags,
        TYPES=Types(_MATH.get(q.dtype, tl.float32),
                    tl.int32 if _reach_fits_int32(q, k, v, out_q, out_k, grad_q, grad_k, cos, sin, pos) else tl.int64,
                    "evict_first" if config.evict_first else ""),
        DEPENDENCY=choice.launch_dependency(q.device, grid, config.num_warps))
    if backward:
        arguments = dict(
            common, grad_q=(grad_q, _strides(grad_q)), grad_k=(grad_k, _strides(grad_k)),
            dq=(out_q, _strides(out_q)), dk=(out_k, _strides(out_k)), dw=(None, dw_width),
            TILE=Tile(config.block_s, config.block_h, block_hk, config.heads_inner, token_blocks, config.stages),
            DW_ATOMIC=dw_atomic)
        launch = KernelLaunch(fused_backward_kernel, grid, config.num_warps, BACKWARD_PER_CALL, arguments)
        return FusedBackward(launch, dw_shape, dw_dtype, dw_zeroed, dw_atomic, n_blocks_q, dw_lengths)
    write_q, write_k = out_q is not None, out_k is not None
    batch_indices, kv_indices, kv_indptr = page_table or (None,) * 3
    # (an empty tensor's data pointer says nothing: q without heads is not "in place")
    in_place = any(out is not None and out.numel() > 0 and out.data_ptr() == x.data_ptr()
                   for x, out in ((q, out_q), (k, out_k)))
    v_dim = v.shape[-1] if v is not None else 1
    v_quant = _quant(quant if v_quant is None else v_quant, v_cache, q.device)
    quant = _quant(quant, k_cache, q.device)
    arguments = dict(
        common, out_q=_store(out_q, q_scale), out_k=_store(out_k),
        v=(v, _strides(v)), k_cache=_store(k_cache, k_scale, k_global, quant),
        v_cache=_store(v_cache, v_scale, v_global, v_quant),
        cache_rows=(slots, slots.stride(0) if slots is not None else 1, batch_indices, kv_indices, kv_indptr,
                    (batch_indices.stride(0), kv_indices.stride(0), kv_indptr.stride(0), kv_indices.shape[0],
                     kv_indptr.shape[0] - 1) if page_table is not None else (1, 1, 1, 0, 0), cache_len,
                    block_size if cache_mode == CACHE_PAGED else 1),  # read by the slot map only (1: a constant)
        TILE=Tile(config.block_s, config.block_h, block_hk, config.heads_inner),
        WRITE=Writes(write_q, write_k, norm or not in_place),
        CACHE=CacheWrite(cache_mode, block_size if cache_mode == CACHE_PAGE_TABLE else 1, has_v, v_dim,
                         next_pow2(v_dim), quant, v_apart, v_quant),
        OUT_QUANT=_quant((q_format, PER_TENSOR), out_q, q.device))
    return KernelLaunch(fused_forward_kernel, grid, config.num_warps, FORWARD_PER_CALL, arguments)


def _quant(quant: tuple, target, device) -> tuple:
    """The kernel's QUANT (or OUT_QUANT) for a store into ``target`` (a cache, or q's output; None: no store): the
    call's (format, scales) and whether the GPU converts the values itself (float8 or int8; NVFP4's e4m3 block
    scales)."""
    if target is None or quant[0] == PLAIN:
        return NO_QUANT
    return (quant[0], quant[1], quant[0] in (E4M3, E5M2, INT8, NVFP4) and native_fp8(device))


def _store(target, scale=None, global_scale=None, quant: tuple = NO_QUANT) -> tuple:
    """A store as the kernel takes it (``fused_tiles``): (the tensor written, its strides, its scale, the scale's
    strides, NVFP4's global scale)."""
    return target, _strides(target), scale, _scale_strides(scale, quant), global_scale


def _scale_strides(scale, quant: tuple) -> tuple:
    """A scale's (block or sequence, row, head) strides: a per-head ``(heads,)`` tensor's, or a per-(token, head)
    scale cache's, or NVFP4's block-scale cache's or the tiles' scale cache's (whose last axis, the 16-blocks or the
    tiles, is contiguous); a one-element scale's are not read, or (beside a per-head one: one store's scales are per
    head when either's are) read at stride 0, whatever its shape."""
    if scale is None or quant[0] == PLAIN or quant[1] == PER_TENSOR:
        return _ONE_SCALE
    if quant[1] == PER_HEAD:
        return (0, 0, scale.stride(0) if scale.numel() > 1 else 0)
    return tuple(scale.stride()[:3])


def launch_fused(q, k, cos, sin, *, positions: PositionSpec, rotary_dim: int, interleaved: bool = False,
                 cos_per_token: bool = False, out_q=None, out_k=None, v=None, k_cache=None, v_cache=None,
                 cache_mode: int = CACHE_NONE, slots=None, page_table=None, block_size: int = 1,
                 cache_len: int = 0, k_scale=None, v_scale=None, quant: tuple = NO_QUANT[:2], q_format: int = PLAIN,
                 q_scale=None, k_global=None, v_global=None, q_weight=None, k_weight=None, eps: float = 0.0,
                 weight_offset: float = 0.0, norm: int | None = None, norm_over_heads: bool = False, grad_q=None,
                 grad_k=None, inv_freq=None, angle_scale: float = 1.0, nope: tuple | None = None,
                 config: FusedConfig | None = None, v_quant: tuple | None = None):
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
    of over each head vector. ``inv_freq``: no table (cos and sin None): the angles are computed at each position
    from these ``(>= rotary_dim / 2,)`` inverse frequencies, cos and sin times ``angle_scale``. ``positions`` may be
    M-RoPE's (its sections in its mode): each pair then turns at its own axis' position. ``nope``: ``(floor_scale,
    attn_scale)``, a Llama 4 NoPE layer (no table, cos and sin None; forward only): nothing rotates, q is multiplied
    by its token's attention temperature and k reaches the cache (and its output) as it is. ``v_quant``: v's store
    where it differs from k's (None: ``quant``), e.g. ``(E4M3, PER_TILE)`` with ``v_scale`` the tiles' scale cache
    ``(..., V_DIM / TILE_CHANNELS)`` float32, written.
    """
    plan = plan_fused(q, k, cos, sin, positions=positions, rotary_dim=rotary_dim, interleaved=interleaved,
                      cos_per_token=cos_per_token, out_q=out_q, out_k=out_k, v=v, k_cache=k_cache, v_cache=v_cache,
                      cache_mode=cache_mode, slots=slots, page_table=page_table, block_size=block_size,
                      cache_len=cache_len, k_scale=k_scale, v_scale=v_scale, quant=quant, q_format=q_format,
                      q_scale=q_scale, k_global=k_global, v_global=v_global, q_weight=q_weight, k_weight=k_weight,
                      eps=eps, weight_offset=weight_offset, norm=norm, norm_over_heads=norm_over_heads,
                      grad_q=grad_q, grad_k=grad_k, inv_freq=inv_freq, angle_scale=angle_scale, nope=nope,
                      config=config, v_quant=v_quant)
    if grad_q is not None:
        return plan(q, k, grad_q, grad_k, out_q, out_k, q_weight, k_weight, *_angle_tensors(locals()),
                    positions.tensor, positions.cu_seqlens, positions.offset)
    if plan is not None:
        plan(*_forward_values(locals()))
    return None
