"""v4's flat kernel: one program per run of consecutive head vectors, for contiguous NeoX calls over the whole head.

A second algorithm beside the tile (``ropekit.triton.v4``), in a kernel of its own, behind the same launcher. It sees
q and k as flat runs of head vectors, with no tile of tokens and heads: a program takes ``ROWS`` consecutive head
vectors (a run that crosses from one token's heads into the next token's), loads each vector's two NeoX halves once,
and reads cos/sin at each vector's token, one table row a vector that the heads of a token share in the cache. On
contiguous prefill-sized work this beats the tile on some GPUs; ``ropekit.triton.choice`` decides where it runs
(docs/tuning.md#flat-path).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import device as _device  # noqa: F401  (interpreter switch before the kernels are decorated)
from .v4 import after_grid_before

__all__ = ["rope_flat_kernel"]


@triton.jit
def _flat_cos_sin(COS, SIN, POSITIONS, row, row_mask, column, column_mask, n_heads, seqlen, table_len,
                  position_offset, cos_strides, position_strides, POS_MODE: tl.constexpr, CONJUGATE: tl.constexpr):
    """cos and sin, (rows, columns), of head vectors ``row`` of a contiguous (batch, seq, n_heads, head) tensor: the
    table read at each vector's token's position, sin negated for the conjugate rotation."""
    stride_cos_s, stride_cos_d = cos_strides[0], cos_strides[1]
    stride_pos_b, stride_pos_s = position_strides[0], position_strides[1]
    token = row // n_heads
    s_local = token % seqlen
    batch_index = token // seqlen
    if POS_MODE == 0:
        position = s_local.to(tl.int64) + position_offset
    elif POS_MODE == 1:
        position = s_local.to(tl.int64) + tl.load(POSITIONS + batch_index * stride_pos_b, mask=row_mask,
                                                  other=0).to(tl.int64)
    else:
        position = tl.load(POSITIONS + batch_index * stride_pos_b + s_local * stride_pos_s, mask=row_mask,
                           other=0).to(tl.int64)
    # as on the tile path: never read outside the table, and such tokens come out as NaN
    cs_mask = (row_mask & (position >= 0) & (position < table_len))[:, None] & column_mask
    offs = position[:, None] * stride_cos_s + column[None, :] * stride_cos_d
    cos = tl.load(COS + offs, mask=cs_mask, other=float("nan"), eviction_policy="evict_last")
    sin = tl.load(SIN + offs, mask=cs_mask, other=float("nan"), eviction_policy="evict_last")
    if CONJUGATE:
        sin = -sin
    return cos, sin


@triton.jit
def _flat_load(X, first, mask, HALF: tl.constexpr, EVICT: tl.constexpr):
    """The two NeoX halves (x1, x2) of the head vectors whose first halves sit at ``X + first``, in fp32."""
    x1 = tl.load(X + first, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    x2 = tl.load(X + first + HALF, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    return x1, x2


@triton.jit
def _flat_store(OUT, first, mask, x1, x2, cos, sin, HALF: tl.constexpr, EVICT: tl.constexpr):
    """(x1 cos - x2 sin, x2 cos + x1 sin) stored where (x1, x2) came from, in OUT's dtype."""
    tl.store(OUT + first, (x1 * cos - x2 * sin).to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)
    tl.store(OUT + first + HALF, (x2 * cos + x1 * sin).to(OUT.dtype.element_ty), mask=mask, eviction_policy=EVICT)


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
    # HALF_WIDTH: HEAD_DIM / 2 rounded up to a power of two (a tensor's extent in Triton)
    HEAD_DIM: tl.constexpr, HALF_WIDTH: tl.constexpr, ROWS: tl.constexpr, PAIRED: tl.constexpr,
    HAS_K: tl.constexpr, POS_MODE: tl.constexpr, CONJUGATE: tl.constexpr, EVICT: tl.constexpr,
    INDEX_DTYPE: tl.constexpr,
    # how the launch follows the grid before it (groups.Dependency)
    DEPENDENCY: tl.constexpr,
):
    """Grid: (blocks,). A program takes ROWS consecutive head vectors of q (the first ``n_q_blocks`` programs) or of
    k, or with PAIRED (q and k of the same shape) the same ROWS vectors of both, all loads issued before any store.

    A vector's NeoX pair (x[i], x[i + HEAD_DIM/2]) is loaded once, by the thread that stores it, so nothing a program
    reads is written by another thread first. GPT-J's pairs (x[2i], x[2i+1]) would split each half into every other
    element, so GPT-J pairing keeps the tile (docs/tuning.md#flat-path).
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
    row = block.to(INDEX_DTYPE) * ROWS + tl.arange(0, ROWS).to(INDEX_DTYPE)
    row_mask = row < tl.cast(n_tokens, INDEX_DTYPE) * n_heads
    column = tl.arange(0, HALF_WIDTH).to(INDEX_DTYPE)  # times a column stride: a table's may be a large one
    column_mask = (column < HEAD_DIM // 2)[None, :]
    mask = row_mask[:, None] & column_mask
    cos, sin = _flat_cos_sin(COS, SIN, POSITIONS, row, row_mask, column, column_mask, n_heads, seqlen, table_len,
                             position_offset, cos_strides, position_strides, POS_MODE, CONJUGATE)
    first = row[:, None] * HEAD_DIM + column[None, :]
    x1, x2 = _flat_load(X, first, mask, HEAD_DIM // 2, EVICT)
    if PAIRED and HAS_K:
        k1, k2 = _flat_load(K, first, mask, HEAD_DIM // 2, EVICT)  # issued before either store
    _flat_store(OUT, first, mask, x1, x2, cos, sin, HEAD_DIM // 2, EVICT)
    if PAIRED and HAS_K:
        _flat_store(OUT_K, first, mask, k1, k2, cos, sin, HEAD_DIM // 2, EVICT)
