"""The fused pre-processing kernel: per-head RMSNorm, RoPE and the KV-cache write in one launch.

One kernel, compile-time switches (no copies): ``NORM`` (QK-norm before the rotation; the weight offset, 0 or Gemma's
1, is a runtime float), ``CACHE`` (0: none, 1: a contiguous ``(batch, max_seq, heads, dim)`` cache written at
per-sequence offsets, 2: a paged ``(num_blocks, block_size, heads, dim)`` cache addressed by a slot per token, -1
skips), ``HAS_V`` (v's head vectors copied into the v cache untouched), ``FP8`` (the caches hold e4m3 bits of
``x / scale``), ``WRITE_Q``/``WRITE_K`` (whether rotated q/k are stored at all: an engine may only want the cache),
``WRITE_TAIL`` (the channels past ``ROTARY_DIM`` are stored: out of place, or normalised), and ``BACKWARD`` (the
vector-Jacobian product of norm + rotation: the incoming gradient is rotated by -θ, pushed through the norm, and each
program leaves its partial weight gradient in a row of ``DW``). Pairing, partial rotary, every position form, varlen
and per-token cos/sin rows are v4's switches, read through v4's helpers (``_cos_sin``, ``_load_pairs``, ``_rotate``).

Grid: (token blocks, head blocks of q then of k, batch or sequence); with ``HEADS_INNER`` the first two axes are one,
head blocks inner, so that the q programs and the (heavier) k + v programs of a token block run side by side. A
program reads its rows of q (or of k and the same heads of v) once and writes each output once: the byte floor of the
fused step. ``EVICT`` is the cache hint on activation loads and on stores (streaming: each byte is touched once).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import POSITION_IDS, PositionSpec
from .v4 import _cos_sin, _load_pairs, _rotate

__all__ = ["fused_rope_kernel", "FusedConfig", "FUSED_LAUNCH_TABLE", "fused_shape_class", "fused_config",
           "forced_fused_config", "launch_fused", "CACHE_NONE", "CACHE_CONTIGUOUS",
           "CACHE_PAGED"]

CACHE_NONE, CACHE_CONTIGUOUS, CACHE_PAGED = 0, 1, 2


@triton.jit
def _e4m3_bits(x):
    """The float8 e4m3fn bits (uint8) of fp32 ``x``: round to nearest even, saturate at ±448 (infinities too), NaN
    stays NaN. Integer arithmetic on the fp32 bits, so the GPU and the interpreter give the same bits."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    magnitude = tl.minimum(magnitude, 0x43E00000)  # 448.0
    exponent = magnitude >> 23
    # normal e4m3 (|x| >= 2**-6): keep 3 mantissa bits, rebias the exponent from 127 to 7
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal e4m3: m * 2**-9, m = round(|x| * 2**9) from the 24-bit significand
    significand = (magnitude & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(141 - exponent.to(tl.int32), 1), 25).to(tl.uint32)
    subnormal = (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift
    code = tl.where(exponent >= 121, normal, subnormal)
    code = tl.where(is_nan, 0x7F, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def _store_head(OUT, rows, mask, y_a, y_b, y_t, stride_d, scale, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
                INTERLEAVED: tl.constexpr, WRITE_TAIL: tl.constexpr, FP8: tl.constexpr, EVICT: tl.constexpr):
    """Store a [BLOCK_S, BLOCK_H] tile of head vectors given as pair halves (and the tail past ROTARY_DIM), cast to
    OUT's dtype, or with FP8 as the e4m3 bits of ``value / scale`` into a uint8 view of the cache."""
    if INTERLEAVED:
        channels = tl.arange(0, 2 * BLOCK_HALF)
        y = tl.reshape(tl.join(y_a, y_b), [BLOCK_S, BLOCK_H, 2 * BLOCK_HALF])
        _store_channels(OUT, rows, channels, y, mask[:, :, None] & (channels < ROTARY_DIM)[None, None, :],
                        stride_d, scale, FP8, EVICT)
    else:
        pairs = tl.arange(0, BLOCK_HALF)
        pair_mask = mask[:, :, None] & (pairs < ROTARY_DIM // 2)[None, None, :]
        _store_channels(OUT, rows, pairs, y_a, pair_mask, stride_d, scale, FP8, EVICT)
        _store_channels(OUT, rows, pairs + ROTARY_DIM // 2, y_b, pair_mask, stride_d, scale, FP8, EVICT)
    if WRITE_TAIL and ROTARY_DIM < HEAD_DIM:
        tail = ROTARY_DIM + tl.arange(0, BLOCK_TAIL)
        tail_mask = mask[:, :, None] & (tail < HEAD_DIM)[None, None, :]
        _store_channels(OUT, rows, tail, y_t, tail_mask, stride_d, scale, FP8, EVICT)


@triton.jit
def _store_channels(OUT, rows, channels, values, mask, stride_d, scale, FP8: tl.constexpr, EVICT: tl.constexpr):
    pointers = OUT + rows[:, :, None] + channels[None, None, :] * stride_d
    if FP8:
        # (x / scale) correctly rounded to fp32, then to e4m3: the quotient the float64 reference rounds
        tl.store(pointers, _e4m3_bits(tl.div_rn(values.to(tl.float32), scale)), mask=mask, eviction_policy=EVICT)
    else:
        tl.store(pointers, values.to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)


@triton.jit
def _load_head(X, rows, mask, stride_d, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
               MATH_DTYPE: tl.constexpr, EVICT: tl.constexpr):
    """A tile of head vectors as (first of each pair, second of each pair, tail past ROTARY_DIM), in MATH_DTYPE."""
    x_a, x_b = _load_pairs(X, rows, mask, stride_d, ROTARY_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, INTERLEAVED,
                           MATH_DTYPE, EVICT)
    if ROTARY_DIM < HEAD_DIM:
        tail = ROTARY_DIM + tl.arange(0, BLOCK_TAIL)
        tail_mask = mask[:, :, None] & (tail < HEAD_DIM)[None, None, :]
        x_t = tl.load(X + rows[:, :, None] + tail[None, None, :] * stride_d, mask=tail_mask, other=0.0,
                      eviction_policy=EVICT).to(MATH_DTYPE)
    else:  # full rotary: no tail, no masked access issued for one
        x_t = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_TAIL], dtype=MATH_DTYPE)
    return x_a, x_b, x_t


@triton.jit
def _weights(W, stride_w, weight_offset, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
             BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr, MATH_DTYPE: tl.constexpr):
    """The norm's per-channel factor ``weight_offset + w`` laid out like a [1, 1] tile of head vectors."""
    origin = tl.zeros([1, 1], dtype=tl.int32)
    everywhere = origin == 0
    w_a, w_b, w_t = _load_head(W, origin, everywhere, stride_w, ROTARY_DIM, HEAD_DIM, 1, 1, BLOCK_HALF, BLOCK_TAIL,
                               INTERLEAVED, MATH_DTYPE, "")
    return w_a + weight_offset, w_b + weight_offset, w_t + weight_offset


@triton.jit
def _rsqrt_mean_square(x_a, x_b, x_t, eps, HEAD_DIM: tl.constexpr, MATH_DTYPE: tl.constexpr):
    """``1 / sqrt(mean(x^2) + eps)`` per head vector, [BLOCK_S, BLOCK_H, 1] (a correctly rounded square root:
    ``sqrt_rn`` in fp32; fp64's ``sqrt`` already is)."""
    squares = tl.sum(x_a * x_a, 2) + tl.sum(x_b * x_b, 2) + tl.sum(x_t * x_t, 2)
    if MATH_DTYPE == tl.float64:
        root = tl.sqrt(squares / HEAD_DIM + eps)
    else:
        root = tl.sqrt_rn(squares / HEAD_DIM + eps)
    return (1.0 / root)[:, :, None]


@triton.jit
def _cache_slot(SLOTS, token, s_local, pid_b, mask, cache_len, block_size, stride_slot, CACHE: tl.constexpr):
    """Where each token of the tile goes in the cache: (block or sequence, row inside it) and whether it is written.
    Contiguous: sequence ``pid_b`` at its offset ``SLOTS[pid_b]`` plus the token's index, inside ``cache_len`` rows.
    Paged: ``slot = SLOTS[token]``, block ``slot // block_size``, row ``slot % block_size``; -1 (any slot outside the
    ``cache_len`` slots) writes nothing."""
    if CACHE == 1:
        row = tl.load(SLOTS + pid_b * stride_slot).to(tl.int64) + s_local.to(tl.int64)
        block = tl.zeros_like(row) + pid_b
        written = mask & (row >= 0) & (row < cache_len)
    else:
        slot = tl.load(SLOTS + token.to(tl.int64) * stride_slot, mask=mask, other=-1).to(tl.int64)
        written = mask & (slot >= 0) & (slot < cache_len)
        slot = tl.where(written, slot, 0)
        block = slot // block_size
        row = slot % block_size
    return block, row, written


@triton.jit
def _head_tile(X, OUT, G, W, DW, V, KC, VC, K_SCALE, V_SCALE, cos_a, sin_a, cos_b, sin_b,
               batch_index, token_rows, token_mask, first_head, n_heads, eps, weight_offset, dw_row,
               cache_block, cache_row, cache_mask,
               sxb, sxs, sxh, sxd, sob, sos, soh, sod, sgb, sgs, sgh, sgd, svb, svs, svh, svd,
               skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_w,
               ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
               INTERLEAVED: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, NORM: tl.constexpr,
               WRITE_OUT: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr, HAS_V: tl.constexpr,
               FP8: tl.constexpr, BACKWARD: tl.constexpr, EVICT: tl.constexpr):
    """BLOCK_H heads of q or of k for the tile's tokens: load once, normalise, rotate, store to the output and/or
    the cache (and v's same heads to the v cache); or, with BACKWARD, the gradient of all that."""
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    head_mask = heads < n_heads
    mask = token_mask[:, None] & head_mask[None, :]
    rows_x = batch_index * sxb + token_rows[:, None] * sxs + heads[None, :] * sxh
    rows_out = batch_index * sob + token_rows[:, None] * sos + heads[None, :] * soh
    x_a, x_b, x_t = _load_head(X, rows_x, mask, sxd, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF,
                               BLOCK_TAIL, INTERLEAVED, MATH_DTYPE, EVICT)
    if NORM:
        w_a, w_b, w_t = _weights(W, stride_w, weight_offset, ROTARY_DIM, HEAD_DIM, BLOCK_HALF, BLOCK_TAIL,
                                 INTERLEAVED, MATH_DTYPE)
        r = _rsqrt_mean_square(x_a, x_b, x_t, eps, HEAD_DIM, MATH_DTYPE)
    if BACKWARD:
        # cos/sin arrive conjugated: the rotation's VJP turns the incoming gradient by -θ
        rows_g = batch_index * sgb + token_rows[:, None] * sgs + heads[None, :] * sgh
        g_a, g_b, g_t = _load_head(G, rows_g, mask, sgd, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF,
                                   BLOCK_TAIL, INTERLEAVED, MATH_DTYPE, EVICT)
        g_a, g_b = _rotate(g_a, g_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
        # padding lanes (pairs past ROTARY_DIM / 2, rows past the tile's tokens or heads) hold NaN from the table's
        # masked loads: keep them out of the sums
        pair_valid = mask[:, :, None] & (tl.arange(0, BLOCK_HALF) < ROTARY_DIM // 2)[None, None, :]
        g_a, g_b = tl.where(pair_valid, g_a, 0.0), tl.where(pair_valid, g_b, 0.0)
        # n = x r w:  dx = r w g - x r^3 mean(g w x),  dw = sum over rows of g x r
        dot = tl.sum(g_a * w_a * x_a, 2) + tl.sum(g_b * w_b * x_b, 2) + tl.sum(g_t * w_t * x_t, 2)
        c = r * r * r * (dot / HEAD_DIM)[:, :, None]
        _store_head(OUT, rows_out, mask, r * w_a * g_a - c * x_a, r * w_b * g_b - c * x_b,
                    r * w_t * g_t - c * x_t, sod, 1.0, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL,
                    INTERLEAVED, True, False, EVICT)
        dw_a = tl.sum(tl.sum(g_a * x_a * r, 1), 0)[None, None, :]
        dw_b = tl.sum(tl.sum(g_b * x_b * r, 1), 0)[None, None, :]
        dw_t = tl.sum(tl.sum(g_t * x_t * r, 1), 0)[None, None, :]
        origin = tl.zeros([1, 1], dtype=tl.int64) + dw_row * HEAD_DIM
        _store_head(DW, origin, origin >= 0, dw_a, dw_b, dw_t, 1, 1.0, ROTARY_DIM, HEAD_DIM, 1, 1, BLOCK_HALF,
                    BLOCK_TAIL, INTERLEAVED, True, False, "")
    else:
        if NORM:
            x_a, x_b, x_t = x_a * r * w_a, x_b * r * w_b, x_t * r * w_t
        y_a, y_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)
        if WRITE_OUT:
            _store_head(OUT, rows_out, mask, y_a, y_b, x_t, sod, 1.0, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H,
                        BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, WRITE_TAIL, False, EVICT)
        if CACHE != 0:
            c_mask = cache_mask[:, None] & head_mask[None, :]
            rows_kc = cache_block[:, None] * skcb + cache_row[:, None] * skcs + heads[None, :].to(tl.int64) * skch
            k_scale = 1.0
            if FP8:
                k_scale = tl.load(K_SCALE)
            _store_head(KC, rows_kc, c_mask, y_a, y_b, x_t, skcd, k_scale, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H,
                        BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, True, FP8, EVICT)
            if HAS_V:
                # v passes through: its head vectors as one "tail" of V_DIM channels
                channels = tl.arange(0, BLOCK_V)
                rows_v = batch_index * svb + token_rows[:, None] * svs + heads[None, :] * svh
                v_mask = c_mask[:, :, None] & (channels < V_DIM)[None, None, :]
                v = tl.load(V + rows_v[:, :, None] + channels[None, None, :] * svd, mask=v_mask, other=0.0,
                            eviction_policy=EVICT)
                v_scale = 1.0
                if FP8:
                    v_scale = tl.load(V_SCALE)
                rows_vc = cache_block[:, None] * svcb + cache_row[:, None] * svcs + heads[None, :].to(tl.int64) * svch
                _store_channels(VC, rows_vc, channels, v, v_mask, svcd, v_scale, FP8, EVICT)


@triton.jit
def _sequence(CU_SEQLENS, pid_b, seqlen, IS_VARLEN: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """Sequence ``pid_b``: its first row, its length, and the batch index its rows are addressed with (varlen: a
    sequence of the packed tensor, which has no batch axis)."""
    if IS_VARLEN:
        start = tl.load(CU_SEQLENS + pid_b).to(INDEX_DTYPE)
        length = tl.load(CU_SEQLENS + pid_b + 1).to(INDEX_DTYPE) - start
        batch_index = 0
    else:
        start = 0
        length = seqlen
        batch_index = pid_b.to(INDEX_DTYPE)
    return start, length, batch_index


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
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, BLOCK_V: tl.constexpr,
    INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr, COS_PER_TOKEN: tl.constexpr,
    HAS_K: tl.constexpr, MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, NORM: tl.constexpr,
    WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, WRITE_TAIL: tl.constexpr, CACHE: tl.constexpr,
    HAS_V: tl.constexpr, FP8: tl.constexpr, BACKWARD: tl.constexpr, EVICT: tl.constexpr, HEADS_INNER: tl.constexpr,
):
    """Grid: (token blocks, head blocks of q then of k, batch or sequence), or with HEADS_INNER (token blocks x head
    blocks, 1, batch or sequence), the head blocks of a token block adjacent in launch order. See the module
    docstring."""
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    n_head_blocks = n_head_blocks_q + (n_heads_k + BLOCK_H - 1) // BLOCK_H  # n_heads_k is 0 without k
    n_token_blocks = (seqlen + BLOCK_S - 1) // BLOCK_S
    if HEADS_INNER:
        pid_s = tl.program_id(0) // n_head_blocks
        pid_h = tl.program_id(0) % n_head_blocks
    else:
        pid_s = tl.program_id(0)
        pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    first, seq_len, batch_index = _sequence(CU_SEQLENS, pid_b, seqlen, IS_VARLEN, INDEX_DTYPE)
    if pid_s * BLOCK_S >= seq_len:
        return  # varlen: this sequence is shorter than the longest one
    s_local = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    token_rows = first + s_local.to(INDEX_DTYPE)
    token_mask = (s_local < seq_len) & (token_rows >= 0) & (token_rows < n_tokens)
    # (varlen: whatever cu_seqlens hold, only rows of the packed tensor are touched)
    cos_a, sin_a, cos_b, sin_b = _cos_sin(
        COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
        stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s,
        ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, BACKWARD, MATH_DTYPE)
    cos_a, sin_a, cos_b, sin_b = cos_a[:, None, :], sin_a[:, None, :], cos_b[:, None, :], sin_b[:, None, :]
    dw_row = (pid_b * n_head_blocks + pid_h) * n_token_blocks + pid_s
    if pid_h < n_head_blocks_q:
        _head_tile(Q, OUT_Q, GQ, Q_W, DW, V, K_CACHE, V_CACHE, K_SCALE, V_SCALE, cos_a, sin_a, cos_b, sin_b,
                   batch_index, token_rows, token_mask, pid_h * BLOCK_H, n_heads_q, eps, weight_offset, dw_row,
                   s_local, s_local, token_mask,
                   sqb, sqs, sqh, sqd, soqb, soqs, soqh, soqd, sgqb, sgqs, sgqh, sgqd, svb, svs, svh, svd,
                   skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_qw,
                   ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                   MATH_DTYPE, INDEX_DTYPE, NORM, WRITE_Q, WRITE_TAIL, 0, False, False, BACKWARD, EVICT)
    elif HAS_K:
        if CACHE != 0:
            if IS_VARLEN:
                token = token_rows
            else:
                token = pid_b.to(tl.int64) * seqlen + s_local
            cache_block, cache_row, cache_mask = _cache_slot(SLOTS, token, s_local, pid_b, token_mask, cache_len,
                                                             block_size, stride_slot, CACHE)
        else:
            cache_block, cache_row, cache_mask = s_local, s_local, token_mask
        _head_tile(K, OUT_K, GK, K_W, DW, V, K_CACHE, V_CACHE, K_SCALE, V_SCALE, cos_a, sin_a, cos_b, sin_b,
                   batch_index, token_rows, token_mask, (pid_h - n_head_blocks_q) * BLOCK_H, n_heads_k, eps,
                   weight_offset, dw_row, cache_block, cache_row, cache_mask,
                   skb, sks, skh, skd, sokb, soks, sokh, sokd, sgkb, sgks, sgkh, sgkd, svb, svs, svh, svd,
                   skcb, skcs, skch, skcd, svcb, svcs, svch, svcd, stride_kw,
                   ROTARY_DIM, HEAD_DIM, V_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, BLOCK_V, INTERLEAVED,
                   MATH_DTYPE, INDEX_DTYPE, NORM, WRITE_K, WRITE_TAIL, CACHE, HAS_V, FP8, BACKWARD, EVICT)


class FusedConfig(NamedTuple):
    block_s: int  # tokens per program
    block_h: int  # heads per program (of q, or of k and v)
    num_warps: int
    evict_first: bool = False  # the streaming hint on activation loads and on every store
    heads_inner: bool = False  # launch order: the head blocks of one token block next to each other


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The launch table, one entry a shape class (:func:`fused_shape_class`): block sizes for the fused kernel. Entries are
# starting points until the sweep ``python -m ropekit.bench.fused_tune`` has measured them; the measured choices, the
# alternatives and their numbers live in docs/tuning.md#fused-launch-table. ``block_h`` is a ceiling: a program never
# takes more heads than the call has (rounded up to a power of two).
FUSED_LAUNCH_TABLE: dict = {
    "decode": FusedConfig(1, 8, 4),  # few tokens: one token a program, so that the grid covers the GPU
    "decode-fp8": FusedConfig(1, 4, 4),
    "decode-wide": FusedConfig(1, 8, 8),  # vectors wider than 128 channels (MLA's latent): more warps
    # prefill: the streaming hint and the heads-inner launch order on (see docs/tuning.md#fused-launch-table)
    "prefill": FusedConfig(2, 8, 4, evict_first=True, heads_inner=True),
    "prefill-norm": FusedConfig(4, 8, 4, evict_first=True, heads_inner=True),  # the norm holds more per program
    "prefill-fp8": FusedConfig(2, 8, 4, evict_first=True, heads_inner=True),
    "prefill-wide": FusedConfig(2, 8, 8),  # fewer tokens a program bound the registers a thread holds
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


def fused_shape_class(n_tokens: int, width: int, fp8: bool = False, norm: bool = False) -> str:
    """The launch table's key for a call: "decode" (at most 128 tokens) or "prefill", "-wide" when a program holds
    head vectors wider than 128 channels (``width``: k's or v's), else "-fp8" for a float8 cache, else "-norm" for
    a prefill with QK-norm (decode has one class: its programs are one token either way)."""
    kind = "decode" if n_tokens <= 128 else "prefill"
    if width > 128:
        return kind + "-wide"
    if fp8:
        return kind + "-fp8"
    return kind + "-norm" if norm and kind == "prefill" else kind


def fused_config(n_tokens: int, n_heads: int, width: int, fp8: bool = False, norm: bool = False) -> FusedConfig:
    """Block sizes for a call: :data:`FUSED_LAUNCH_TABLE` at the call's :func:`fused_shape_class`, heads a program
    capped at the call's (power-of-two) head count; inside :func:`forced_fused_config`, the forced configuration.
    Under the interpreter every program costs Python time: tiles as large as the shape allows."""
    if _forced_fused is not None:
        return _forced_fused
    heads = _next_pow2(n_heads)
    if _device.INTERPRET:
        return FusedConfig(min(_next_pow2(n_tokens), 16), min(heads, 8), 4)
    entry = FUSED_LAUNCH_TABLE[fused_shape_class(n_tokens, width, fp8, norm)]
    return entry._replace(block_h=min(heads, entry.block_h))


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
    gradients ``(dw_q, dw_k)`` in the math dtype; otherwise None.
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
    if config is None:
        config = fused_config(n_batch * seqlen, max(n_heads_q, n_heads_k),
                              max(head_dim, v.shape[-1] if v is not None else 0),
                              fp8=k_cache is not None and k_cache.dtype == torch.uint8,
                              norm=q_weight is not None or k_weight is not None)
    n_blocks_q = _cdiv(n_heads_q, config.block_h)
    n_blocks_s, n_blocks_h = _cdiv(seqlen, config.block_s), n_blocks_q + _cdiv(n_heads_k, config.block_h)
    grid = (n_blocks_s * n_blocks_h, 1, n_batch) if config.heads_inner else (n_blocks_s, n_blocks_h, n_batch)
    dw = None
    if backward:
        dw = torch.zeros((n_batch, n_blocks_h, n_blocks_s, head_dim), dtype=torch.float64 if q.dtype == torch.float64
                         else torch.float32, device=q.device)
    if grid[0] == 0 or n_batch == 0 or n_tokens == 0:
        return None if dw is None else (dw.sum((0, 1, 2)), dw.sum((0, 1, 2)))
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
        BLOCK_HALF=_next_pow2(rotary_dim // 2), BLOCK_TAIL=_next_pow2(max(head_dim - rotary_dim, 1)),
        BLOCK_V=_next_pow2(v_dim), INTERLEAVED=interleaved, POS_MODE=positions.mode,
        IS_VARLEN=positions.is_varlen, COS_PER_TOKEN=cos_per_token, HAS_K=k is not None,
        MATH_DTYPE=_MATH.get(q.dtype, tl.float32),
        INDEX_DTYPE=tl.int32 if _reach_fits_int32(q, k, v, out_q, out_k, grad_q, grad_k, cos, sin, pos)
        else tl.int64,
        NORM=norm, WRITE_Q=write_q, WRITE_K=write_k, WRITE_TAIL=backward or norm or not in_place, CACHE=cache_mode,
        HAS_V=v is not None, FP8=k_cache is not None and k_cache.dtype == torch.uint8, BACKWARD=backward,
        EVICT="evict_first" if config.evict_first else "", HEADS_INNER=config.heads_inner)
    if _device.INTERPRET:
        with _device.INTERPRETER_LOCK:
            fused_rope_kernel[grid](*pointers, *ints, **constexprs, num_warps=config.num_warps)
    else:
        fused_rope_kernel[grid](*pointers, *ints, **constexprs, num_warps=config.num_warps)
    if dw is None:
        return None
    return dw[:, :n_blocks_q].sum((0, 1, 2)), dw[:, n_blocks_q:].sum((0, 1, 2))
