"""The ablations' own kernels: a copy with a chosen program size, and a row kernel with switches.

Each is a labelled experimental instrument, not a rung of the ladder: ``rows_rope_kernel`` with ``ROWS=1``,
``LOAD_TABLES=True`` does the work of v1/v2 (one head vector per program, its cos/sin row loaded), and each switch
changes exactly one thing about it.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["copy_blocks_kernel", "rows_rope_kernel", "copy_blocks", "rows_rope"]


@triton.jit
def copy_blocks_kernel(SRC, DST, n_elements, BLOCK: tl.constexpr):
    """Program p copies elements [p * BLOCK, (p + 1) * BLOCK): its bytes in flight are BLOCK elements."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_elements
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=inside), mask=inside)


@triton.jit
def rows_rope_kernel(X, COS, SIN, OUT, n_rows, seqlen, n_heads,
                     HALF: tl.constexpr, ROWS: tl.constexpr, LOAD_TABLES: tl.constexpr):
    """ROWS consecutive head vectors of the contiguous (n_rows, 2 * HALF) view of X per program, NeoX pairs.

    LOAD_TABLES=False turns every pair by one fixed angle instead of loading the token's cos/sin row: x's bytes and
    the program's shape stay the same, the table traffic is gone.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = (rows < n_rows)[:, None]
    lanes = tl.arange(0, HALF)[None, :]
    first_half = rows[:, None] * (2 * HALF) + lanes
    a = tl.load(X + first_half, mask=live, other=0.0).to(tl.float32)
    b = tl.load(X + first_half + HALF, mask=live, other=0.0).to(tl.float32)
    if LOAD_TABLES:
        table_offsets = ((rows // n_heads) % seqlen)[:, None] * HALF + lanes
        c = tl.load(COS + table_offsets, mask=live, other=1.0)
        s = tl.load(SIN + table_offsets, mask=live, other=0.0)
    else:
        c = 0.6
        s = 0.8
    tl.store(OUT + first_half, (a * c - b * s).to(OUT.dtype.element_ty), mask=live)
    tl.store(OUT + first_half + HALF, (b * c + a * s).to(OUT.dtype.element_ty), mask=live)


def copy_blocks(src, dst, block: int, num_warps: int = 4):
    """Launch the copy; returns what the launch returned (the compiled kernel on a GPU)."""
    n = src.numel()
    return copy_blocks_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=num_warps)


def rows_rope(x, cos, sin, out, rows: int = 1, load_tables: bool = True, num_warps: int = 4):
    """Launch the row kernel on a contiguous (batch, seq, heads, head_dim) x with positions 0..seq-1."""
    batch, seqlen, n_heads, head_dim = x.shape
    n_rows = batch * seqlen * n_heads
    return rows_rope_kernel[(triton.cdiv(n_rows, rows),)](x, cos, sin, out, n_rows, seqlen, n_heads,
                                                          HALF=head_dim // 2, ROWS=rows, LOAD_TABLES=load_tables,
                                                          num_warps=num_warps)
