"""The fused kernel's tile helpers (device code): loading and storing a tile of head vectors as pair halves and
a tail, the float8 e4m3 store, the norm's weights and root mean square, where a token goes in a KV cache, and where a
sequence's rows lie. The kernel that composes them is :mod:`ropekit.triton.fused`."""

from __future__ import annotations

import triton
import triton.language as tl

from .v4 import _load_pairs

__all__ = ["e4m3_bits", "store_head", "store_channels", "load_head", "norm_weights", "rsqrt_mean_square",
           "cache_slot", "sequence_span"]


@triton.jit
def e4m3_bits(x):
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
def store_head(OUT, rows, mask, y_a, y_b, y_t, stride_d, scale, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
               INTERLEAVED: tl.constexpr, WRITE_TAIL: tl.constexpr, FP8: tl.constexpr, FP8_NATIVE: tl.constexpr,
               EVICT: tl.constexpr, ATOMIC: tl.constexpr):
    """Store a [BLOCK_S, BLOCK_H] tile of head vectors given as pair halves (and the tail past ROTARY_DIM), cast to
    OUT's dtype, or with FP8 as the e4m3 bits of ``value / scale`` into a uint8 view of the cache; with ATOMIC, add
    them to what OUT holds."""
    if INTERLEAVED:
        channels = tl.arange(0, 2 * BLOCK_HALF)
        y = tl.reshape(tl.join(y_a, y_b), [BLOCK_S, BLOCK_H, 2 * BLOCK_HALF])
        store_channels(OUT, rows, channels, y, mask[:, :, None] & (channels < ROTARY_DIM)[None, None, :],
                       stride_d, scale, FP8, FP8_NATIVE, EVICT, ATOMIC)
    else:
        pairs = tl.arange(0, BLOCK_HALF)
        pair_mask = mask[:, :, None] & (pairs < ROTARY_DIM // 2)[None, None, :]
        store_channels(OUT, rows, pairs, y_a, pair_mask, stride_d, scale, FP8, FP8_NATIVE, EVICT, ATOMIC)
        store_channels(OUT, rows, pairs + ROTARY_DIM // 2, y_b, pair_mask, stride_d, scale, FP8, FP8_NATIVE, EVICT,
                       ATOMIC)
    if WRITE_TAIL and ROTARY_DIM < HEAD_DIM:
        tail = ROTARY_DIM + tl.arange(0, BLOCK_TAIL)
        tail_mask = mask[:, :, None] & (tail < HEAD_DIM)[None, None, :]
        store_channels(OUT, rows, tail, y_t, tail_mask, stride_d, scale, FP8, FP8_NATIVE, EVICT, ATOMIC)


@triton.jit
def store_channels(OUT, rows, channels, values, mask, stride_d, scale, FP8: tl.constexpr,
                   FP8_NATIVE: tl.constexpr, EVICT: tl.constexpr, ATOMIC: tl.constexpr):
    """Store values (FP8: the e4m3 bits of ``values / scale``, computed by :func:`e4m3_bits`, or with FP8_NATIVE
    by the GPU's own saturating round-to-nearest-even conversion, which gives the same bits); with ATOMIC, add them
    to OUT's values (an unordered sum: its rounding depends on the order the adds arrive in)."""
    pointers = OUT + rows[:, :, None] + channels[None, None, :] * stride_d
    if ATOMIC:
        tl.atomic_add(pointers, values.to(OUT.dtype.element_ty), mask=mask, sem="relaxed")
    elif FP8:
        # (x / scale) correctly rounded to fp32, then to e4m3: the quotient the float64 reference rounds
        quotient = tl.div_rn(values.to(tl.float32), scale)
        if FP8_NATIVE:
            bits = quotient.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            bits = e4m3_bits(quotient)
        tl.store(pointers, bits, mask=mask, eviction_policy=EVICT)
    else:
        tl.store(pointers, values.to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)


@triton.jit
def load_head(X, rows, mask, stride_d, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
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
def norm_weights(W, stride_w, weight_offset, ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
                 MATH_DTYPE: tl.constexpr):
    """The norm's per-channel factor ``weight_offset + w`` laid out like a [1, 1] tile of head vectors."""
    origin = tl.zeros([1, 1], dtype=tl.int32)
    everywhere = origin == 0
    w_a, w_b, w_t = load_head(W, origin, everywhere, stride_w, ROTARY_DIM, HEAD_DIM, 1, 1, BLOCK_HALF, BLOCK_TAIL,
                              INTERLEAVED, MATH_DTYPE, "")
    return w_a + weight_offset, w_b + weight_offset, w_t + weight_offset


@triton.jit
def rsqrt_mean_square(x_a, x_b, x_t, eps, HEAD_DIM: tl.constexpr, MATH_DTYPE: tl.constexpr):
    """``1 / sqrt(mean(x^2) + eps)`` per head vector, [BLOCK_S, BLOCK_H, 1] (a correctly rounded square root:
    ``sqrt_rn`` in fp32; fp64's ``sqrt`` already is)."""
    squares = tl.sum(x_a * x_a, 2) + tl.sum(x_b * x_b, 2) + tl.sum(x_t * x_t, 2)
    if MATH_DTYPE == tl.float64:
        root = tl.sqrt(squares / HEAD_DIM + eps)
    else:
        root = tl.sqrt_rn(squares / HEAD_DIM + eps)
    return (1.0 / root)[:, :, None]


@triton.jit
def cache_slot(SLOTS, BATCH_INDICES, KV_INDICES, KV_INDPTR, slot_stride, page_table, token, s_local, pid_b, mask,
               cache_len, block_size, CACHE: tl.constexpr):
    """The address map: where each token of the tile goes in the cache, as (block or sequence, row inside it) and
    whether it is written at all. Where the head axis lies (NHD or HND) is the cache's strides, not this map's.

    * CACHE 1, contiguous: sequence ``pid_b`` at its offset ``SLOTS[pid_b]`` plus the token's index, inside
      ``cache_len`` rows.
    * CACHE 2, slots (vLLM's ``slot_mapping``): ``slot = SLOTS[token]``, block ``slot // block_size``, row
      ``slot % block_size``; -1 (any slot outside the ``cache_len`` slots) writes nothing.
    * CACHE 3, a page table (FlashInfer's): request ``b = BATCH_INDICES[token]`` (-1 writes nothing), position
      ``p = SLOTS[token]`` in it; its pages are ``KV_INDICES[KV_INDPTR[b]:KV_INDPTR[b + 1]]``, so the block is
      ``KV_INDICES[KV_INDPTR[b] + p // block_size]`` and the row ``p % block_size``. Only entries of the request's
      own span of KV_INDICES are read and only blocks among the ``cache_len // block_size`` are written.
      ``page_table``: (BATCH_INDICES' stride, KV_INDICES' stride, KV_INDPTR's stride, KV_INDICES' length, the
      number of requests).
    """
    if CACHE == 1:
        row = tl.load(SLOTS + pid_b * slot_stride).to(tl.int64) + s_local.to(tl.int64)
        block = tl.zeros_like(row) + pid_b
        written = mask & (row >= 0) & (row < cache_len)
    elif CACHE == 2:
        slot = tl.load(SLOTS + token.to(tl.int64) * slot_stride, mask=mask, other=-1).to(tl.int64)
        written = mask & (slot >= 0) & (slot < cache_len)
        slot = tl.where(written, slot, 0)
        block = slot // block_size
        row = slot % block_size
    else:
        token = token.to(tl.int64)
        request = tl.load(BATCH_INDICES + token * page_table[0], mask=mask, other=-1).to(tl.int64)
        position = tl.load(SLOTS + token * slot_stride, mask=mask, other=-1).to(tl.int64)
        written = mask & (request >= 0) & (request < page_table[4]) & (position >= 0)
        request = tl.where(written, request, 0)
        position = tl.where(written, position, 0)
        first = tl.load(KV_INDPTR + request * page_table[2], mask=written, other=0).to(tl.int64)
        end = tl.load(KV_INDPTR + (request + 1) * page_table[2], mask=written, other=0).to(tl.int64)
        page_iter = first + position // block_size
        written = written & (page_iter >= 0) & (page_iter < end) & (page_iter < page_table[3])
        page = tl.load(KV_INDICES + tl.where(written, page_iter, 0) * page_table[1], mask=written,
                       other=-1).to(tl.int64)
        written = written & (page >= 0) & (page < cache_len // block_size)
        block = tl.where(written, page, 0)
        row = position % block_size
    return block, row, written


@triton.jit
def sequence_span(CU_SEQLENS, pid_b, seqlen, IS_VARLEN: tl.constexpr, INDEX_DTYPE: tl.constexpr):
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
