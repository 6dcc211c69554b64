"""The fused kernel's tile helpers (device code): loading and storing a tile of head vectors as pair halves and
a tail, the quantising store (float8 e4m3/e5m2, int8; per-tensor, per-head or per-(token, head) scales; NVFP4), the
norm's weights and root mean square, where a token goes in a KV cache, and where a sequence's rows lie. The kernel
that composes them is :mod:`ropekit.triton.fused`."""

from __future__ import annotations

import triton
import triton.language as tl

from .v4 import _load_pairs

__all__ = ["PLAIN", "E4M3", "E5M2", "INT8", "NVFP4", "PER_TENSOR", "PER_HEAD", "PER_TOKEN_HEAD", "PER_BLOCK",
           "PER_TILE", "TILE_CHANNELS", "store_tiles",
           "NO_QUANT", "STORE_PLAIN", "float8_bits", "e4m3_bits", "e4m3_of", "e4m3_value", "e2m1_codes", "int8_values",
           "divided", "reciprocal", "quantised", "one_scale", "head_amax", "channels_amax", "read_scale", "cache_scale",
           "head_scale", "channels_scale", "store_reduced", "store_head", "store_channels", "store_nvfp4", "load_head",
           "norm_weights", "channel_dot", "group_sum", "rsqrt_mean_square", "normed", "NO_NORM", "BEFORE", "AFTER",
           "NORM_OFF", "NORM_NONE_C", "NORM_BEFORE_C", "NORM_AFTER_C", "norm_switch", "cache_slot", "sequence_span"]


# A store (an output, or a cache) travels as one tuple: (tensor, its strides, the scale, the scale's strides, the
# global scale), the last three read by the quantising stores only (None, or constants, where a store has no scale).
#
# The cache's store, one constexpr tuple QUANT = (FORMAT, SCALES, NATIVE):
#   FORMAT: PLAIN (the cache's own dtype, no scale), E4M3, E5M2 (float8 bits in a uint8 view), INT8, NVFP4 (e2m1
#           values, two a byte, element 2i in the low nibble);
#   SCALES: PER_TENSOR (one float32), PER_HEAD (one a kv head), PER_TOKEN_HEAD (computed here from the head vector's
#           absolute maximum and written beside the cache), PER_BLOCK (NVFP4's: an e4m3 scale computed for each 16
#           consecutive channels and written beside the cache, over one float32 global scale read), PER_TILE
#           (DeepSeek's fp8_ds_mla: a float32 scale computed for each TILE_CHANNELS consecutive channels of a head
#           vector, as PER_TOKEN_HEAD computes one for the whole vector, and written beside the cache);
#   NATIVE: float8 bits (the values, or NVFP4's e4m3 block scales) and int8 values by the GPU's own conversion
#           instructions rather than integer arithmetic (the same bits).
# A per-tensor scale is one float; the others are addressed alike, SCALE + block * strides[0] + row * strides[1] +
# head * strides[2] (a per-head one with strides (0, 0, stride); NVFP4's block scales and the tiles' scales then + the
# block's or tile's index): the store's scale, its strides and its global scale serve every mode.
PLAIN, E4M3, E5M2, INT8, NVFP4 = 0, 1, 2, 3, 4
PER_TENSOR, PER_HEAD, PER_TOKEN_HEAD, PER_BLOCK, PER_TILE = 0, 1, 2, 3, 4
TILE_CHANNELS = 128
NO_QUANT = (PLAIN, PER_TENSOR, False)
# the same, as device code reads globals (constexprs); STORE_PLAIN: an output stored in its own dtype
_PLAIN, _E5M2, _INT8, _NVFP4, _PER_TENSOR, _PER_HEAD, _PER_TOKEN_HEAD, _PER_BLOCK, _PER_TILE = (
    tl.constexpr(c) for c in (PLAIN, E5M2, INT8, NVFP4, PER_TENSOR, PER_HEAD, PER_TOKEN_HEAD, PER_BLOCK, PER_TILE))
_TILE_C = tl.constexpr(TILE_CHANNELS)
STORE_PLAIN = tl.constexpr(NO_QUANT)

# The norm, one constexpr tuple NORM = (PLACE, WEIGHTED, OVER_HEADS):
#   PLACE: NO_NORM; BEFORE the rotation (Qwen3's and Gemma 3's QK-norm); AFTER it (Llama 4's, on the rotated vector);
#   WEIGHTED: the norm multiplies by ``weight_offset + w`` per channel; without weights it is x * rsqrt(mean(x^2) + eps)
#             (Llama 4's weightless L2 norm);
#   OVER_HEADS: what the mean square runs over (:func:`rsqrt_mean_square`): each head vector's HEAD_DIM channels
#             (False), or all n_heads x HEAD_DIM channels of a token's q (or k) projection (True: OLMo-2's and the
#             video diffusion models' QK-norm; the weights are then ``(n_heads * HEAD_DIM,)``, head h's channels at
#             h * HEAD_DIM, and a program holds every head of its tokens).
NO_NORM, BEFORE, AFTER = 0, 1, 2
NORM_OFF = (NO_NORM, False, False)
# (as device code reads them)
NORM_NONE_C, NORM_BEFORE_C, NORM_AFTER_C = (tl.constexpr(c) for c in (NO_NORM, BEFORE, AFTER))


def norm_switch(place: int, weighted: bool, over_heads: bool = False) -> tuple:
    """The kernels' NORM for a norm at ``place`` (NO_NORM, BEFORE, AFTER), with weights or without, over each head
    vector or over all heads of a token."""
    return (place, bool(weighted), bool(over_heads)) if place != NO_NORM else NORM_OFF


@triton.jit
def float8_bits(x, MANTISSA: tl.constexpr, BIAS: tl.constexpr, MAX_BITS: tl.constexpr):
    """The float8 bits (uint8) of fp32 ``x`` in a format of MANTISSA bits and exponent bias BIAS whose largest
    finite value has the fp32 bits MAX_BITS (e4m3fn: 3, 7, 448.0; e5m2: 2, 15, 57344.0): round to nearest even,
    saturate at the largest finite value (infinities too), NaN stays NaN (all ones but the sign). Integer arithmetic
    on the fp32 bits, so the GPU and the interpreter give the same bits."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    is_nan = magnitude > 0x7F800000
    magnitude = tl.minimum(magnitude, MAX_BITS)
    exponent = magnitude >> 23
    # normal (|x| >= 2**(1 - BIAS)): keep MANTISSA bits, rebias the exponent from 127 to BIAS
    normal = ((magnitude + ((1 << (22 - MANTISSA)) - 1) + ((magnitude >> (23 - MANTISSA)) & 1)) >> (23 - MANTISSA)) \
        - ((127 - BIAS) << MANTISSA)
    # subnormal: m * 2**(1 - BIAS - MANTISSA), m = round(|x| / that) from the 24-bit significand
    significand = (magnitude & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum((151 - BIAS - MANTISSA) - exponent.to(tl.int32), 1), 25).to(tl.uint32)
    subnormal = (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift
    code = tl.where(exponent >= 128 - BIAS, normal, subnormal)
    code = tl.where(is_nan, 0x7F, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def e4m3_bits(x):
    """The float8 e4m3fn bits (uint8) of fp32 ``x``: round to nearest even, saturate at ±448 (infinities too), NaN
    stays NaN."""
    return float8_bits(x, 3, 7, 0x43E00000)


@triton.jit
def e4m3_of(x, NATIVE: tl.constexpr):
    """The float8 e4m3fn bits (uint8) of fp32 ``x``: with NATIVE the GPU's saturating conversion, else
    :func:`e4m3_bits` (the same bits)."""
    if NATIVE:
        bits = x.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        bits = e4m3_bits(x)
    return bits


@triton.jit
def e5m2_native(x):
    """The float8 e5m2 bits (uint8) of fp32 ``x`` by the GPU's saturating conversion: the bits :func:`float8_bits`
    gives. The conversion gives a NaN 0x7F whatever its sign; the value's sign bit, which every other code already
    carries, makes it the integer rounding's (all ones but the sign). One value a conversion, its code widened to 32
    bits in the same assembly block: Triton's own conversion packs two codes into 16 bits, and the sign's OR then
    takes the pair apart again, which ptxas (Triton 3.6's, sm_90) miscompiles where a thread holds two values: it
    shifted the stack pointer's bits into every other byte (tools/compile_sm90.py checks the SASS for that). A
    block of two or four values, which packs as the hardware converts, waits for all of them, and a decode step,
    which is its chain of latencies, was slower so (docs/tuning.md#fused-launch-table)."""
    code = tl.inline_asm_elementwise("{ .reg .b16 t; cvt.rn.satfinite.e5m2x2.f32 t, 0f00000000, $1; "
                                     "cvt.u32.u16 $0, t; }", "=r,r", [x], dtype=tl.uint32, is_pure=True, pack=1)
    return (code | ((x.to(tl.uint32, bitcast=True) >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def e4m3_value(code):
    """The fp32 value of float8 e4m3fn bits (uint8, not NaN): ``2^(e-7) (1 + m/8)``, or ``2^-6 m/8`` for ``e = 0``."""
    code = code.to(tl.uint32)
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)
    return tl.where((code & 0x80) != 0, -value, value)


@triton.jit
def e2m1_codes(x):
    """The e2m1 nibbles (uint8, 0-15) of fp32 ``x``: sign in bit 3 (x's sign bit), magnitude code 0-7 for 0, 0.5, 1,
    1.5, 2, 3, 4, 6; to nearest, ties to the even code, saturating at 6 (infinities too); NaN gives a zero of its
    sign. e2m1's magnitudes are a float format of one mantissa bit: spacing 0.5 below 2, 1 below 4, 2 from 4. The
    magnitude added to 1.5 * 2**22, 2**23 or 2**24 (whose fp32 spacing is e2m1's there: 0.5, 1, 2) plus the codes
    below its range (0, 2, 4, in units of that spacing) rounds, ties to even, to the code in the sum's low mantissa
    bits: one rounding, the same on the GPU and the interpreter."""
    m = tl.abs(x)
    m = tl.where(m > 6.0, 6.0, m)
    base = tl.where(m < 2.0, 6291456.0, tl.where(m < 4.0, 12582912.0 + 2.0, 25165824.0 + 8.0))
    code = (m + base).to(tl.uint32, bitcast=True) & 7
    code = tl.where(m == m, code, 0)  # NaN fails every comparison above
    sign = (x.to(tl.uint32, bitcast=True) >> 28) & 0x8
    return (code | sign).to(tl.uint8)


@triton.jit
def int8_values(x, NATIVE: tl.constexpr):
    """fp32 ``x`` rounded to the nearest integer (ties to even), saturating at [-128, 127]; NaN gives 0. With NATIVE
    the GPU's saturating conversion, one instruction an element (``cvt.rni.sat.s8.f32``). Otherwise: adding
    1.5 * 2**23 leaves no fraction bits in an fp32 of magnitude below 2**22, so the add itself rounds to the nearest
    integer, ties to even, and subtracting it back is exact: one rounding, the same on the GPU and the interpreter."""
    if NATIVE:
        stored = tl.inline_asm_elementwise("cvt.rni.sat.s8.f32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True,
                                           pack=1).to(tl.int8)
    else:
        x = tl.where(x != x, 0.0, x)
        x = tl.where(x > 127.0, 127.0, tl.where(x < -128.0, -128.0, x))
        stored = ((x + 12582912.0) - 12582912.0).to(tl.int8)
    return stored


@triton.jit
def divided(x, scale, NATIVE_RECIPROCAL: tl.constexpr):
    """fp32 ``x / scale`` correctly rounded, as the division would give, without the division's per-element
    instruction sequence: the reciprocal once per scale (``scale`` one float or [..., 1]), then per element a product
    and one correction. ``guess = x * (1 / scale)`` is within an ulp of the quotient, ``residual = x - guess *
    scale`` is exact in one fma, and ``guess + residual * (1 / scale)`` rounds to the correctly rounded quotient
    (Markstein's theorem: the reciprocal correctly rounded, no underflow). A scale of magnitude below 2**-100 is
    first multiplied, with x, by 2**64 (exact: a power of two), so that its reciprocal does not overflow. Where the
    residual is not a finite nonzero number (x or the quotient infinite or NaN, a zero scale) the product already is
    the quotient. A finite x whose product with the reciprocal overflows has an infinite residual, and the correction
    then gives NaN: a quotient past float32's range is stored as NaN (float8, NVFP4's zero), or 0 (int8), where the
    division would saturate. Every guard of that case measured slower on the H200's float8 decode step (1.036-1.046x,
    docs/tuning.md#fused-launch-table), and a cache is not quantised at scales that take activations past 3.4e38.

    NATIVE_RECIPROCAL (a GPU's code, for a store with a scale every few values: NVFP4's 16): the reciprocal is
    :func:`reciprocal`'s, without the division's instruction sequence; a scale above 2**100 is then first multiplied,
    with x, by 2**-64, so that its reciprocal stays in the normal range. Once a program, the division itself measured
    faster (docs/tuning.md#fused-launch-table)."""
    magnitude = tl.abs(scale)
    factor = tl.where(magnitude < 7.888609052210118e-31, 1.8446744073709552e19, 1.0)
    if NATIVE_RECIPROCAL:
        factor = tl.where(magnitude > 1.2676506002282294e30, 5.421010862427522e-20, factor)
    scale = scale * factor
    x = x * factor
    inverse = reciprocal(scale, NATIVE_RECIPROCAL)
    guess = x * inverse
    residual = tl.fma(-guess, scale, x)
    return tl.where((residual > 0) | (residual < 0), tl.fma(residual, inverse, guess), guess)


@triton.jit
def reciprocal(scale, NATIVE: tl.constexpr):
    """``1 / scale`` rounded to fp32. Without NATIVE, the division: correctly rounded for every scale. NATIVE (a
    GPU's code): the GPU's approximate reciprocal (within an ulp) refined by one Newton step,
    ``r + r * (1 - scale * r)`` in two fmas, correctly rounded for every scale of magnitude in [2**-126, 2**126)
    (each of them checked against the division on the GPU: tests/test_fused_quant.py). A zero, infinite or NaN
    scale keeps the approximate reciprocal (infinite, zero, NaN), the division's. Outside that range the
    instruction flushes: a scale of magnitude from 2**126 gets 0 (the division: a subnormal), a subnormal scale NaN
    (its input flushed to zero, the step's error infinite). :func:`divided` rescales both ranges first."""
    if NATIVE:
        approximate = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [scale], dtype=tl.float32,
                                                is_pure=True, pack=1)
        error = tl.fma(-scale, approximate, 1.0)
        inverse = tl.where(error == error, tl.fma(approximate, error, approximate), approximate)
    else:
        inverse = tl.div_rn(1.0, scale)
    return inverse


@triton.constexpr_function
def one_scale(quant):
    """Whether a store ``quant`` divides every value by one float: float8 or int8 at a per-tensor scale (a float8
    q's, or a cache's). A rotated tile stored so turns by angles scaled by the reciprocal instead
    (ropekit.triton.fused: each value is then stored without a division of its own)."""
    return quant[0] in (E4M3, E5M2, INT8) and quant[1] == PER_TENSOR


@triton.jit
def quantised(values, scale, QUANT: tl.constexpr):
    """``values / scale`` (the quotient correctly rounded to fp32: the one the float64 reference rounds) in QUANT's
    format: float8 bits, or int8 values; ``scale`` None: the values are the quotients already."""
    if scale is None:
        quotient = values.to(tl.float32)
    else:
        quotient = divided(values.to(tl.float32), scale, False)
    if QUANT[0] == _INT8:
        stored = int8_values(quotient, QUANT[2])
    elif QUANT[0] == _E5M2:
        if QUANT[2]:
            stored = e5m2_native(quotient)
        else:
            stored = float8_bits(quotient, 2, 15, 0x47600000)
    else:
        stored = e4m3_of(quotient, QUANT[2])
    return stored


@triton.jit
def format_max(QUANT: tl.constexpr):
    """The largest value QUANT's format stores: what a per-(token, head) scale maps the head's absolute maximum to."""
    largest = 448.0
    if QUANT[0] == _INT8:
        largest = 127.0
    elif QUANT[0] == _E5M2:
        largest = 57344.0
    return largest


@triton.jit
def channels_amax(values, mask):
    """The largest ``|value|`` over the last axis where ``mask`` holds, NaN not counted ([..., 1])."""
    magnitude = tl.where(mask & (values == values), tl.abs(values), 0.0)
    return tl.max(magnitude, 2, keep_dims=True)


@triton.jit
def head_amax(y_a, y_b, y_t, HEAD: tl.constexpr):
    """The largest ``|value|`` of each head vector given as pair halves and a tail ([BLOCK_S, BLOCK_H, 1]; padding
    channels and NaN not counted): the reduction QK-norm's mean square makes, on the rotated values."""
    pairs = (tl.arange(0, HEAD.BLOCK_HALF) < HEAD.ROTARY_DIM // 2)[None, None, :]
    amax = tl.maximum(channels_amax(y_a, pairs), channels_amax(y_b, pairs))
    if HEAD.ROTARY_DIM < HEAD.HEAD_DIM:
        tail = HEAD.ROTARY_DIM + tl.arange(0, HEAD.BLOCK_TAIL)
        amax = tl.maximum(amax, channels_amax(y_t, (tail < HEAD.HEAD_DIM)[None, None, :]))
    return amax


@triton.jit
def read_scale(store, heads, head_mask, QUANT: tl.constexpr, SMALL_GRID: tl.constexpr):
    """The scale a store reads rather than computes: PER_TENSOR's (one float), NVFP4's global scale (one float), and
    in a SMALL_GRID PER_HEAD's (one a head of ``heads``, [1, BLOCK_H, 1]: its strides are (0, 0, head stride)); None
    for PER_HEAD's elsewhere, which :func:`cache_scale` then loads at the store; else 1.0. Its address is known where
    the program starts: loaded there, it is in flight with the tile instead of a round trip after the rotation. A
    small grid's time is that chain of round trips; in a large one the per-head load made the prefill slower
    (docs/tuning.md#fused-launch-table). ``store``: (tensor, strides, scale, the scale's (block, row, head) strides,
    NVFP4's global scale)."""
    scale = 1.0
    if QUANT[0] != _PLAIN:
        if QUANT[1] == _PER_TENSOR:
            scale = tl.load(store[2])
        elif QUANT[1] == _PER_HEAD:
            if SMALL_GRID:
                scale = tl.load(store[2] + heads * store[3][2], mask=head_mask, other=1.0)[None, :, None]
            else:
                scale = None
        elif QUANT[1] == _PER_BLOCK:
            scale = tl.load(store[4])
    return scale


@triton.jit
def store_reduced(pointers, values, mask, NATIVE: tl.constexpr):
    """Store a reduction's result (a per-(token, head) scale, NVFP4's block scales: float32 or 8-bit values) from
    the registers that hold it. Triton gives every ``tl.store`` a layout of its own, chosen for coalescing, and a
    reduced tensor's layout is not one: the store then converts the values through shared memory, with barriers
    across the program's warps, on a decode step's critical path. With NATIVE (the store's QUANT[2]: a GPU that
    converts to float8 itself, compute capability 8.9 on) each thread holding a value stores it with one
    ``st.global`` in the values' own layout (threads holding the same value store the same bytes); elsewhere, the
    interpreter (which runs no PTX) included, ``tl.store``."""
    if NATIVE:
        # (the address as an integer: inline assembly's operands are broadcast together, and a pointer does not
        # combine with a float)
        address, flag = pointers.to(tl.int64), mask.to(tl.int32)
        if values.dtype == tl.float32:
            asm: tl.constexpr = "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }"
            tl.inline_asm_elementwise(asm, "=r,l,f,r", [address, values, flag], dtype=tl.int32, is_pure=False, pack=1)
        else:
            asm: tl.constexpr = "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.b8 [$1], $2; mov.u32 $0, 0; }"
            tl.inline_asm_elementwise(asm, "=r,l,r,r", [address, values.to(tl.int32), flag], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        tl.store(pointers, values, mask=mask)


@triton.jit
def cache_scale(store, block, row, heads, mask, amax, read, QUANT: tl.constexpr):
    """The scale a tile of head vectors is stored at (one float, or [BLOCK_S, BLOCK_H, 1]): the one :func:`read_scale`
    loaded (``read``: PER_TENSOR's scale, PER_HEAD's in a small grid, NVFP4's global scale), one read here (PER_HEAD
    where ``read`` is None), or ``max(amax / format max, smallest normal float32)`` written at the tile's (block, row,
    head) where ``mask`` holds (PER_TOKEN_HEAD; the floor keeps an all-zero head's scale finite and nonzero); for NVFP4
    (PER_BLOCK) the global scale read and where the tile's block scales go ([BLOCK_S, BLOCK_H] pointers), written by
    :func:`store_nvfp4`. ``store``: as :func:`read_scale`'s; ``block``, ``row``: [BLOCK_S]; ``amax``: the head vectors'
    absolute maxima, read only for PER_TOKEN_HEAD."""
    if QUANT[1] == _PER_TENSOR or (QUANT[1] == _PER_HEAD and read is not None):
        scale = read
    else:
        SCALE, strides = store[2], store[3]
        pointers = SCALE + block[:, None] * strides[0] + row[:, None] * strides[1] + heads[None, :] * strides[2]
        if QUANT[1] == _PER_HEAD:
            scale = tl.load(pointers, mask=mask, other=1.0)[:, :, None]
        elif QUANT[1] == _PER_TOKEN_HEAD:
            scale = tl.maximum(tl.div_rn(amax, format_max(QUANT)), 1.1754943508222875e-38)
            store_reduced(pointers[:, :, None], scale, mask[:, :, None], QUANT[2])
        else:
            scale = (read, pointers)
    return scale


@triton.jit
def head_scale(store, block, row, heads, mask, read, y_a, y_b, y_t, HEAD: tl.constexpr, QUANT: tl.constexpr):
    """The scale a tile of head vectors (pair halves and tail, rotated) is stored at: 1.0 for a store in the cache's
    own dtype, else :func:`cache_scale` (per (token, head): from the vectors' absolute maxima, written; ``read``: what
    :func:`read_scale` loaded)."""
    scale = 1.0
    if QUANT[0] != _PLAIN:
        amax = 0.0
        if QUANT[1] == _PER_TOKEN_HEAD:
            amax = head_amax(y_a, y_b, y_t, HEAD).to(tl.float32)
        scale = cache_scale(store, block, row, heads, mask, amax, read, QUANT)
    return scale


@triton.jit
def channels_scale(store, block, row, heads, mask, read, values, channel_mask, QUANT: tl.constexpr):
    """:func:`head_scale` for head vectors given as one run of channels (v's), ``channel_mask`` their extent."""
    scale = 1.0
    if QUANT[0] != _PLAIN:
        amax = 0.0
        if QUANT[1] == _PER_TOKEN_HEAD:
            amax = channels_amax(values.to(tl.float32), channel_mask)
        scale = cache_scale(store, block, row, heads, mask, amax, read, QUANT)
    return scale


@triton.jit
def store_head(OUT, rows, mask, y_a, y_b, y_t, stride_d, scale, HEAD: tl.constexpr, BLOCK_S: tl.constexpr,
               BLOCK_H: tl.constexpr, WRITE_TAIL: tl.constexpr, QUANT: tl.constexpr, EVICT: tl.constexpr,
               ATOMIC: tl.constexpr, SCALED: tl.constexpr):
    """Store a [BLOCK_S, BLOCK_H] tile of head vectors given as pair halves (and the tail past ROTARY_DIM), cast to
    OUT's dtype, or quantised at ``scale`` as QUANT says (:func:`store_channels`); with ATOMIC, add them to what
    OUT holds. SCALED: the pair halves are the quotients already (rotated by angles over the scale), the tail is
    divided here."""
    pairs_scale = None if SCALED else scale
    if HEAD.INTERLEAVED:
        channels = tl.arange(0, 2 * HEAD.BLOCK_HALF)
        CHANNELS: tl.constexpr = 2 * HEAD.BLOCK_HALF  # (a shape's extents are constexprs, not fields)
        y = tl.reshape(tl.join(y_a, y_b), [BLOCK_S, BLOCK_H, CHANNELS])
        store_channels(OUT, rows, 0, y, mask[:, :, None] & (channels < HEAD.ROTARY_DIM)[None, None, :], stride_d,
                       pairs_scale, QUANT, EVICT, ATOMIC)
    else:
        pairs = tl.arange(0, HEAD.BLOCK_HALF)
        pair_mask = mask[:, :, None] & (pairs < HEAD.ROTARY_DIM // 2)[None, None, :]
        store_channels(OUT, rows, 0, y_a, pair_mask, stride_d, pairs_scale, QUANT, EVICT, ATOMIC)
        store_channels(OUT, rows, HEAD.ROTARY_DIM // 2, y_b, pair_mask, stride_d, pairs_scale, QUANT, EVICT, ATOMIC)
    if WRITE_TAIL and HEAD.ROTARY_DIM < HEAD.HEAD_DIM:
        tail = HEAD.ROTARY_DIM + tl.arange(0, HEAD.BLOCK_TAIL)
        tail_mask = mask[:, :, None] & (tail < HEAD.HEAD_DIM)[None, None, :]
        store_channels(OUT, rows, HEAD.ROTARY_DIM, y_t, tail_mask, stride_d, scale, QUANT, EVICT, ATOMIC)


@triton.jit
def store_channels(OUT, rows, FIRST: tl.constexpr, values, mask, stride_d, scale, QUANT: tl.constexpr,
                   EVICT: tl.constexpr, ATOMIC: tl.constexpr):
    """Store values ([BLOCK_S, BLOCK_H, C], the channels from FIRST on): cast to OUT's dtype, or with a quantising
    QUANT (:func:`quantised`) the format's bits of ``values / scale`` (``scale`` one float or [BLOCK_S, BLOCK_H, 1];
    NVFP4: :func:`store_nvfp4`); with ATOMIC, add them to OUT's values (an unordered sum: its rounding depends on
    the order the adds arrive in)."""
    if QUANT[0] == _NVFP4:
        store_nvfp4(OUT, rows, FIRST, values, mask, stride_d, scale, QUANT[2], EVICT)
    elif QUANT[1] == _PER_TILE:
        store_tiles(OUT, rows, FIRST, values, mask, stride_d, scale[1], QUANT, EVICT)
    else:
        channels = FIRST + tl.arange(0, values.shape[2])
        pointers = OUT + rows[:, :, None] + channels[None, None, :] * stride_d
        if ATOMIC:
            tl.atomic_add(pointers, values.to(OUT.dtype.element_ty), mask=mask, sem="relaxed")
        elif QUANT[0] != _PLAIN:
            tl.store(pointers, quantised(values, scale, QUANT), mask=mask, eviction_policy=EVICT)
        else:
            tl.store(pointers, values.to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)


@triton.jit
def store_nvfp4(OUT, rows, FIRST: tl.constexpr, values, mask, stride_d, scale, NATIVE: tl.constexpr,
                EVICT: tl.constexpr):
    """NVFP4: a run of channels (from FIRST, a multiple of 16 of them from a multiple of 16) as e2m1 nibbles two a
    byte (channel 2i in the low nibble of byte i of OUT's row) and one e4m3 block scale for each 16 channels,
    ``block = e4m3(amax / (6 * global))`` (amax over the 16 channels, NaN not counted), written at the row's
    block-scale pointer + the block's index. Each value stores ``e2m1(x / (block * global))`` (the product and the
    quotient rounded to fp32; a zero block scale stores zeros of the values' signs). ``scale``: (the global scale,
    [BLOCK_S, BLOCK_H] block-scale pointers), from :func:`cache_scale`; NATIVE: the block scale converted by the GPU's
    float8 instruction. ``mask`` is the same over each 16-channel block (the validation keeps NVFP4's blocks whole):
    the stores' mask is declared so."""
    global_scale, BLOCK_SCALES = scale
    S: tl.constexpr = values.shape[0]
    H: tl.constexpr = values.shape[1]
    C: tl.constexpr = values.shape[2]
    x = tl.reshape(values.to(tl.float32), [S, H, C // 16, 16])
    in_block = tl.reshape(mask, [S, H, C // 16, 16])
    # one reduction gives each block's absolute maximum and whether the block is written (-1: masked)
    largest = tl.max(tl.where(in_block, tl.where(x == x, tl.abs(x), 0.0), -1.0), 3)
    amax = tl.maximum(largest, 0.0)
    block_bits = e4m3_of(tl.div_rn(amax, 6.0 * global_scale), NATIVE)
    dequant = (e4m3_value(block_bits) * global_scale)[:, :, :, None]
    quotient = divided(x, tl.where(dequant == 0.0, 1.0, dequant), NATIVE)
    quotient = tl.where(dequant == 0.0, x * 0.0, quotient)
    low, high = tl.split(tl.reshape(e2m1_codes(quotient), [S, H, C // 2, 2]))
    byte_mask, _ = tl.split(tl.reshape(in_block, [S, H, C // 2, 2]))
    byte_mask = tl.max_constancy(byte_mask, [1, 1, 8])  # whole 16-channel blocks are masked (the validation's rule)
    first_byte: tl.constexpr = FIRST // 2  # a run starts at a multiple of 16 channels: a multiple of 8 bytes
    tl.store(OUT + rows[:, :, None] + (first_byte + tl.arange(0, C // 2))[None, None, :] * stride_d, low | (high << 4),
             mask=byte_mask, eviction_policy=EVICT)
    store_reduced(BLOCK_SCALES[:, :, None] + (first_byte // 8 + tl.arange(0, C // 16))[None, None, :], block_bits,
                  largest >= 0.0, NATIVE)


@triton.jit
def store_tiles(OUT, rows, FIRST: tl.constexpr, values, mask, stride_d, SCALES, QUANT: tl.constexpr,
                EVICT: tl.constexpr):
    """PER_TILE: a run of channels (from FIRST, whole tiles of TILE_CHANNELS from a multiple of it) in QUANT's format,
    each tile at its own scale ``max(amax / format max, smallest normal float32)`` (amax over the tile, NaN not
    counted: :func:`cache_scale`'s per-(token, head) rule, a tile for the head vector), written as float32 at the
    row's scale pointer (``SCALES``, [BLOCK_S, BLOCK_H]) + the tile's index; each value stores the format's bits of
    ``x / scale`` (:func:`quantised`). ``mask`` is the same over each tile (the validation keeps the tiles whole)."""
    S: tl.constexpr = values.shape[0]
    H: tl.constexpr = values.shape[1]
    C: tl.constexpr = values.shape[2]
    T: tl.constexpr = C // _TILE_C
    x = tl.reshape(values.to(tl.float32), [S, H, T, _TILE_C])
    in_tile = tl.reshape(mask, [S, H, T, _TILE_C])
    # one reduction gives each tile's absolute maximum and whether the tile is written (-1: masked)
    largest = tl.max(tl.where(in_tile, tl.where(x == x, tl.abs(x), 0.0), -1.0), 3)
    scale = tl.maximum(tl.div_rn(tl.maximum(largest, 0.0), format_max(QUANT)), 1.1754943508222875e-38)
    stored = tl.reshape(quantised(x, scale[:, :, :, None], QUANT), [S, H, C])
    channels = FIRST + tl.arange(0, C)
    tl.store(OUT + rows[:, :, None] + channels[None, None, :] * stride_d, stored, mask=mask, eviction_policy=EVICT)
    first_tile: tl.constexpr = FIRST // _TILE_C
    store_reduced(SCALES[:, :, None] + tl.arange(0, T)[None, None, :] + first_tile, scale, largest >= 0.0, QUANT[2])


@triton.jit
def load_head(X, rows, mask, stride_d, HEAD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
              MATH_DTYPE: tl.constexpr, EVICT: tl.constexpr):
    """A [BLOCK_S, BLOCK_H] tile of head vectors as (first of each pair, second of each pair, tail past ROTARY_DIM),
    in MATH_DTYPE."""
    x_a, x_b = _load_pairs(X, rows, mask, stride_d, HEAD.ROTARY_DIM, BLOCK_S, BLOCK_H, HEAD.BLOCK_HALF,
                           HEAD.INTERLEAVED, MATH_DTYPE, EVICT)
    if HEAD.ROTARY_DIM < HEAD.HEAD_DIM:
        tail = HEAD.ROTARY_DIM + tl.arange(0, HEAD.BLOCK_TAIL)
        tail_mask = mask[:, :, None] & (tail < HEAD.HEAD_DIM)[None, None, :]
        x_t = tl.load(X + rows[:, :, None] + tail[None, None, :] * stride_d, mask=tail_mask, other=0.0,
                      eviction_policy=EVICT).to(MATH_DTYPE)
    else:  # full rotary: no tail, no masked access issued for one
        BLOCK_TAIL: tl.constexpr = HEAD.BLOCK_TAIL  # (a shape's extents are constexprs, not fields)
        x_t = tl.zeros([BLOCK_S, BLOCK_H, BLOCK_TAIL], dtype=MATH_DTYPE)
    return x_a, x_b, x_t


@triton.jit
def norm_weights(weight, heads, head_mask, weight_offset, NORM: tl.constexpr, HEAD: tl.constexpr,
                 MATH_DTYPE: tl.constexpr):
    """The norm's per-channel factor ``weight_offset + w`` laid out like a [1, 1] tile of head vectors (one weight a
    channel, every head's), or over all heads (NORM[2]) like a [1, BLOCK_H] tile: head ``heads[i]``'s own channels
    of the ``(n_heads * HEAD_DIM,)`` weight, where ``head_mask`` holds. ``weight``: (tensor, stride). A weightless
    norm: 1."""
    if NORM[1]:
        W, stride_w = weight
        if NORM[2]:
            origin = (heads * (HEAD.HEAD_DIM * stride_w))[None, :]
            where = head_mask[None, :]
        else:
            origin = tl.zeros([1, 1], dtype=tl.int32)
            where = origin == 0
        w_a, w_b, w_t = load_head(W, origin, where, stride_w, HEAD, 1, origin.shape[1], MATH_DTYPE, "")
        w_a, w_b, w_t = w_a + weight_offset, w_b + weight_offset, w_t + weight_offset
    else:
        w_a, w_b, w_t = 1.0, 1.0, 1.0
    return w_a, w_b, w_t


@triton.jit
def group_sum(per_head, NORM: tl.constexpr):
    """A [BLOCK_S, BLOCK_H] sum over each head vector, summed over the norm's group: itself, or (over all heads) the
    token's heads, [BLOCK_S, 1] (heads past n_heads hold zeros: masked loads)."""
    if NORM[2]:
        per_head = tl.sum(per_head, 1, keep_dims=True)
    return per_head


@triton.jit
def channel_dot(a_a, b_a, a_b, b_b, a_t, b_t):
    """The sum of ``a * b`` over each head vector's channels (axis 2), given as pair halves and tail. Every lane that
    holds part of one sum must end with the same value. Across a warp's lanes the sum is a butterfly: each lane adds
    its partner's partial sum to its own. A partial that is a bare product, the compiler fuses into that addition, so
    each lane rounds its own product once and its partner's twice, and the two lanes' sums differ by an ulp: one
    head vector's channels are then scaled by different factors, and a factor computed from the sum and replicated
    across lanes, which each stores to shared memory, is a race of different values (racecheck reports it). So no
    partial here is a bare product: the halves' products are summed pair by pair first (one fma, whose result is
    rounded: no multiply is left to fuse), and the tail's, summed alone, are rounded by an fma with a zero addend."""
    return tl.sum(a_a * b_a + a_b * b_b, 2) + tl.sum(tl.fma(a_t, b_t, 0.0), 2)


@triton.jit
def rsqrt_mean_square(x_a, x_b, x_t, eps, n_heads, NORM: tl.constexpr, HEAD_DIM: tl.constexpr,
                      MATH_DTYPE: tl.constexpr):
    """``1 / sqrt(mean(x^2) + eps)`` over the norm's group: per head vector [BLOCK_S, BLOCK_H, 1], or over the
    token's ``n_heads`` heads together (NORM[2]) [BLOCK_S, 1, 1] (a correctly rounded square root: ``sqrt_rn`` in
    fp32; fp64's ``sqrt`` already is)."""
    squares = group_sum(channel_dot(x_a, x_a, x_b, x_b, x_t, x_t), NORM)
    if NORM[2]:
        mean = squares / (n_heads * HEAD_DIM)
    else:
        mean = squares / HEAD_DIM
    if MATH_DTYPE == tl.float64:
        root = tl.sqrt(mean + eps)
    else:
        root = tl.sqrt_rn(mean + eps)
    return (1.0 / root)[:, :, None]


@triton.jit
def normed(x_a, x_b, x_t, w_a, w_b, w_t, eps, n_heads, NORM: tl.constexpr, HEAD: tl.constexpr,
           MATH_DTYPE: tl.constexpr):
    """A tile of head vectors (pair halves and tail) times ``r = rsqrt_mean_square`` and the weights, and ``r``.
    Padding pairs (past ROTARY_DIM / 2; after a rotation they hold the masked table's NaN) count as 0."""
    pairs = (tl.arange(0, HEAD.BLOCK_HALF) < HEAD.ROTARY_DIM // 2)[None, None, :]
    x_a, x_b = tl.where(pairs, x_a, 0.0), tl.where(pairs, x_b, 0.0)
    r = rsqrt_mean_square(x_a, x_b, x_t, eps, n_heads, NORM, HEAD.HEAD_DIM, MATH_DTYPE)
    return x_a * r * w_a, x_b * r * w_b, x_t * r * w_t, r


@triton.jit
def cache_slot(cache_rows, token, s_local, pid_b, mask, CACHE: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The address map: where each token of the tile goes in the cache, as (block or sequence, row inside it) and
    whether it is written at all. Where the head axis lies (NHD or HND) is the cache's strides, not this map's.

    * CACHE 1, contiguous: sequence ``pid_b`` at its offset ``SLOTS[pid_b]`` plus the token's index, inside
      ``cache_len`` rows.
    * CACHE 2, slots (vLLM's ``slot_mapping``): ``slot = SLOTS[token]``, block ``slot // block_size``, row
      ``slot % block_size``; -1 (any slot outside the ``cache_len`` slots) writes nothing.
    * CACHE 3, a page table (FlashInfer's): request ``b = BATCH_INDICES[token]`` (-1 writes nothing), position
      ``p = SLOTS[token]`` in it; its pages are ``KV_INDICES[KV_INDPTR[b]:KV_INDPTR[b + 1]]``, so the block is
      ``KV_INDICES[KV_INDPTR[b] + p // PAGE_SIZE]`` and the row ``p % PAGE_SIZE``. Only entries of the request's own
      span of KV_INDICES are read and only blocks among the ``cache_len // PAGE_SIZE`` are written. ``PAGE_SIZE``,
      the block size, is a constant here: a page table's lookup waits on the division (measured in
      docs/tuning.md#fused-launch-table).

    ``cache_rows``: (SLOTS, its stride, BATCH_INDICES, KV_INDICES, KV_INDPTR, page_table, cache_len, block_size (the
    slot map's; 1 and unread otherwise)),
    ``page_table`` (BATCH_INDICES' stride, KV_INDICES' stride, KV_INDPTR's stride, KV_INDICES' length, the number
    of requests).
    """
    SLOTS, slot_stride, BATCH_INDICES, KV_INDICES, KV_INDPTR, page_table, cache_len, block_size = cache_rows
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
        page_iter = first + position // PAGE_SIZE
        written = written & (page_iter >= 0) & (page_iter < end) & (page_iter < page_table[3])
        page = tl.load(KV_INDICES + tl.where(written, page_iter, 0) * page_table[1], mask=written,
                       other=-1).to(tl.int64)
        written = written & (page >= 0) & (page < cache_len // PAGE_SIZE)
        block = tl.where(written, page, 0)
        row = position % PAGE_SIZE
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
