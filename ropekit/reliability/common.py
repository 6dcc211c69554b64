"""What every reliability module shares: dtypes by name, the layout permutations, and which backends run here.

A backend that answers a configuration with ``NotImplementedError`` (the CUDA backend and varlen ``thd``, say) is
*unsupported* there: counted, never failed. :func:`call_backend` turns that answer into :class:`Unsupported`.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ropekit.layouts import TO_BSHD, to_bshd

__all__ = ["DTYPES", "DTYPE_NAMES", "TO_BSHD", "Unsupported", "available_backends", "to_bshd", "from_bshd",
           "layout_shape", "inverse_permutation", "tensor_summary", "call_backend"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class Unsupported(Exception):
    """A backend said NotImplementedError for this configuration (e.g. CUDA and varlen 'thd'): counted, not failed."""


def available_backends() -> tuple[list[str], str]:
    """The backends to test here: always "triton" (v4); "cuda" when ``ropekit.cuda.available()`` says it works."""
    try:
        from ropekit.cuda import available

        ok, why = available()
    except ImportError as error:
        ok, why = False, f"ropekit.cuda is not importable ({error})"
    return (["triton", "cuda"] if ok else ["triton"]), why


from_bshd = to_bshd  # the permutations are their own inverses (ropekit.layouts.TO_BSHD)


def layout_shape(layout: str, batch: int, seqlen: int, heads: int, head_dim: int, tokens: int = 0) -> tuple:
    if layout == "thd":
        return (tokens, heads, head_dim)
    sizes = {"b": batch, "s": seqlen, "h": heads, "d": head_dim}
    return tuple(sizes[axis] for axis in layout)


def inverse_permutation(perm: tuple) -> tuple:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


def tensor_summary(t: Optional[torch.Tensor]) -> str:
    return "None" if t is None else f"{tuple(t.shape)}/{tuple(t.stride())}"


def call_backend(fn: Callable):
    """``fn()``, with a backend's NotImplementedError raised as :class:`Unsupported`."""
    try:
        return fn()
    except NotImplementedError as error:
        raise Unsupported(str(error)) from None
