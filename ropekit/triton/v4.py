"""v4 — the production kernel: every feature as a compile-time switch of one kernel.

New since v3 (tiles of tokens x heads that share cos/sin rows):

* **q and k in one launch.** The head-block axis of the grid covers q's head blocks, then k's; q and k may have
  different head counts (GQA/MQA) and k may be absent.
* **Pairing** ``INTERLEAVED``: NeoX halves ``(i, i + R/2)`` or GPT-J neighbours ``(2i, 2i+1)``. GPT-J loads the rotary
  channels as one contiguous block and splits it into pairs in registers (``tl.reshape`` + ``tl.split``), so both
  pairings read memory the same way.
* **Partial rotary**: only ``ROTARY_DIM <= HEAD_DIM`` channels turn; out of place, ``COPY_TAIL`` copies the rest.
* **Positions** ``POS_MODE`` (scalar offset / per-sequence offsets / position ids, see ``ropekit.positions``) and
  ``IS_VARLEN`` (packed ``thd`` with ``cu_seqlens``). Positions live on the device: no host sync, graph-capturable.
* **cos/sin** from the half-width float32 table indexed by position, or (``COS_PER_TOKEN``) full-width rows given per
  token in any float dtype, the way transformers passes them (this covers M-RoPE and the HF drop-in).
* ``CONJUGATE`` rotates by -θ: the backward pass is the same kernel.
* In place (out pointer == in pointer) or out of place; offsets in int64 whenever a view spans 2**31 elements
  or more (int32 otherwise: fewer instructions), so huge tensors are correct.
* Positions outside the table are never read (masked loads); such tokens come out as NaN so the error is loud.
* A **flat path** (``FLAT``) for prefill-sized, contiguous, out-of-place NeoX calls over the whole head: blocks of
  consecutive elements of q or of k (``FLAT_PAIRED``: of both), each element's partner loaded separately (from the
  cache): the structure of torch.compile's kernel for the eager formula, measured 1% faster than the token tile in
  fp16/bf16 (run29) and 2% in fp32, paired (run38).
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import POSITION_IDS, PositionSpec

__all__ = ["rope_v4_kernel", "rope_v4", "plan_v4", "V4Launch", "launch_config", "LaunchConfig"]

log = logging.getLogger("ropekit")


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
def _cos_sin(COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
             stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s,
             ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, INTERLEAVED: tl.constexpr, POS_MODE: tl.constexpr,
             COS_PER_TOKEN: tl.constexpr, CONJUGATE: tl.constexpr, MATH_DTYPE: tl.constexpr):
    """cos/sin of every pair of BLOCK_S tokens, as four [BLOCK_S, BLOCK_HALF] tiles (first / second channel of a pair).

    Called after the q/k tile is loaded, so those loads are already in flight while the dependent chain
    position -> table row -> cos/sin resolves (it dominates a decode step's latency).
    """
    pairs = tl.arange(0, BLOCK_HALF)
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
        if POS_MODE == 0:
            position = s_local.to(tl.int64) + position_offset
        elif POS_MODE == 1:
            position = s_local.to(tl.int64) + tl.load(POSITIONS + pid_b * stride_pos_b).to(tl.int64)
        else:
            position = tl.load(POSITIONS + batch_index * stride_pos_b + token_rows * stride_pos_s,
                               mask=token_mask, other=0).to(tl.int64)
        in_table = (position >= 0) & (position < table_len)
        # Never read outside the table; out-of-range tokens get NaN (loud) instead of a neighbour's angle.
        cs_mask = (token_mask & in_table)[:, None] & pair_mask[None, :]
        offs = position[:, None] * stride_cos_s + pairs[None, :] * stride_cos_d
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
def _tile_rows(batch_index, token_rows, token_mask, first_head, n_heads, stride_b, stride_s, stride_h,
               out_stride_b, out_stride_s, out_stride_h, BLOCK_H: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """[BLOCK_S, BLOCK_H] start of every head vector in the input and the output, and which of them exist.

    int64 arithmetic when a view spans 2**31 elements or more (INDEX_DTYPE), int32 otherwise.
    """
    heads = (first_head + tl.arange(0, BLOCK_H)).to(INDEX_DTYPE)
    row_in = batch_index * stride_b + token_rows[:, None] * stride_s + heads[None, :] * stride_h
    row_out = batch_index * out_stride_b + token_rows[:, None] * out_stride_s + heads[None, :] * out_stride_h
    row_mask = token_mask[:, None] & (heads < n_heads)[None, :]
    return row_in, row_out, row_mask


@triton.jit
def _dense_strides(n_heads, seqlen, HEAD_DIM: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """(batch, seq, head) strides of a contiguous (batch, seq, n_heads, HEAD_DIM) tensor; the batch stride in
    INDEX_DTYPE, since one sequence may span 2**31 elements."""
    per_token = n_heads * HEAD_DIM
    return tl.cast(per_token, INDEX_DTYPE) * seqlen, per_token, HEAD_DIM


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
                  COPY_TAIL: tl.constexpr, EAGER_ROUNDING: tl.constexpr, EVICT: tl.constexpr):
    """Rotate a loaded tile by its tokens' cos/sin ([BLOCK_S, BLOCK_HALF], shared by every head), store it and,
    for partial rotary out of place, copy the untouched tail channels."""
    cos_a, sin_a = cos_a[:, None, :], sin_a[:, None, :]
    cos_b, sin_b = cos_b[:, None, :], sin_b[:, None, :]
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
def _flat_angles(COS, SIN, POSITIONS, e, mask, n_heads, seqlen, table_len, position_offset, stride_cos_s,
                 stride_cos_d, stride_pos_b, stride_pos_s, HEAD_DIM: tl.constexpr, POS_MODE: tl.constexpr,
                 CONJUGATE: tl.constexpr):
    """For elements ``e`` of a contiguous (batch, seq, n_heads, HEAD_DIM) tensor rotated with NeoX pairs: the offset
    of each element's partner (e +- HEAD_DIM/2), its cos, and the signed sin that multiplies the partner
    (``out[e] = x[e] cos + sin_signed x[partner]``)."""
    channel = e % HEAD_DIM
    token = e // (n_heads * HEAD_DIM)
    first = channel < HEAD_DIM // 2
    pair = tl.where(first, channel, channel - HEAD_DIM // 2)
    partner = tl.where(first, e + HEAD_DIM // 2, e - HEAD_DIM // 2)
    s_local = token % seqlen
    batch_index = token // seqlen
    if POS_MODE == 0:
        position = s_local.to(tl.int64) + position_offset
    elif POS_MODE == 1:
        position = s_local.to(tl.int64) + tl.load(POSITIONS + batch_index * stride_pos_b, mask=mask,
                                                  other=0).to(tl.int64)
    else:
        position = tl.load(POSITIONS + batch_index * stride_pos_b + s_local * stride_pos_s, mask=mask,
                           other=0).to(tl.int64)
    # as on the tile path: never read outside the table, and such tokens come out as NaN
    cs_mask = mask & (position >= 0) & (position < table_len)
    offs = position * stride_cos_s + pair * stride_cos_d
    cos = tl.load(COS + offs, mask=cs_mask, other=float("nan"), eviction_policy="evict_last")
    sin = tl.load(SIN + offs, mask=cs_mask, other=float("nan"), eviction_policy="evict_last")
    if CONJUGATE:
        sin = -sin
    return partner, cos, tl.where(first, -sin, sin)


@triton.jit
def _flat_load(X, e, partner, mask, EVICT: tl.constexpr):
    """Elements ``e`` of X and their partners, in fp32."""
    x = tl.load(X + e, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    # No cache hint on the partner: the first load of a line sets its policy, and the compiler chooses which of the
    # two it issues first (a hint on the partner, evict_last, cost Llama's conjugate 1.2%, run28). The launch table
    # gives 16-bit elements no hint either: after run47's launch changes the compiler issued the element's
    # evict_first load first and Llama's forward read 114.2 µs, 113.2 without the hint (run48).
    x_partner = tl.load(X + partner, mask=mask, other=0.0).to(tl.float32)
    return x, x_partner


@triton.jit
def _flat_program(Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, n_tokens, seqlen, n_heads_q, n_heads_k, n_q_blocks,
                  table_len, position_offset, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s,
                  HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, PAIRED: tl.constexpr, HAS_K: tl.constexpr,
                  POS_MODE: tl.constexpr, CONJUGATE: tl.constexpr, EVICT: tl.constexpr, INDEX_DTYPE: tl.constexpr):
    """The flat path over contiguous (batch, seq, heads, head_dim) tensors rotated over the whole head with NeoX
    pairs: a program takes BLOCK consecutive elements of q (the first ``n_q_blocks`` programs) or of k, or with
    PAIRED (q and k of the same shape) the same BLOCK elements of both, all four loads issued before either store.

    Element e becomes ``x[e] cos -/+ x[partner] sin``; its partner (e +- HEAD_DIM/2) lies in a line the same
    program loads, so the second load is served by the cache. This is the shape of the element-wise kernel
    torch.compile generates for the eager formula (PAIRED: the one it generates when q and k have the same shape):
    no tile of heads. (GPT-J's partner, e +- 1, would turn both the partner and the cos/sin loads into per-element
    gathers: 139 µs against 115 for the tile on the Llama shape, run30; GPT-J keeps the tile.)
    """
    pid = tl.program_id(0)
    if PAIRED:
        X = Q
        OUT = OUT_Q
        block = pid
        n_heads = n_heads_q
    else:
        is_q = pid < n_q_blocks
        if is_q:
            X = Q
            OUT = OUT_Q
        else:
            X = K
            OUT = OUT_K
        block = tl.where(is_q, pid, pid - n_q_blocks)
        n_heads = tl.where(is_q, n_heads_q, n_heads_k).to(INDEX_DTYPE)
    e = block.to(INDEX_DTYPE) * BLOCK + tl.arange(0, BLOCK).to(INDEX_DTYPE)
    mask = e < n_tokens.to(INDEX_DTYPE) * n_heads * HEAD_DIM
    partner, cos, sin = _flat_angles(COS, SIN, POSITIONS, e, mask, n_heads, seqlen, table_len, position_offset,
                                     stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s, HEAD_DIM, POS_MODE,
                                     CONJUGATE)
    x, x_partner = _flat_load(X, e, partner, mask, EVICT)
    if PAIRED and HAS_K:
        k, k_partner = _flat_load(K, e, partner, mask, EVICT)  # issued before either store
    tl.store(OUT + e, (x * cos + sin * x_partner).to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)
    if PAIRED and HAS_K:
        tl.store(OUT_K + e, (k * cos + sin * k_partner).to(OUT_K.dtype.element_ty), mask=mask,
                 eviction_policy=EVICT)


@triton.jit
def rope_v4_kernel(
    Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, CU_SEQLENS,
    seqlen, n_heads_q, n_heads_k, n_head_blocks_q, table_len, position_offset,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_oqb, stride_oqs, stride_oqh, stride_oqd,
    stride_okb, stride_oks, stride_okh, stride_okd,
    stride_cos_b, stride_cos_s, stride_cos_d,
    stride_pos_b, stride_pos_s, n_tokens,
    ROTARY_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, POS_MODE: tl.constexpr, IS_VARLEN: tl.constexpr,
    COS_PER_TOKEN: tl.constexpr, COPY_TAIL: tl.constexpr, HAS_K: tl.constexpr, MATH_DTYPE: tl.constexpr,
    EAGER_ROUNDING: tl.constexpr, FUSED_QK: tl.constexpr, EVICT: tl.constexpr, INDEX_DTYPE: tl.constexpr,
    FLAT: tl.constexpr, FLAT_PAIRED: tl.constexpr, DENSE: tl.constexpr, IN_PLACE: tl.constexpr,
):
    """Grid: (token blocks, head blocks of q then of k, batch or sequence).

    With FUSED_QK the head axis has a single program: it takes every head of q (a BLOCK_H tile) and of k (a
    BLOCK_HK tile) for its tokens, issues all their loads first, and fetches cos/sin once for both.
    Otherwise a program takes BLOCK_H heads of q or of k. With FLAT (a block of elements, not a tile: see
    ``_flat_program``) the grid is one axis of FLAT-element blocks of q, then of k, or with FLAT_PAIRED of q and k
    together.

    Arguments a launch does not read, or that the kernel can derive, arrive as 1 (integers) or None (pointers),
    which Triton turns into constants: the strides of DENSE tensors and tables, the outputs' pointers and strides
    in place (IN_PLACE), the position strides without positions, where k's head blocks begin on the tiles; the
    position offset arrives plus one, so that 0 is a constant too (``plan_v4``). In CUDA-graph replay every byte of kernel arguments costs time: 64 bytes more read
    0.11 µs more on an L2-resident copy of the small prefill's bytes (docs/gpu-runs/run45).
    """
    # plan_v4 passes position_offset + 1, so that the most common offset, 0, arrives as the constant 1
    position_offset = position_offset - 1
    if DENSE and not COS_PER_TOKEN:
        stride_cos_s = ROTARY_DIM // 2  # a contiguous table of rotary_dim / 2 columns (plan_v4 passes 1)
    if FLAT:
        # FLAT elements a program over contiguous q then k (plan_v4 decides when the tensors allow it)
        _flat_program(Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, n_tokens, seqlen, n_heads_q, n_heads_k,
                      n_head_blocks_q, table_len, position_offset, stride_cos_s, stride_cos_d, stride_pos_b,
                      stride_pos_s, HEAD_DIM, FLAT, FLAT_PAIRED, HAS_K, POS_MODE, CONJUGATE, EVICT, INDEX_DTYPE)
        return
    # plan_v4 passes 1 on the tiles (1 with FUSED_QK too). Plain integer arithmetic, not tl.cdiv: that is a jitted
    # library function, decorated when triton was imported, i.e. without the interpreter if triton came first
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if DENSE:
        # contiguous q, k and outputs: their strides follow from the shapes, and plan_v4 passes 1 for each stride
        # argument so that Triton drops it from the launch (a CUDA-graph replay pays for every byte of arguments)
        stride_qb, stride_qs, stride_qh = _dense_strides(n_heads_q, seqlen, HEAD_DIM, INDEX_DTYPE)
        stride_kb, stride_ks, stride_kh = _dense_strides(n_heads_k, seqlen, HEAD_DIM, INDEX_DTYPE)
        stride_oqb, stride_oqs, stride_oqh = stride_qb, stride_qs, stride_qh
        stride_okb, stride_oks, stride_okh = stride_kb, stride_ks, stride_kh
    if IN_PLACE:
        # the outputs are the inputs: plan_v4 passes None for their pointers and 1 for their strides
        OUT_Q, OUT_K = Q, K
        stride_oqb, stride_oqs, stride_oqh, stride_oqd = stride_qb, stride_qs, stride_qh, stride_qd
        stride_okb, stride_oks, stride_okh, stride_okd = stride_kb, stride_ks, stride_kh, stride_kd
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
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
        q_in, q_out, q_mask = _tile_rows(batch_index, token_rows, token_mask, pid_h * BLOCK_H, n_heads_q,
                                         stride_qb, stride_qs, stride_qh, stride_oqb, stride_oqs, stride_oqh,
                                         BLOCK_H, INDEX_DTYPE)
        q_a, q_b = _load_pairs(Q, q_in, q_mask, stride_qd, ROTARY_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, INTERLEAVED,
                               MATH_DTYPE, EVICT)
        if FUSED_QK and HAS_K:
            k_in, k_out, k_mask = _tile_rows(batch_index, token_rows, token_mask, 0, n_heads_k,
                                             stride_kb, stride_ks, stride_kh, stride_okb, stride_oks, stride_okh,
                                             BLOCK_HK, INDEX_DTYPE)
            k_a, k_b = _load_pairs(K, k_in, k_mask, stride_kd, ROTARY_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF,
                                   INTERLEAVED, MATH_DTYPE, EVICT)
        # The q/k loads are in flight while the dependent chain position -> table row -> cos/sin resolves
        # (it dominates a decode step's latency).
        cos_a, sin_a, cos_b, sin_b = _cos_sin(
            COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
            stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s,
            ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, CONJUGATE, MATH_DTYPE)
        _rotate_store(Q, OUT_Q, q_a, q_b, cos_a, sin_a, cos_b, sin_b, q_in, q_out, q_mask, stride_qd, stride_oqd,
                      ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, COPY_TAIL,
                      EAGER_ROUNDING, EVICT)
        if FUSED_QK and HAS_K:
            _rotate_store(K, OUT_K, k_a, k_b, cos_a, sin_a, cos_b, sin_b, k_in, k_out, k_mask, stride_kd,
                          stride_okd, ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_HK, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED,
                          COPY_TAIL, EAGER_ROUNDING, EVICT)
    elif HAS_K:
        k_in, k_out, k_mask = _tile_rows(batch_index, token_rows, token_mask, (pid_h - n_head_blocks_q) * BLOCK_H,
                                         n_heads_k, stride_kb, stride_ks, stride_kh, stride_okb, stride_oks,
                                         stride_okh, BLOCK_H, INDEX_DTYPE)
        k_a, k_b = _load_pairs(K, k_in, k_mask, stride_kd, ROTARY_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, INTERLEAVED,
                               MATH_DTYPE, EVICT)
        cos_a, sin_a, cos_b, sin_b = _cos_sin(
            COS, SIN, POSITIONS, pid_b, batch_index, s_local, token_rows, token_mask, table_len, position_offset,
            stride_cos_b, stride_cos_s, stride_cos_d, stride_pos_b, stride_pos_s,
            ROTARY_DIM, BLOCK_HALF, INTERLEAVED, POS_MODE, COS_PER_TOKEN, CONJUGATE, MATH_DTYPE)
        _rotate_store(K, OUT_K, k_a, k_b, cos_a, sin_a, cos_b, sin_b, k_in, k_out, k_mask, stride_kd, stride_okd,
                      ROTARY_DIM, HEAD_DIM, BLOCK_S, BLOCK_H, BLOCK_HALF, BLOCK_TAIL, INTERLEAVED, COPY_TAIL,
                      EAGER_ROUNDING, EVICT)


class LaunchConfig(NamedTuple):
    block_s: int  # tokens per program
    block_h: int  # heads per program (with fused_qk: the q tile, at least q's head count)
    num_warps: int
    fused_qk: bool = False  # one program takes all heads of q and of k for its tokens (cos/sin fetched once)
    evict_first: bool = False  # streaming cache hint on q/k loads and stores
    # elements a program of the flat path (``_flat_program``) when q, k and the outputs are contiguous and rotate
    # over the whole head with table positions (0: tiles always), and its warps
    flat: int = 0
    flat_warps: int = 8
    # the flat path takes the same block of q and of k in one program (when they have the same shape)
    flat_paired: bool = False
    # the streaming cache hint on the flat path's q/k loads and stores (the tiles follow evict_first)
    flat_streaming: bool = True


def _next_pow2(n: int) -> int:
    # plain Python on the host path: triton.next_power_of_2 / triton.cdiv are constexpr functions in Triton 3.6 and
    # cost microseconds per call from host code
    return 1 << (max(n, 1) - 1).bit_length()


@functools.lru_cache(maxsize=4096)
def _fits_int32(*shapes_and_strides) -> bool:
    """Whether every in-kernel offset (relative to each view's own data pointer) stays below 2**31."""
    return all(sum((n - 1) * abs(st) for n, st in zip(shape, strides) if n > 0) < 2**31
               for shape, strides in zip(shapes_and_strides[::2], shapes_and_strides[1::2]))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The flat path for prefill-sized work, by (element size, whether k has q's shape): LaunchConfig fields.
# 16-bit: blocks of 2048 elements of q, then of k, 8 warps, no hint. Measured against the fused tile on the
# same buffers, forward / conjugate (docs/gpu-runs/run29): Llama-3-8B 113.3 / 113.2 µs against 114.6 / 114.0, MHA
# fp16 356.9 / 356.4 against 360.4 / 360.3 (torch.compile 360.6), with or without the streaming hint; pairing q and
# k changes nothing there (MHA 357.8 / 357.8 at 1024 elements and 8 warps, run38). The hint went in run47: where the
# compiler issues the hinted element load before its partner's, Llama's forward read 114.2 µs (see _flat_load).
# fp32 with k of q's shape: blocks of 512 elements of q and of k together (paired), 8 warps, no hint. In the harness
# (every implementation's buffers alive, interleaved rounds): 46.8 / 46.8 µs forward / backward against the tile's
# 47.8 / 47.8 and torch.compile's 47.5 / 46.8 (docs/gpu-runs/run38-fp32-paired; the published run39 46.8 / 46.9);
# in the probe beside it 47.3 / 47.3, with the streaming hint 47.5 / 47.5, and 47.3-48.4 for other paired blocks.
# fp32 otherwise (GQA, k absent): blocks of 1024 elements of q, then of k. 512 would leave a thread two elements
# (8-byte accesses) of a single stream: Llama-3-8B's shape in fp32 read 249.4 µs at 512 against 225.7 at 1024
# (99.1% of the ceiling) and 229.5 for the tile (run39).
_FLAT_16BIT = dict(flat=2048, flat_warps=8, flat_streaming=False)
_FLAT_PATH = {(2, True): _FLAT_16BIT, (2, False): _FLAT_16BIT,
              (4, True): dict(flat=512, flat_warps=8, flat_paired=True, flat_streaming=False),
              (4, False): dict(flat=1024, flat_warps=8, flat_streaming=False)}

# Largest fused tile (BLOCK_S tokens x all q and k heads x head_dim, padded) kept in registers: 32 values a thread
# at 32 warps. Beyond it (very many or very wide heads) a program takes one head block of q or of k.
_FUSED_TILE_MAX = 32768


@functools.lru_cache(maxsize=1024)
def launch_config(n_tokens: int, n_heads_q: int, n_heads_k: int, head_dim: int, rotary_dim: int,
                  cos_per_token: bool = False, element_size: int = 2) -> LaunchConfig:
    """Block sizes, chosen by measurement on the H100 (tools/probe_limits.py, tools/tune_v4.py,
    tools/probe_host_l2.py; docs/gpu-runs/).

    Prefill-sized work (4096 tokens or more) in fp16/bf16/fp32 takes the flat path where the call allows it (NeoX,
    contiguous, out of place; ``flat``: blocks of consecutive elements, in fp32 of q and k together; see
    ``_FLAT_PATH``); otherwise two tokens per program holding every q and k head (``fused_qk``: all loads issued
    before any store, cos/sin fetched once per token), streaming cache hint, 16 warps, or 32 when a
    thread would hold more than 48 bytes of the tile at 16 warps: MHA with 64+64 heads of 128 (360.8 µs against
    373.0 at 16 warps and 361.7 for torch.compile, docs/gpu-runs/run12) and fp32 with 32+32 heads of 64 (full
    occupancy: 30 registers, 2 x 1024 threads an SM; tile probes 47.4 against 48.3 µs in run22, 48.5 against 48.7
    in run24, the harness 47.3 µs either way); Llama-3-8B's 40 bytes stay at 16 warps. Measured (CUDA-graph
    replays, docs/gpu-runs/run6): Llama-3-8B 115.4 µs against 115.5 µs for copying the same bytes with torch;
    partial rotary out of place 119.3 µs, where the earlier 16 tokens x 1 head tiles took 127-128 µs. Small
    prefills want a few heads per program (fewer, fuller programs), with per-token cos/sin rows one token and every
    head (3.1 µs against 3.9 for two tokens x 16 heads, run12); a decode step one token x 8 heads (run11, run12).
    Under the interpreter every program costs Python overhead, so tiles are as large as the shape allows.
    """
    n_heads = max(n_heads_q, n_heads_k)
    if _device.INTERPRET:
        return LaunchConfig(min(_next_pow2(n_tokens), 16), min(_next_pow2(n_heads), 8), 4)
    if n_tokens >= 4096:
        per_token = (_next_pow2(n_heads_q) + (_next_pow2(n_heads_k) if n_heads_k else 0)) * _next_pow2(head_dim)
        if 2 * per_token <= _FUSED_TILE_MAX:
            bytes_per_thread_at_16_warps = 2 * per_token * element_size // (16 * 32)
            return LaunchConfig(2, 1, 32 if bytes_per_thread_at_16_warps > 48 else 16, fused_qk=True,
                                evict_first=True, **_FLAT_PATH.get((element_size, n_heads_k == n_heads_q), {}))
        if per_token <= _FUSED_TILE_MAX:
            return LaunchConfig(1, 1, 16, fused_qk=True, evict_first=True)
        return LaunchConfig(16, 1, 8, evict_first=True)
    if n_tokens > 128:
        if cos_per_token:
            return LaunchConfig(1, min(_next_pow2(n_heads), 32), 4)
        return LaunchConfig(2, min(_next_pow2(n_heads), 16), 4)
    return LaunchConfig(1, min(_next_pow2(n_heads), 8), 4)


# The direct-launch cache: Triton's JIT entry point re-derives the specialisation of ~40 arguments in Python on
# every call (tens of microseconds); for a decode step that is most of the time. After the first launch of a given
# specialisation we keep the compiled kernel's runner and call it directly. The key holds everything Triton
# specialises on: the static part of a launch (grid, integer arguments but the position offset, constexprs, warps:
# ``V4Launch.key``), the dtypes and 16-byte alignment of the pointers, and the specialisation class of the position
# offset, which changes every decode step.
_direct_launchers: dict = {}
_OFFSET_ARG = 5  # index of the position offset (passed + 1) among the integer arguments


def _int_class(value: int) -> tuple:
    return (value == 1, value % 16 == 0, -2**31 <= value < 2**31)


def _static_key(grid, ints, constexprs, num_warps, dtypes) -> tuple:
    return (grid, num_warps, tuple(constexprs.values()), ints[:_OFFSET_ARG], ints[_OFFSET_ARG + 1:], dtypes)


def _stream_getter():
    """The current CUDA stream as Triton's launcher takes it, read the way Triton reads it (None: let Triton do it)."""
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    get_device = getattr(torch._C, "_cuda_getDevice", None)
    if raw_stream is None or get_device is None:
        return None
    return lambda: raw_stream(get_device())


_current_stream = _stream_getter()


def _launch(grid, pointers, ints, constexprs, num_warps, static_key):
    """Launch through the direct-launch cache. ``static_key``: ``V4Launch.key`` (grid, integers but the offset,
    constexprs, warps, pointer dtypes)."""
    if _device.INTERPRET:
        with _device.INTERPRETER_LOCK:
            rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
        return
    aligned = 0  # bit i: pointer i is 16-byte aligned (Triton specialises on it)
    for pointer in pointers:
        aligned = (aligned << 1) | (pointer is not None and pointer.data_ptr() % 16 == 0)
    key = (static_key, _int_class(ints[_OFFSET_ARG]), aligned)
    entry = _direct_launchers.get(key)
    if entry is None:
        compiled = rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
        if len(_direct_launchers) > 4096:
            _direct_launchers.clear()
        _direct_launchers[key] = [compiled[grid], None]  # the argument convention is learnt on the next call
        return
    runner, with_constexprs = entry
    if with_constexprs is None:
        # Triton versions differ in whether the compiled launcher takes constexpr arguments; a wrong count is
        # rejected by the launcher's argument parser before anything runs, so trying is safe.
        for convention in (True, False):
            try:
                _run_compiled(runner, pointers, ints, constexprs, convention)
            except TypeError:
                continue
            entry[1] = convention
            return
        entry[1] = with_constexprs = "jit"
    if with_constexprs == "jit":
        rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
    else:
        _run_compiled(runner, pointers, ints, constexprs, with_constexprs)


def _run_compiled(runner, pointers, ints, constexprs, with_constexprs):
    args = (*pointers, *ints, *constexprs.values()) if with_constexprs else (*pointers, *ints)
    if _current_stream is None:
        runner(*args)
    else:
        runner(*args, stream=_current_stream())  # skips the runner's own device and stream lookups


class V4Launch:
    """One fully specialised launch of v4: everything :func:`rope_v4` derives from shapes, strides, dtypes and
    switches. Calling it with the tensors (whose data pointers may change from call to call) and the position offset
    launches the kernel; ``ropekit.api`` keeps one per call signature, so a repeated eager call (a decode step)
    skips validation and this derivation."""

    __slots__ = ("grid", "ints_head", "ints_tail", "constexprs", "num_warps", "key", "in_place")

    def __init__(self, grid, ints, constexprs, num_warps, dtypes):
        self.grid, self.constexprs, self.num_warps = grid, constexprs, num_warps
        self.in_place = constexprs["IN_PLACE"]
        self.ints_head, self.ints_tail = ints[:_OFFSET_ARG], ints[_OFFSET_ARG + 1:]
        self.key = _static_key(grid, ints, constexprs, num_warps, dtypes)

    @staticmethod
    def pointers(q, k, out_q, out_k, cos, sin, positions, cu_seqlens, in_place: bool = False) -> tuple:
        """The kernel's eight pointer arguments; an absent k is stood in for by q (the kernel's HAS_K skips it),
        absent positions and cu_seqlens are None (constants to Triton: not passed), and so are the outputs of an
        in-place launch (the kernel writes through q and k)."""
        if in_place:
            return q, k if k is not None else q, None, None, cos, sin, positions, cu_seqlens
        return (q, k if k is not None else q, out_q, out_k if out_k is not None else out_q, cos, sin, positions,
                cu_seqlens)

    def __call__(self, q, k, out_q, out_k, cos, sin, positions, cu_seqlens, position_offset: int) -> None:
        """q/k/out/cos/sin/positions/cu_seqlens: the tensors the plan was made for, or any with the same shapes,
        strides and dtypes (views count: only their data pointers are read); k, positions and cu_seqlens may be
        None when the plan was made without them. A plan made in place (outputs that are q and k) writes through q
        and k whatever outputs it is given."""
        _launch(self.grid, self.pointers(q, k, out_q, out_k, cos, sin, positions, cu_seqlens, self.in_place),
                (*self.ints_head, position_offset + 1, *self.ints_tail), self.constexprs, self.num_warps, self.key)


_MATH_DTYPE = {torch.float64: tl.float64}


def rope_v4(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
            out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
            interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
            copy_tail: bool = True, eager_rounding: bool = False, config: LaunchConfig | None = None) -> None:
    """Launch v4. q/k/out are 4-D ``(batch, seq, heads, head_dim)`` views with any strides, or 3-D ``(tokens, heads,
    head_dim)`` when ``positions.is_varlen``. cos/sin: ``(table_len, rotary_dim/2)`` tables, or with
    ``cos_per_token`` full-width rows ``(batch, seq, rotary_dim)`` (``(tokens, rotary_dim)`` for varlen).

    The launcher trusts its caller (``ropekit.api`` validates); it only normalises shapes and picks block sizes
    (``config`` overrides :func:`launch_config`: ``tools/tune_v4.py`` measures candidates this way).
    """
    plan = plan_v4(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=positions, rotary_dim=rotary_dim,
                   interleaved=interleaved, conjugate=conjugate, cos_per_token=cos_per_token, copy_tail=copy_tail,
                   eager_rounding=eager_rounding, config=config)
    if plan is not None:
        plan(q, k, out_q, out_k, cos, sin, positions.tensor, positions.cu_seqlens, positions.offset)


def plan_v4(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
            out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
            interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
            copy_tail: bool = True, eager_rounding: bool = False,
            config: LaunchConfig | None = None) -> V4Launch | None:
    """The :class:`V4Launch` for :func:`rope_v4`'s arguments (None when there is nothing to do)."""
    if positions.is_varlen:
        q, out_q = q.unsqueeze(0), out_q.unsqueeze(0)
        if k is not None:
            k, out_k = k.unsqueeze(0), out_k.unsqueeze(0)
        n_batch = positions.cu_seqlens.shape[0] - 1
        seqlen = positions.max_seqlen
        if cos_per_token:
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    else:
        n_batch, seqlen = q.shape[0], q.shape[1]
    head_dim = q.shape[-1]
    n_heads_q = q.shape[2]
    n_heads_k = k.shape[2] if k is not None else 0
    n_tokens = n_batch * seqlen
    if config is None:
        config = launch_config(n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token,
                               q.element_size())
    contiguous = all(t.is_contiguous() for t in (q, k, out_q, out_k) if t is not None)
    in_place = _same_view(q, out_q) and (k is None or _same_view(k, out_k))
    flat = config.flat if _flat_applies(q, k, out_q, out_k, contiguous, positions, rotary_dim, interleaved,
                                        cos_per_token, eager_rounding) else 0
    block_h = config.block_h
    paired = bool(flat) and config.flat_paired and (k is None or k.shape == q.shape)
    if flat:
        # one grid axis: the flat path's blocks of q, then of k (n_head_blocks_q tells the kernel where k begins),
        # or blocks of q and k together
        n_head_blocks_q = _cdiv(n_tokens * n_heads_q * head_dim, flat)
        grid = (n_head_blocks_q + (0 if paired else _cdiv(n_tokens * n_heads_k * head_dim, flat)), 1, 1)
    else:
        if config.fused_qk:
            # the q and k tiles cover every head: one program per token block
            block_h = max(block_h, _next_pow2(n_heads_q))
            n_head_blocks_q, n_head_blocks_k = 1, 0
        else:
            n_head_blocks_q, n_head_blocks_k = _cdiv(n_heads_q, block_h), _cdiv(n_heads_k, block_h)
        grid = (_cdiv(seqlen, config.block_s), n_head_blocks_q + n_head_blocks_k, n_batch)
    if grid[0] == 0 or n_batch == 0 or (q.numel() == 0 and (k is None or k.numel() == 0)):
        return None
    if n_batch > 65535:
        # sequences sit on the grid's third axis, which CUDA caps at 65535
        raise ValueError(f"v4 handles at most 65535 sequences per launch (grid axis 2), got {n_batch}")
    # Integer arguments a launch does not read are passed as 1, which Triton specialises into a constant (1 is not
    # passed at all), and absent tensors as None: graph replay pays for every byte of arguments (see the kernel).
    # DENSE: contiguous q, k and outputs, and a contiguous table of rotary_dim / 2 columns; the kernel derives
    # their strides.
    dense = contiguous and (cos_per_token or (cos.is_contiguous() and sin.is_contiguous()
                                              and cos.shape[1] == rotary_dim // 2))
    if cos_per_token:
        cos_strides = (0 if positions.is_varlen else cos.stride(0), cos.stride(1), cos.stride(2))
        table_len = 1  # not read
    else:
        cos_strides = (1, 1, 1) if dense else (1, cos.stride(0), cos.stride(1))  # a table has no batch axis
        table_len = cos.shape[0]
    pos_tensor = positions.tensor
    if pos_tensor is None:
        pos_strides = (1, 1)
    elif pos_tensor.ndim == 1:
        # per-sequence offsets (batch,) are indexed by sequence, varlen position ids (tokens,) by packed token
        pos_strides = (0, pos_tensor.stride(0)) if positions.mode == POSITION_IDS else (pos_tensor.stride(0), 1)
    else:
        pos_strides = (pos_tensor.stride(0), pos_tensor.stride(1))
    k_args = k if k is not None else q
    out_k_args = out_k if out_k is not None else out_q
    if log.isEnabledFor(logging.DEBUG):
        log.debug("ropekit triton v4: grid=%s BLOCK_S=%d BLOCK_H=%d warps=%d fused_qk=%s q=%s k=%s dtype=%s "
                  "rotary_dim=%d interleaved=%s conjugate=%s pos_mode=%d varlen=%s cos_per_token=%s", grid,
                  config.block_s, block_h, config.num_warps, config.fused_qk, tuple(q.shape),
                  None if k is None else tuple(k.shape), q.dtype, rotary_dim, interleaved, conjugate, positions.mode,
                  positions.is_varlen, cos_per_token)
    if dense:
        tensor_strides = (1,) * 16
    elif in_place:
        tensor_strides = (*q.stride(), *k_args.stride(), *(1,) * 8)  # the kernel takes the inputs' strides
    else:
        tensor_strides = (*q.stride(), *k_args.stride(), *out_q.stride(), *out_k_args.stride())
    # the tiles derive where k's head blocks begin; the flat path's blocks count elements; varlen tiles bound their
    # rows by the packed token count (1 elsewhere: not read)
    n_rows = n_tokens if flat else (q.shape[1] if positions.is_varlen else 1)
    ints = (seqlen, n_heads_q, n_heads_k, n_head_blocks_q if flat else 1, table_len, positions.offset + 1,
            *tensor_strides, *cos_strides, *pos_strides, n_rows)
    constexprs = dict(
        ROTARY_DIM=rotary_dim, HEAD_DIM=head_dim,
        BLOCK_S=config.block_s, BLOCK_H=block_h, BLOCK_HK=_next_pow2(n_heads_k) if config.fused_qk else 1,
        BLOCK_HALF=_next_pow2(rotary_dim // 2),
        BLOCK_TAIL=_next_pow2(max(head_dim - rotary_dim, 1)),
        INTERLEAVED=interleaved, CONJUGATE=conjugate, POS_MODE=positions.mode, IS_VARLEN=positions.is_varlen,
        # in place the tail channels are already where they belong
        COS_PER_TOKEN=cos_per_token, COPY_TAIL=copy_tail and rotary_dim < head_dim and not in_place,
        HAS_K=k is not None,
        MATH_DTYPE=_MATH_DTYPE.get(q.dtype, tl.float32), EAGER_ROUNDING=eager_rounding,
        FUSED_QK=config.fused_qk, FLAT=flat, FLAT_PAIRED=paired, DENSE=dense, IN_PLACE=in_place,
        EVICT="evict_first" if (config.flat_streaming if flat else config.evict_first) else "",
        # 32-bit address arithmetic is fewer instructions; int64 as soon as an offset into any tensor the kernel
        # indexes with it could overflow: q, k, the outputs, per-token cos/sin rows and position ids
        INDEX_DTYPE=tl.int32 if _fits_int32(q.shape, q.stride(), k_args.shape, k_args.stride(), out_q.shape,
                                            out_q.stride(), out_k_args.shape, out_k_args.stride(), cos.shape,
                                            cos.stride(), sin.shape, sin.stride(),
                                            *((pos_tensor.shape, pos_tensor.stride()) if pos_tensor is not None
                                              else ()))
        and (not flat or max(q.numel(), k_args.numel()) + flat < 2**31) else tl.int64,  # flat: a block's last lane
    )
    if flat:
        log.debug("ropekit triton v4: flat path, %d elements a program%s, %d warps", flat,
                  " of q and of k" if paired else "", config.flat_warps)
    dtypes = tuple(getattr(p, "dtype", None) for p in V4Launch.pointers(q, k, out_q, out_k, cos, sin, pos_tensor,
                                                                          positions.cu_seqlens, in_place))
    return V4Launch(grid, ints, constexprs, config.flat_warps if flat else config.num_warps, dtypes)


_FLAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _same_view(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``out`` is ``x`` itself (an in-place call): same memory, shape and strides."""
    return out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.shape == x.shape


def _flat_applies(q, k, out_q, out_k, contiguous: bool, positions: PositionSpec, rotary_dim: int,
                  interleaved: bool, cos_per_token: bool, eager_rounding: bool) -> bool:
    """Whether the flat path can run these tensors: contiguous (batch, seq, heads, head_dim) q, k and outputs
    (``contiguous``: the caller's check of all four), the whole head rotated with NeoX pairs, positions from the
    table (not varlen, not per-token rows), one rounding in fp32 math, and out of place: in place, a lane would
    overwrite an element another warp may still have to read as its partner."""
    return (not positions.is_varlen and not cos_per_token and not eager_rounding and not interleaved
            and q.dtype in _FLAT_DTYPES
            and rotary_dim == q.shape[-1] and q.ndim == 4 and out_q.data_ptr() != q.data_ptr()
            and (k is None or out_k.data_ptr() != k.data_ptr()) and contiguous)
