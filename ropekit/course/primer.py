"""The Triton primer's examples (notebook 02): each small kernel shows one idea, and the notebook shows its source.

``half_block_broken_kernel`` is broken on purpose: it is the ``tl.constexpr`` trap the primer explains, next to its
fix ``half_block_kernel``. ``python -m ropekit.course.primer`` runs :func:`debug_demo` (what notebook 02 shows under
the interpreter, also on a GPU machine, where it runs this module in a subprocess).
"""

from __future__ import annotations

import torch
import triton.language as tl
import triton

__all__ = ["gather_kernel", "half_block_broken_kernel", "half_block_kernel", "masked_load_kernel", "outer_kernel",
           "cast_kernel", "debug_kernel", "debug_demo"]


@triton.jit
def gather_kernel(X, OUT, START, N: tl.constexpr):
    """Copy x[START : START + N] to out[0 : N]: X + offsets is a block of N pointers."""
    pointers = X + START + tl.arange(0, N)  # N addresses: X's, moved START + 0, 1, ... elements on
    values = tl.load(pointers)  # one value per pointer
    tl.store(OUT + tl.arange(0, N), values)


@triton.jit
def half_block_broken_kernel(X, OUT, HEAD_DIM: tl.constexpr):
    """Broken on purpose: H is an ordinary variable, so tl.arange(0, H) is refused when the kernel is compiled."""
    H = HEAD_DIM // 2
    lanes = tl.arange(0, H)
    tl.store(OUT + lanes, tl.load(X + H + lanes))


@triton.jit
def half_block_kernel(X, OUT, HEAD_DIM: tl.constexpr):
    """Copy the second half of a row of HEAD_DIM values: H is declared a compile-time constant."""
    H: tl.constexpr = HEAD_DIM // 2
    lanes = tl.arange(0, H)
    tl.store(OUT + lanes, tl.load(X + H + lanes))


@triton.jit
def masked_load_kernel(X, OUT, n, BLOCK: tl.constexpr):
    """Load the n values of X in a block of BLOCK >= n lanes; lanes past n read ``other`` (-1) instead of memory."""
    lanes = tl.arange(0, BLOCK)
    inside = lanes < n  # the mask: one boolean per lane
    values = tl.load(X + lanes, mask=inside, other=-1.0)
    tl.store(OUT + lanes, values)  # OUT has BLOCK elements, so the `other` values are visible


@triton.jit
def outer_kernel(A, B, OUT, M: tl.constexpr, N: tl.constexpr):
    """OUT[i, j] = A[i] * B[j]: a column (M, 1) times a row (1, N) broadcasts to an (M, N) block."""
    rows = tl.arange(0, M)[:, None]  # shape (M, 1)
    cols = tl.arange(0, N)[None, :]  # shape (1, N)
    product = tl.load(A + rows) * tl.load(B + cols)  # (M, 1) * (1, N) -> (M, N)
    tl.store(OUT + rows * N + cols, product)  # row-major offsets, also (M, N)


@triton.jit
def cast_kernel(X, OUT, N: tl.constexpr):
    """OUT = 3 * X, computed in float32 whatever X's dtype, rounded once to OUT's dtype."""
    x = tl.load(X + tl.arange(0, N))  # X's dtype (bfloat16, say)
    y = x.to(tl.float32) * 3.0  # float32 math
    tl.store(OUT + tl.arange(0, N), y.to(OUT.dtype.element_ty))  # one rounding, to OUT's dtype


@triton.jit
def debug_kernel(X, N: tl.constexpr):
    """Print what each program loaded: tl.device_print works on a GPU and in the interpreter."""
    pid = tl.program_id(0)
    x = tl.load(X + pid * N + tl.arange(0, N))
    tl.device_print("loaded", x)


def debug_demo() -> None:
    """Two programs of debug_kernel on a (2, 4) tensor of 0..7 (run under the interpreter: prints on stdout)."""
    x = torch.arange(8, dtype=torch.float32)
    debug_kernel[(2,)](x, N=4)


if __name__ == "__main__":
    debug_demo()
