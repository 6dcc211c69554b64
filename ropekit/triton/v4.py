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
  or more (int32 otherwise: fewer instructions), so huge tensors are correct (docs/tuning.md#index-dtype).
* Positions outside the table are never read (masked loads); such tokens come out as NaN so the error is loud.
* A **flat path** (``FLAT``, ``ropekit.triton.v4_flat``) for prefill-sized, contiguous, out-of-place NeoX calls over
  the whole head: blocks of consecutive elements instead of tiles (docs/tuning.md#flat-path).

This module is the kernel only. Block sizes, plans and launching live in ``ropekit.triton.launch``, whose
:func:`~ropekit.triton.launch.rope_v4` is the launcher.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (interpreter switch before the kernels are decorated)
from .v4_flat import flat_program

__all__ = ["rope_v4_kernel"]


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
    ``ropekit.triton.v4_flat``) the grid is one axis of FLAT-element blocks of q, then of k, or with FLAT_PAIRED of q
    and k together.

    Arguments a launch does not read, or that the kernel can derive, arrive as 1 (integers) or None (pointers),
    which Triton turns into constants: the strides of DENSE tensors and tables, the outputs' pointers and strides
    in place (IN_PLACE), the position strides without positions, where k's head blocks begin on the tiles; the
    position offset arrives plus one, so that 0 is a constant too (``ropekit.triton.launch.plan_v4``). In CUDA-graph
    replay every byte of kernel arguments costs time (docs/tuning.md#lean-launch).
    """
    # plan_v4 passes position_offset + 1, so that the most common offset, 0, arrives as the constant 1
    position_offset = position_offset - 1
    if DENSE and not COS_PER_TOKEN:
        stride_cos_s = ROTARY_DIM // 2  # a contiguous table of rotary_dim / 2 columns (plan_v4 passes 1)
    if FLAT:
        # FLAT elements a program over contiguous q then k (plan_v4 decides when the tensors allow it)
        flat_program(Q, K, OUT_Q, OUT_K, COS, SIN, POSITIONS, n_tokens, seqlen, n_heads_q, n_heads_k,
                     n_head_blocks_q, table_len, position_offset, stride_cos_s, stride_cos_d, stride_pos_b,
                     stride_pos_s, HEAD_DIM, FLAT, FLAT_PAIRED, HAS_K, POS_MODE, CONJUGATE, EVICT, INDEX_DTYPE)
        return
    # plan_v4 passes 1 on the tiles (1 with FUSED_QK too). Plain integer arithmetic, not tl.cdiv: that is a jitted
    # library function, decorated when triton was imported, i.e. without the interpreter if triton came first
    n_head_blocks_q = (n_heads_q + BLOCK_H - 1) // BLOCK_H
    if DENSE:
        # contiguous q, k and outputs: their strides follow from the shapes, and plan_v4 passes 1 for each stride
        # argument so that Triton drops it from the launch (docs/tuning.md#dense-strides)
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
