"""v4 — the production tile kernel: one algorithm, every feature of a call as a compile-time switch.

New since v3 (tiles of tokens x heads that share cos/sin rows):

* **q and k in one launch.** The head-block axis of the grid covers q's head blocks, then k's; q and k may have
  different head counts (GQA/MQA) and k may be absent.
* **Pairing** ``HEAD.INTERLEAVED``: NeoX halves ``(i, i + R/2)`` or GPT-J neighbours ``(2i, 2i+1)``. GPT-J loads the
  rotary channels as one contiguous block and splits it into pairs in registers (``tl.reshape`` + ``tl.split``), so
  both pairings read memory the same way.
* **Partial rotary**: only ``HEAD.ROTARY_DIM <= HEAD.HEAD_DIM`` channels turn; out of place, the rest is copied.
* **Positions** ``POSITION.MODE`` (scalar offset / per-sequence offsets / position ids / M-RoPE's three ids per
  token, see ``ropekit.positions``) and ``POSITION.IS_VARLEN`` (packed ``thd`` with ``cu_seqlens``). Positions live
  on the device: no host sync, graph-capturable. M-RoPE picks each pair's position from its axis
  (:func:`_mrope_positions`) and reads the same table (or frequencies) at it.
* **cos/sin** from the half-width float32 table indexed by position, or (``POSITION.COS_PER_TOKEN``) full-width rows
  given per token in any float dtype, the way transformers passes them (the HF drop-in), or (``POSITION.ANGLES``)
  computed from the position and the inverse frequencies: no table (see :func:`_angle_cos_sin`).
* ``ROTATION.CONJUGATE`` rotates by -θ: the backward pass is the same kernel.
* **NoPE layers** (Llama 4, ``ROTATION.NOPE_FLOOR_SCALE`` > 0): nothing rotates; q is multiplied by its token's
  attention temperature (:func:`_nope_temperature`) and k passes through (out of place: copied). The same kernel is
  its own backward.
* In place (out pointer == in pointer) or out of place; offsets in int64 whenever a view spans 2**31 elements
  or more (int32 otherwise: fewer instructions), so huge tensors are correct (docs/tuning.md#index-dtype).
* Positions outside the table are never read (masked loads); such tokens come out as NaN so the error is loud.
* One algorithm: tiles. Prefill-sized, contiguous, out-of-place NeoX calls over the whole head may instead take the
  flat kernel, runs of consecutive head vectors (``ropekit.triton.v4_flat``, docs/tuning.md#flat-path).

This module is the kernel only. The launch choice lives in ``ropekit.triton.choice``; plans and launching in
``ropekit.triton.launch``, whose :func:`~ropekit.triton.launch.rope_v4` is the launcher.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (interpreter switch before the kernels are decorated)
from ..positions import MROPE_IDS, MROPE_SECTION_BASE

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton built without its CUDA backend: no launch there is programmatic (DEPENDENCY is NONE)
    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

__all__ = ["rope_v4_kernel", "QKTile", "Rotation", "after_grid_before", "program_blocks"]


# The tile kernel's own compile-time groups, each one constexpr the device code reads by field (the groups it shares
# with the fused kernels are in ropekit.triton.groups).

class QKTile(NamedTuple):
    """The tile kernel's tile: BLOCK_S tokens by BLOCK_H heads a program; FUSED_QK: one program takes every head of q
    (a BLOCK_H tile) and of k (a BLOCK_HK tile) and fetches cos/sin once for both (BLOCK_HK is 1 otherwise);
    HEADS_INNER: the grid's first axis runs the head blocks of one token block side by side."""

    BLOCK_S: int
    BLOCK_H: int
    BLOCK_HK: int
    FUSED_QK: bool
    HEADS_INNER: bool


class Rotation(NamedTuple):
    """What the tile kernel does to a head vector: CONJUGATE, rotate by -θ (the backward); NOPE_FLOOR_SCALE > 0, a
    NoPE layer: q scaled by its token's attention temperature (with NOPE_ATTN_SCALE), nothing rotated;
    EAGER_ROUNDING, round the products as eager PyTorch does in the input dtype. (Angles without a table are a
    position form: ``POSITION.ANGLES``.)"""

    CONJUGATE: bool
    NOPE_FLOOR_SCALE: int
    NOPE_ATTN_SCALE: float
    EAGER_ROUNDING: bool


_PI = "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863"  # (as a Fraction)


def _split_two_pi() -> tuple:
    """2π as three float64 parts (Cody–Waite): the first two of 24 significant bits, so that ``turns * part`` is
    exact for every ``turns < 2**29``; the third the float64 nearest to the rest."""
    import math
    from fractions import Fraction
    rest = 2 * Fraction(_PI)
    parts = []
    for _ in range(2):
        step = Fraction(2) ** (math.frexp(float(rest))[1] - 24)  # rest < 2**exponent: 24 bits above the step
        parts.append(float(rest // step * step))
        rest -= Fraction(parts[-1])
    return (*parts, float(rest))


def _split_half_pi() -> tuple:
    """π/2 as two float64 parts: the float64 nearest to it and the float64 nearest to the rest."""
    from fractions import Fraction
    half_pi = Fraction(_PI) / 2
    return float(half_pi), float(half_pi - Fraction(float(half_pi)))


_TWO_PI_1, _TWO_PI_2, _TWO_PI_3 = (tl.constexpr(part) for part in _split_two_pi())
_INV_TWO_PI = tl.constexpr(0.15915494309189535)  # 1/(2π) rounded: only picks the number of turns
_HALF_PI_1, _HALF_PI_2 = (tl.constexpr(part) for part in _split_half_pi())
_TWO_OVER_PI = tl.constexpr(0.6366197723675814)  # 2/π rounded: only picks the quadrant
# sin x = x + x³ (S1 + x² S2 + ... + x¹⁰ S6) and cos x = 1 - x²/2 + x⁴ (C1 + x² C2 + ... + x¹⁰ C6) on [-π/4, π/4]:
# fdlibm's kernel coefficients (k_sin.c, k_cos.c), within 2e-16 of sin and cos there
_S1, _S2, _S3, _S4, _S5, _S6 = (tl.constexpr(c) for c in (
    -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04, 2.75573137070700676789e-06,
    -2.50507602534068634195e-08, 1.58969099521155010221e-10))
_C1, _C2, _C3, _C4, _C5, _C6 = (tl.constexpr(c) for c in (
    4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05, -2.75573143513906633035e-07,
    2.08757232129817482790e-09, -1.13596475577881948265e-11))


@triton.jit
def _f64(value: tl.constexpr):
    """A float64 constant (a bare Python float in a jitted function is a float32 constant)."""
    return tl.full([], value, tl.float64)


@triton.jit
def _sin_cos(reduced):
    """sin and cos of float64 angles in [-π, π]: the quadrant's multiple of π/2 taken away (exactly: the difference
    of two numbers within a factor of two, Sterbenz), then one polynomial each on [-π/4, π/4] in Horner's form, and
    the quadrant's sign and swap. No branch and no call: the same instructions for every lane."""
    quarter = tl.floor(reduced * _f64(_TWO_OVER_PI) + 0.5)
    x = reduced - quarter * _f64(_HALF_PI_1)
    x = x - quarter * _f64(_HALF_PI_2)
    z = x * x
    s = _f64(_S5) + z * _f64(_S6)
    s = _f64(_S4) + z * s
    s = _f64(_S3) + z * s
    s = _f64(_S2) + z * s
    s = x + x * z * (_f64(_S1) + z * s)
    c = _f64(_C5) + z * _f64(_C6)
    c = _f64(_C4) + z * c
    c = _f64(_C3) + z * c
    c = _f64(_C2) + z * c
    c = _f64(1.0) - _f64(0.5) * z + z * z * (_f64(_C1) + z * c)
    n = (quarter.to(tl.int32) + 4) % 4  # -2 .. 2 -> 2, 3, 0, 1, 2
    sin = tl.where(n % 2 == 0, s, c)
    cos = tl.where(n % 2 == 0, c, s)
    return tl.where(n >= 2, -sin, sin), tl.where((n == 1) | (n == 2), -cos, cos)


_MROPE_IDS = tl.constexpr(MROPE_IDS)
_MROPE_BASE = tl.constexpr(MROPE_SECTION_BASE)


@triton.jit
def after_grid_before(DEPENDENCY: tl.constexpr):
    """A kernel's first statement (groups.Dependency): with WAIT, no load or store of this program may run before
    the grid before it on the stream has finished, so the program waits here; with RELEASE it then lets the grid
    after it launch (that grid waits the same way before it touches memory). Released after the wait, not before:
    otherwise each waiting grid would release the next, and a queue of waiting grids would build up."""
    if DEPENDENCY != 0:
        gdc_wait()
    if DEPENDENCY == 2:
        gdc_launch_dependents()


@triton.jit
def program_blocks(n_head_blocks, HEADS_INNER: tl.constexpr):
    """This program's (token block, head block). With HEADS_INNER the grid's first axis runs the ``n_head_blocks``
    head blocks of one token block side by side, so the programs resident at any moment read one stretch of memory
    (docs/tuning.md#launch-table); else the token blocks run along the first axis and the head blocks along the
    second (no division before the first address: the shorter chain a launch-bound call wants)."""
    if HEADS_INNER:
        return tl.program_id(0) // n_head_blocks, tl.program_id(0) % n_head_blocks
    else:
        return tl.program_id(0), tl.program_id(1)


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """Round fp32 ``x`` to the nearest ``DTYPE`` value (ties to even), kept in fp32.

    bf16 is rounded with integer arithmetic on the fp32 bits, because the Triton interpreter truncates fp32 -> bf16
    casts; this way the interpreter and the GPU give the same bits. (NaN/Inf pass through unchanged.)
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        finite = (bits & 0x7F800000) != 0x7F800000
        return tl.where(finite, rounded, bits).to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(x.dtype)


@triton.jit
def _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, OUT_DTYPE: tl.constexpr, EAGER_ROUNDING: tl.constexpr):
    """(a, b) -> (a cos - b sin, b cos + a sin), rounded once to the output dtype by the caller.

    EAGER_ROUNDING reproduces eager PyTorch's ``x * cos + rotate_half(x) * sin`` in a half dtype bit for bit: each
    product and the sum are rounded to the output dtype, as three separate elementwise ops would. Only the
    transformers drop-in asks for it ("same result"); everywhere else one rounding of the fp32 result is more exact.
    """
    if EAGER_ROUNDING:
        # the sum is rounded here too: a plain cast at the store truncates under the interpreter
        out_a = _round_to(_round_to(x_a * cos_a, OUT_DTYPE) - _round_to(x_b * sin_a, OUT_DTYPE), OUT_DTYPE)
        out_b = _round_to(_round_to(x_b * cos_b, OUT_DTYPE) + _round_to(x_a * sin_b, OUT_DTYPE), OUT_DTYPE)
    else:
        out_a = x_a * cos_a - x_b * sin_a
        out_b = x_b * cos_b + x_a * sin_b
    return out_a, out_b


@triton.jit
def _angle_cos_sin(INV_FREQ, position, pairs, pair_mask, stride, ANGLE_SCALE: tl.constexpr,
                   MATH_DTYPE: tl.constexpr):
    """cos and sin (times ``ANGLE_SCALE``) of θ = position × inv_freq for [BLOCK_S, 1] positions (M-RoPE: [BLOCK_S,
    BLOCK_HALF], one per pair) and [BLOCK_HALF] pairs.

    θ is formed in float64 (a position below 2**53 and the frequency are exact there), reduced to [-π, π] by subtracting
    whole turns of 2π in three parts (Cody–Waite: ``turns * part`` is exact for the first two parts while turns < 2**29,
    i.e. |θ| below about 3.4e9), and its cos/sin taken in float64 (:func:`_sin_cos`) and rounded once to the math dtype.
    float32 sin/cos of the reduced angle would not do: rounding the reduced angle to float32 alone moves it by up to
    1.2e-7 near ±π, and sin by as much, four times the float64-angle table's largest error (half a float32 ulp of values
    near 1). ANGLE_SCALE is a compile-time float64 constant: a float argument would arrive rounded to float32.
    """
    inv_freq = tl.load(INV_FREQ + pairs * stride, mask=pair_mask, other=0.0).to(tl.float64)
    angle = position.to(tl.float64) * inv_freq[None, :]
    turns = tl.floor(angle * _f64(_INV_TWO_PI) + 0.5)
    reduced = angle - turns * _f64(_TWO_PI_1)
    reduced = reduced - turns * _f64(_TWO_PI_2)
    reduced = reduced - turns * _f64(_TWO_PI_3)
    sin, cos = _sin_cos(reduced)
    scale = _f64(ANGLE_SCALE)
    return (cos * scale).to(MATH_DTYPE), (sin * scale).to(MATH_DTYPE)


@triton.jit
def _nope_temperature(position, pairs, FLOOR_SCALE: tl.constexpr, ATTN_SCALE: tl.constexpr,
                      MATH_DTYPE: tl.constexpr):
    """Llama 4's attention temperature of a NoPE layer, ``log(floor((position + 1) / FLOOR_SCALE) + 1) * ATTN_SCALE +
    1``, for [BLOCK_S, 1] positions, broadcast over [BLOCK_HALF] pairs: the floor in integer arithmetic (exact at any
    position; a negative numerator rounds down too), the rest in float64, rounded once to the math dtype. ATTN_SCALE
    is a compile-time float64 constant (a float argument would arrive rounded to float32)."""
    after = position + 1
    turns = tl.where(after >= 0, after // FLOOR_SCALE, -((FLOOR_SCALE - 1 - after) // FLOOR_SCALE))
    scale = tl.log(turns.to(tl.float64) + 1.0) * _f64(ATTN_SCALE) + 1.0
    return (scale + tl.zeros([1, pairs.shape[0]], tl.float64)).to(MATH_DTYPE)


@triton.jit
def _mrope_positions(POSITIONS, batch_index, token_rows, token_mask, position_strides, pairs,
                     POS_MODE: tl.constexpr):
    """M-RoPE: the [BLOCK_S, BLOCK_HALF] position of every pair of BLOCK_S tokens, that of the pair's axis.

    ``POSITIONS`` holds three ids per token (temporal, height, width) at strides ``position_strides`` = (sequence,
    token, axis). The sections are read from the mode at compile time (``ropekit.positions.mrope_mode``: the mode is
    ``MROPE_IDS + interleaved + 2 * (t + B * (h + B * w))``, B = 4096), and the axis of pair ``i`` is
    ``ropekit.positions.mrope_axis_of_pair``'s: consecutive sections, or (interleaved) height for ``i % 3 == 1``,
    ``i < 3h`` and width for ``i % 3 == 2``, ``i < 3w``, temporal otherwise.
    """
    sections = (POS_MODE - _MROPE_IDS) // 2
    t = sections % _MROPE_BASE
    h = (sections // _MROPE_BASE) % _MROPE_BASE
    w = sections // (_MROPE_BASE * _MROPE_BASE)
    ids = POSITIONS + batch_index * position_strides[0] + token_rows * position_strides[1]
    t_pos = tl.load(ids, mask=token_mask, other=0).to(tl.int64)
    h_pos = tl.load(ids + position_strides[2], mask=token_mask, other=0).to(tl.int64)
    w_pos = tl.load(ids + 2 * position_strides[2], mask=token_mask, other=0).to(tl.int64)
    if (POS_MODE - _MROPE_IDS) % 2 == 1:
        height = (pairs % 3 == 1) & (pairs < 3 * h)
        width = (pairs % 3 == 2) & (pairs < 3 * w)
    else:
        height = (pairs >= t) & (pairs < t + h)
        width = pairs >= t + h
    return tl.where(height[None, :], h_pos[:, None], tl.where(width[None, :], w_pos[:, None], t_pos[:, None]))


@triton.jit
def _cos_sin(COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
             cos_strides, position_strides, ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr,
             INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr, COS_PER_TOKEN: tl.constexpr, CONJUGATE: tl.constexpr,
             MATH_DTYPE: tl.constexpr, INDEX_DTYPE: tl.constexpr, ANGLES: tl.constexpr = False,
             ANGLE_SCALE: tl.constexpr = 1.0, NOPE_FLOOR_SCALE: tl.constexpr = 0, NOPE_ATTN_SCALE: tl.constexpr = 0.0):
    """cos/sin of every pair of BLOCK_S tokens, as four [BLOCK_S, BLOCK_HALF] tiles (first / second channel of a pair).

    Called after the q/k tile is loaded, so those loads are already in flight while the dependent chain
    position -> table row -> cos/sin resolves (it dominates a decode step's latency). ``cos_strides``: (sequence,
    row, column) of per-token rows, or (unused, row, column) of a table; ``position_strides``: (sequence, token), and
    for M-RoPE (``POS_MODE >= MROPE_IDS``) (sequence, token, axis): each pair then reads its own axis' position.
    With ANGLES, COS holds the (ROTARY_DIM / 2,) inverse frequencies (column stride ``cos_strides[2]``), SIN is not
    read, and cos/sin are computed at each token's position and multiplied by ANGLE_SCALE. With NOPE_FLOOR_SCALE > 0
    (a NoPE layer) cos is the token's attention temperature and sin 0; nothing is read but the positions.
    """
    stride_cos_b, stride_cos_s, stride_cos_d = cos_strides[0], cos_strides[1], cos_strides[2]
    stride_pos_b, stride_pos_s = position_strides[0], position_strides[1]
    pairs = tl.arange(0, BLOCK_HALF).to(INDEX_DTYPE)  # times a column stride: a table's may be a large one
    pair_mask = pairs < ROTARY_DIM // 2
    if COS_PER_TOKEN:
        # Full-width rows (HF layout): channel j of x uses cos[..., j]; pair i of NeoX reads columns i and i + R/2,
        # pair i of GPT-J reads columns 2i and 2i + 1.
        cs_row = pid_b.to(tl.int64) * stride_cos_b + token_rows * stride_cos_s  # stride_cos_b is 0 for varlen
        cs_mask = token_mask[:, None] & pair_mask[None, :]
        if INTERLEAVED:
            col_a = 2 * pairs
            col_b = 2 * pairs + 1
        else:
            col_a = pairs
            col_b = pairs + ROTARY_DIM // 2
        offs_a = cs_row[:, None] + col_a[None, :] * stride_cos_d
        offs_b = cs_row[:, None] + col_b[None, :] * stride_cos_d
        cos_a = tl.load(COS + offs_a, mask=cs_mask, other=0.0).to(MATH_DTYPE)
        sin_a = tl.load(SIN + offs_a, mask=cs_mask, other=0.0).to(MATH_DTYPE)
        cos_b = tl.load(COS + offs_b, mask=cs_mask, other=0.0).to(MATH_DTYPE)
        sin_b = tl.load(SIN + offs_b, mask=cs_mask, other=0.0).to(MATH_DTYPE)
    else:
        # position: [BLOCK_S, 1], one per token, or with M-RoPE [BLOCK_S, BLOCK_HALF], one per pair
        if POS_MODE >= _MROPE_IDS:
            position = _mrope_positions(POSITIONS, batch_index, token_rows, token_mask, position_strides, pairs,
                                        POS_MODE)
        elif POS_MODE == 0:
            position = (s_local.to(tl.int64) + position_offset)[:, None]
        elif POS_MODE == 1:
            position = (s_local.to(tl.int64) + tl.load(POSITIONS + pid_b * stride_pos_b).to(tl.int64))[:, None]
        else:
            position = tl.load(POSITIONS + batch_index * stride_pos_b + token_rows * stride_pos_s,
                               mask=token_mask, other=0).to(tl.int64)[:, None]
        if NOPE_FLOOR_SCALE > 0:
            cos_a = _nope_temperature(position, pairs, NOPE_FLOOR_SCALE, NOPE_ATTN_SCALE, MATH_DTYPE)
            sin_a = tl.zeros_like(cos_a)
        elif ANGLES:
            cos_a, sin_a = _angle_cos_sin(COS, position, pairs, pair_mask, stride_cos_d, ANGLE_SCALE, MATH_DTYPE)
        else:
            in_table = (position >= 0) & (position < table_len)
            # Never read outside the table; out-of-range positions get NaN (loud) instead of a neighbour's angle.
            cs_mask = token_mask[:, None] & in_table & pair_mask[None, :]
            offs = position * stride_cos_s + pairs[None, :] * stride_cos_d
            cos_a = tl.load(COS + offs, mask=cs_mask, other=float("nan")).to(MATH_DTYPE)
            sin_a = tl.load(SIN + offs, mask=cs_mask, other=float("nan")).to(MATH_DTYPE)
        cos_b = cos_a
        sin_b = sin_a
    if CONJUGATE:
        # The transpose of the forward map (its vector-Jacobian product): out_a = a cos_a - b sin_a and
        # out_b = b cos_b + a sin_b transpose to (g_a cos_a + g_b sin_b, g_b cos_b - g_a sin_a). For a rotation
        # (sin_a == sin_b) that is the rotation by -θ; per-token rows whose halves differ get the exact gradient too.
        sin_a, sin_b = -sin_b, -sin_a
    return cos_a, sin_a, cos_b, sin_b


@triton.jit
def _tile_rows(strides, out_strides, batch_index, token_rows, token_mask, first_head, n_heads, BLOCK_H: tl.constexpr,
               INDEX_DTYPE: tl.constexpr):
    """[BLOCK_S, BLOCK_H] start of every head vector in a (batch, seq, heads, dim) input and its output, and which of
    them exist. ``strides``: the input's (batch, seq, head, channel) strides; int64 arithmetic when a view spans 2**31
    elements or more (INDEX_DTYPE), int32 otherwise."""
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    row_in = batch_index * strides[0] + token_rows[:, None] * strides[1] + heads[None, :] * strides[2]
    row_out = batch_index * out_strides[0] + token_rows[:, None] * out_strides[1] + heads[None, :] * out_strides[2]
    row_mask = token_mask[:, None] & (heads < n_heads)[None, :]
    return row_in, row_out, row_mask


@triton.jit
def _head_strides(strides, n_heads, seqlen, HEAD_DIM: tl.constexpr, DENSE: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """A (batch, seq, heads, HEAD_DIM) view's strides: as passed, or with DENSE those of a contiguous tensor, derived
    here so that the launch passes 1 (a constant to Triton, not an argument: docs/tuning.md#dense-strides); the batch
    stride in INDEX_DTYPE, since one sequence may span 2**31 elements."""
    if DENSE:
        per_token = n_heads * HEAD_DIM
        return tl.cast(per_token, INDEX_DTYPE) * seqlen, per_token, HEAD_DIM, 1
    else:
        return strides[0], strides[1], strides[2], strides[3]


@triton.jit
def _load_pairs(X, row_in, row_mask, stride_d, ROTARY_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                MATH_DTYPE: tl.constexpr, EVICT: tl.constexpr):
    """The rotary channels of a [BLOCK_S, BLOCK_H] tile of head vectors as two [.., BLOCK_HALF] halves of pairs."""
    if INTERLEAVED:
        # The 2*BLOCK_HALF rotary channels are contiguous: load them in one go, pair neighbours in registers.
        channels = tl.arange(0, 2 * BLOCK_HALF)
        mask = row_mask[:, :, None] & (channels < ROTARY_DIM)[None, None, :]
        x = tl.load(X + row_in[:, :, None] + channels[None, None, :] * stride_d, mask=mask, other=0.0,
                    eviction_policy=EVICT)
        x_a, x_b = tl.split(tl.reshape(x.to(MATH_DTYPE), [BLOCK_S, BLOCK_H, BLOCK_HALF, 2]))
    else:
        # NeoX: pair i is (i, i + ROTARY_DIM/2): two contiguous half-rows.
        pairs = tl.arange(0, BLOCK_HALF)
        mask = row_mask[:, :, None] & (pairs < ROTARY_DIM // 2)[None, None, :]
        ptr_a = X + row_in[:, :, None] + pairs[None, None, :] * stride_d
        x_a = tl.load(ptr_a, mask=mask, other=0.0, eviction_policy=EVICT).to(MATH_DTYPE)
        x_b = tl.load(ptr_a + (ROTARY_DIM // 2) * stride_d, mask=mask, other=0.0,
                      eviction_policy=EVICT).to(MATH_DTYPE)
    return x_a, x_b


@triton.jit
def _rotate_store(X, OUT, x_a, x_b, cos_a, sin_a, cos_b, sin_b, row_in, row_out, row_mask, stride_d, out_stride_d,
                  ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr, INTERLEAVED: tl.constexpr,
                  COPY_TAIL: tl.constexpr, EAGER_ROUNDING: tl.constexpr, EVICT: tl.constexpr,
                  TRANSFORM: tl.constexpr = 0):
    """Rotate a loaded tile by its tokens' cos/sin ([BLOCK_S, BLOCK_HALF], shared by every head), store it and,
    for partial rotary out of place, copy the untouched tail channels. TRANSFORM 1 (q of a NoPE layer) multiplies
    both channels of a pair by cos instead (no sin term: an Inf partner must not spoil its neighbour), 2 (k of a NoPE
    layer) stores them as they are."""
    cos_a, sin_a = cos_a[:, None, :], sin_a[:, None, :]
    cos_b, sin_b = cos_b[:, None, :], sin_b[:, None, :]
    if TRANSFORM == 1:
        out_a, out_b = x_a * cos_a, x_b * cos_b
    elif TRANSFORM == 2:
        out_a, out_b = x_a, x_b
    else:
        out_a, out_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, OUT.dtype.element_ty, EAGER_ROUNDING)
    if INTERLEAVED:
        channels = tl.arange(0, 2 * BLOCK_HALF)
        mask = row_mask[:, :, None] & (channels < ROTARY_DIM)[None, None, :]
        out = tl.reshape(tl.join(out_a, out_b), [BLOCK_S, BLOCK_H, 2 * BLOCK_HALF])
        tl.store(OUT + row_out[:, :, None] + channels[None, None, :] * out_stride_d,
                 out.to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)
    else:
        pairs = tl.arange(0, BLOCK_HALF)
        mask = row_mask[:, :, None] & (pairs < ROTARY_DIM // 2)[None, None, :]
        out_ptr_a = OUT + row_out[:, :, None] + pairs[None, None, :] * out_stride_d
        tl.store(out_ptr_a, out_a.to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)
        tl.store(out_ptr_a + (ROTARY_DIM // 2) * out_stride_d, out_b.to(OUT.dtype.element_ty), mask=mask,
                 eviction_policy=EVICT)
    if COPY_TAIL:
        # Partial rotary, out of place: the channels past ROTARY_DIM pass through unchanged.
        tail = ROTARY_DIM + tl.arange(0, BLOCK_TAIL)
        tail_mask = row_mask[:, :, None] & (tail < HEAD_DIM)[None, None, :]
        x_tail = tl.load(X + row_in[:, :, None] + tail[None, None, :] * stride_d, mask=tail_mask,
                         eviction_policy=EVICT)
        tl.store(OUT + row_out[:, :, None] + tail[None, None, :] * out_stride_d, x_tail, mask=tail_mask,
                 eviction_policy=EVICT)


@triton.jit
def rope_v4_kernel(
    # q and k as (tensor, strides): (batch, seq, heads, HEAD_DIM) views, or one packed (1, tokens, heads, HEAD_DIM)
    # with POSITION.IS_VARLEN; strides (batch, seq, head, channel). Their outputs alike ((None, unread) IN_PLACE: the
    # kernel writes through q's and k's pointers)
    q, k, out_q, out_k,
    # the angles: (COS, SIN, (sequence, row, column) strides), a (table_len, ROTARY_DIM / 2) float32 table read at
    # each token's position, or with POSITION.COS_PER_TOKEN full-width rows given per token, or with POSITION.ANGLES
    # the (ROTARY_DIM / 2,) inverse frequencies in COS (SIN unread)
    angles,
    # the positions: (POSITIONS, strides, CU_SEQLENS, position offset + 1); POSITION.MODE says what POSITIONS holds
    # (strides (sequence, token), M-RoPE's (sequence, token, axis)), CU_SEQLENS are the packed sequences' starts; the
    # offset arrives plus one (the common offset, 0, becomes the constant 1)
    positions,
    # (seqlen, n_heads_q, n_heads_k, table_len, n_tokens)
    sizes,
    # the head vector (Head), the tile (QKTile), the positions' form (PositionForm)
    HEAD: tl.constexpr, TILE: tl.constexpr, POSITION: tl.constexpr,
    # what the call asks for: k's programs, the rotation (Rotation)
    HAS_K: tl.constexpr, ROTATION: tl.constexpr,
    # what the tensors allow (Types); DENSE: contiguous tensors and table, strides derived here; IN_PLACE: outputs
    # are the inputs
    TYPES: tl.constexpr, DENSE: tl.constexpr, IN_PLACE: tl.constexpr,
    # how the launch follows the grid before it (groups.Dependency)
    DEPENDENCY: tl.constexpr,
):
    """Grid: (token blocks, head blocks of q then of k, batch or sequence), or with TILE.HEADS_INNER (token blocks x
    head blocks, 1, batch or sequence): program ``p`` of the first axis then takes head block ``p % head blocks`` of
    token block ``p // head blocks``, and the grid walks q and k in their memory order.

    A program takes BLOCK_S tokens x BLOCK_H heads of q or of k; with FUSED_QK the head axis has a single program,
    which takes every head of q (a BLOCK_H tile) and of k (a BLOCK_HK tile), issues all their loads first and fetches
    cos/sin once for both.

    Arguments a launch does not read, or that the kernel derives, arrive as 1 (integers) or None (pointers), which
    Triton turns into constants: the strides of DENSE tensors and tables, the outputs and their strides IN_PLACE,
    the position strides without positions. In CUDA-graph replay every byte of arguments costs time
    (docs/tuning.md#lean-launch).
    """
    after_grid_before(DEPENDENCY)
    # Each group is unpacked before any branch, its strides rebuilt from their items: Triton 3.6 keeps a stale type
    # for a tuple nested in a tuple argument, and a branch's copy follows the type (the position strides, only ever
    # read by index, are kept as passed)
    Q, q_strides = q[0], (q[1][0], q[1][1], q[1][2], q[1][3])
    K, k_strides = k[0], (k[1][0], k[1][1], k[1][2], k[1][3])
    OUT_Q, out_q_strides = out_q[0], (out_q[1][0], out_q[1][1], out_q[1][2], out_q[1][3])
    OUT_K, out_k_strides = out_k[0], (out_k[1][0], out_k[1][1], out_k[1][2], out_k[1][3])
    COS, SIN, cos_strides = angles[0], angles[1], (angles[2][0], angles[2][1], angles[2][2])
    POSITIONS, position_strides, CU_SEQLENS, position_offset = positions[0], positions[1], positions[2], positions[3]
    ROTARY_DIM: tl.constexpr = HEAD.ROTARY_DIM
    HEAD_DIM: tl.constexpr = HEAD.HEAD_DIM
    BLOCK_HALF: tl.constexpr = HEAD.BLOCK_HALF
    BLOCK_TAIL: tl.constexpr = HEAD.BLOCK_TAIL
    INTERLEAVED: tl.constexpr = HEAD.INTERLEAVED
    BLOCK_S: tl.constexpr = TILE.BLOCK_S
    BLOCK_H: tl.constexpr = TILE.BLOCK_H
    BLOCK_HK: tl.constexpr = TILE.BLOCK_HK
    FUSED_QK: tl.constexpr = TILE.FUSED_QK
    POS_MODE: tl.constexpr = POSITION.MODE
    IS_VARLEN: tl.constexpr = POSITION.IS_VARLEN
    COS_PER_TOKEN: tl.constexpr = POSITION.COS_PER_TOKEN
    CONJUGATE: tl.constexpr = ROTATION.CONJUGATE
    ANGLES: tl.constexpr = POSITION.ANGLES
    ANGLE_SCALE: tl.constexpr = POSITION.ANGLE_SCALE
    NOPE_FLOOR_SCALE: tl.constexpr = ROTATION.NOPE_FLOOR_SCALE
    NOPE_ATTN_SCALE: tl.constexpr = ROTATION.NOPE_ATTN_SCALE
    EAGER_ROUNDING: tl.constexpr = ROTATION.EAGER_ROUNDING
    MATH_DTYPE: tl.constexpr = TYPES.MATH_DTYPE
    INDEX_DTYPE: tl.constexpr = TYPES.INDEX_DTYPE
    EVICT: tl.constexpr = TYPES.EVICT
    seqlen, n_heads_q, n_heads_k, table_len, n_tokens = sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]
    position_offset = position_offset - 1
    if DENSE and not COS_PER_TOKEN:
        cos_strides = (1, ROTARY_DIM // 2, 1)  # a contiguous table of ROTARY_DIM / 2 columns
    q_strides = _head_strides(q_strides, n_heads_q, seqlen, HEAD_DIM, DENSE, INDEX_DTYPE)
    k_strides = _head_strides(k_strides, n_heads_k, seqlen, HEAD_DIM, DENSE, INDEX_DTYPE)
    if IN_PLACE:
        OUT_Q, OUT_K = Q, K
        out_q_strides, out_k_strides = q_strides, k_strides
    elif DENSE:
        out_q_strides, out_k_strides = q_strides, k_strides
    # plain integer arithmetic, not tl.cdiv: a jitted library function, decorated when triton was imported, i.e.
    # without the interpreter if triton came first
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    # read with HEADS_INNER only, which a fused q+k tile never takes; n_heads_k is 0 without k
    n_head_blocks = n_head_blocks_q + (n_heads_k + BLOCK_H - 1) // BLOCK_H
    pid_s, pid_h = program_blocks(n_head_blocks, TILE.HEADS_INNER)
    pid_b = tl.program_id(2)

    # --- which tokens: rows of the (batch, seq) view, or of the packed (tokens,) view for varlen -----------------
    if IS_VARLEN:
        seq_start = tl.load(CU_SEQLENS + pid_b).to(INDEX_DTYPE)
        seq_len_b = tl.load(CU_SEQLENS + pid_b + 1).to(INDEX_DTYPE) - seq_start
        batch_index = 0  # the packed tensor has no batch axis
    else:
        seq_start = 0
        seq_len_b = seqlen
        batch_index = pid_b.to(INDEX_DTYPE)
    if pid_s * BLOCK_S >= seq_len_b:
        return  # varlen: this sequence is shorter than the longest one
    s_local = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    token_mask = s_local < seq_len_b
    token_rows = seq_start + s_local.to(INDEX_DTYPE)
    if IS_VARLEN:
        # cu_seqlens are device values the host never reads: whatever they hold, only rows of the packed tensor
        # (0 <= row < n_tokens) are read or written
        token_mask = token_mask & (token_rows >= 0) & (token_rows < n_tokens)

    # --- which heads: a block of q's or of k's heads, or (FUSED_QK) all of both ----------------------------------
    if FUSED_QK or pid_h < n_head_blocks_q:
        q_in, q_out, q_mask = _tile_rows(q_strides, out_q_strides, batch_index, token_rows, token_mask,
                                         pid_h * BLOCK_H, n_heads_q, BLOCK_H, INDEX_DTYPE)
        q_a, q_b = _load_pairs(Q, q_in, q_mask, q_strides[3], ROTARY_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, INTERLEAVED,
                               MATH_DTYPE, EVICT)
        if FUSED_QK and HAS_K:
            k_in, k_out, k_mask = _tile_rows(k_strides, out_k_strides, batch_index, token_rows, token_mask, 0,
                                             n_heads_k, BLOCK_HK, INDEX_DTYPE)
            k_a, k_b = _load_pairs(K, k_in, k_mask, k_strides[3], ROTARY_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF,
                                   INTERLEAVED, MATH_DTYPE, EVICT)
        # The q/k loads are in flight while the dependent chain position -> table row -> cos/sin resolves (it
        # dominates a decode step's latency).
        cos_a, sin_a, cos_b, sin_b = _cos_sin(
            COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
            cos_strides, position_strides, ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, CONJUGATE,
            MATH_DTYPE, INDEX_DTYPE, ANGLES, ANGLE_SCALE, NOPE_FLOOR_SCALE, NOPE_ATTN_SCALE)
        _rotate_store(Q, OUT_Q, q_a, q_b, cos_a, sin_a, cos_b, sin_b, q_in, q_out, q_mask, q_strides[3],
                      out_q_strides[3], ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED,
                      ROTARY_DIM < HEAD_DIM and not IN_PLACE, EAGER_ROUNDING, EVICT, 1 if NOPE_FLOOR_SCALE > 0 else 0)
        if FUSED_QK and HAS_K:
            _rotate_store(K, OUT_K, k_a, k_b, cos_a, sin_a, cos_b, sin_b, k_in, k_out, k_mask, k_strides[3],
                          out_k_strides[3], ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL,
                          INTERLEAVED, ROTARY_DIM < HEAD_DIM and not IN_PLACE, EAGER_ROUNDING, EVICT,
                          2 if NOPE_FLOOR_SCALE > 0 else 0)
    elif HAS_K:
        k_in, k_out, k_mask = _tile_rows(k_strides, out_k_strides, batch_index, token_rows, token_mask,
                                         (pid_h - n_head_blocks_q) * BLOCK_H, n_heads_k, BLOCK_H, INDEX_DTYPE)
        k_a, k_b = _load_pairs(K, k_in, k_mask, k_strides[3], ROTARY_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, INTERLEAVED,
                               MATH_DTYPE, EVICT)
        cos_a, sin_a, cos_b, sin_b = _cos_sin(
            COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
            cos_strides, position_strides, ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, CONJUGATE,
            MATH_DTYPE, INDEX_DTYPE, ANGLES, ANGLE_SCALE, NOPE_FLOOR_SCALE, NOPE_ATTN_SCALE)
        _rotate_store(K, OUT_K, k_a, k_b, cos_a, sin_a, cos_b, sin_b, k_in, k_out, k_mask, k_strides[3],
                      out_k_strides[3], ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED,
                      ROTARY_DIM < HEAD_DIM and not IN_PLACE, EAGER_ROUNDING, EVICT, 2 if NOPE_FLOOR_SCALE > 0 else 0)
