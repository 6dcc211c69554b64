"""v4's flat kernel: one program per block of consecutive elements, for contiguous NeoX calls over the whole head.

A second algorithm beside the tile (``ropekit.triton.v4``), in a kernel of its own, behind the same launcher. It has
the structure of the element-wise kernel torch.compile generates for the eager formula: no tile of heads, each
element's partner (``e +- HEAD_DIM/2``) loaded separately and served by the cache, because it lies in a line the
same program loads. On contiguous prefill-sized work this beats the tile on some GPUs; ``ropekit.triton.choice`` decides where it runs (docs/tuning.md#flat-path).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (interpreter switch before the kernels are decorated)
from .v4 import after_grid_before

__all__ = ["rope_flat_kernel"]


@triton.jit
def _flat_angles(COS, SIN, POSITIONS, e, mask, n_heads, seqlen, table_len, position_offset, cos_strides,
                 position_strides, HEAD_DIM: tl.constexpr, POS_MODE: tl.constexpr,
                 CONJUGATE: tl.constexpr):
    """For elements ``e`` of a contiguous (batch, seq, n_heads, HEAD_DIM) tensor rotated with NeoX pairs: the offset
    of each element's partner (e +- HEAD_DIM/2), its cos, and the signed sin that multiplies the partner
    (``out[e] = x[e] cos + sin_signed x[partner]``)."""
    stride_cos_s, stride_cos_d = cos_strides[0], cos_strides[1]
    stride_pos_b, stride_pos_s = position_strides[0], position_strides[1]
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
    # two loads it issues first, so a hint here would decide the line's policy by accident
    # (docs/tuning.md#eviction-hints).
    x_partner = tl.load(X + partner, mask=mask, other=0.0).to(tl.float32)
    return x, x_partner


@triton.jit
def rope_flat_kernel(
    # contiguous (batch, seq, heads, HEAD_DIM) q and k (q stands in for an absent k: HAS_K) and their outputs
    Q, K, OUT_Q, OUT_K,
    # a (table_len, HEAD_DIM / 2) float32 table; cos_strides: (row, column)
    COS, SIN, cos_strides,
    # positions: POS_MODE says what POSITIONS holds (position_strides: (sequence, token)); position_offset + 1
    POSITIONS, position_strides, position_offset,
    # (n_tokens, seqlen, n_heads_q, n_heads_k, table_len, n_q_blocks: the programs that take q)
    sizes,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, PAIRED: tl.constexpr, HAS_K: tl.constexpr, POS_MODE: tl.constexpr,
    CONJUGATE: tl.constexpr, EVICT: tl.constexpr, INDEX_DTYPE: tl.constexpr,
    # how the launch follows the grid before it (groups.Dependency)
    DEPENDENCY: tl.constexpr,
):
    """Grid: (blocks,). A program takes BLOCK consecutive elements of q (the first ``n_q_blocks`` programs) or of k,
    or with PAIRED (q and k of the same shape) the same BLOCK elements of both, all four loads issued before either
    store.

    Element e becomes ``x[e] cos -/+ x[partner] sin``; its partner (e +- HEAD_DIM/2) lies in a line the same
    program loads, so the second load is served by the cache. GPT-J's partner (e +- 1) would turn both the partner
    and the cos/sin loads into per-element gathers, so GPT-J pairing keeps the tile (docs/tuning.md#flat-path).
    """
    after_grid_before(DEPENDENCY)
    n_tokens, seqlen, n_heads_q, n_heads_k, table_len, n_q_blocks = (sizes[0], sizes[1], sizes[2], sizes[3],
                                                                     sizes[4], sizes[5])
    position_offset = position_offset - 1
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
    mask = e < tl.cast(n_tokens, INDEX_DTYPE) * n_heads * HEAD_DIM
    partner, cos, sin = _flat_angles(COS, SIN, POSITIONS, e, mask, n_heads, seqlen, table_len, position_offset,
                                     cos_strides, position_strides, HEAD_DIM, POS_MODE, CONJUGATE)
    x, x_partner = _flat_load(X, e, partner, mask, EVICT)
    if PAIRED and HAS_K:
        k, k_partner = _flat_load(K, e, partner, mask, EVICT)  # issued before either store
    tl.store(OUT + e, (x * cos + sin * x_partner).to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)
    if PAIRED and HAS_K:
        tl.store(OUT_K + e, (k * cos + sin * k_partner).to(OUT_K.dtype.element_ty), mask=mask,
                 eviction_policy=EVICT)
