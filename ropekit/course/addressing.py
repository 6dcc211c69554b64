"""Where in the output something happened, in the reader's words, and stores addressed with the wrong strides.

* :class:`Names` turns an index of the checked output into the name the reader's kernel knows it by. Exercise 05
  writes q and k into two tensors (``out_q``, ``out_k``); the checker reads them back as one output whose heads are
  q's heads then k's, and :class:`Names` splits that index back: element ``[b, s, 5, d]`` of a 4-q-head case is
  ``out_k[b, s, 1, d]``, k's head 1.
* :func:`matching_strides` recognises a kernel that stored the right values at the addresses of another layout (x's
  strides, or a contiguous tensor's) instead of out's: every value is right, only the address is not, so the stores
  land in the gaps of the output's allocation like a loose mask's would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Names", "ranges", "matching_strides"]


def ranges(values) -> str:
    """[0, 1, 2, 3, 7, 9, 10] -> '0-3, 7, 9-10'"""
    values = sorted(int(v) for v in values)
    parts, start, prev = [], None, None
    for v in values + [None]:
        if start is None:
            start = prev = v
        elif v is not None and v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    return ", ".join(parts)


@dataclass(frozen=True)
class Names:
    """How the reader's kernel names the checked output's elements and heads."""

    split: int | None = None  # q's head count when the output holds q's heads then k's (exercise 05)

    def _tensor_head(self, head: int) -> tuple[str, int]:
        if self.split is None:
            return "out", head
        return ("out_q", head) if head < self.split else ("out_k", head - self.split)

    def element(self, index) -> str:
        b, s, h, d = (int(i) for i in index)
        name, h = self._tensor_head(h)
        return f"{name}[{b}, {s}, {h}, {d}]"

    def head(self, head: int) -> str:
        """'head 3', or for q and k: "q's head 1" / "k's head 0"."""
        name, h = self._tensor_head(int(head))
        return f"head {h}" if name == "out" else f"{name[-1]}'s head {h}"

    def heads(self, heads) -> str:
        """'heads 0-2', or for q and k: "k's heads 0-1 in out_k"."""
        heads = sorted(int(h) for h in heads)
        if self.split is None:
            return f"heads {ranges(heads)}"
        q = [h for h in heads if h < self.split]
        k = [h - self.split for h in heads if h >= self.split]
        parts = ([f"q's heads {ranges(q)} in out_q"] if q else []) + ([f"k's heads {ranges(k)} in out_k"] if k else [])
        return " and ".join(parts)


def _contiguous(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def matching_strides(inputs, expected: torch.Tensor, ok: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """Words for the layout whose addresses hold the right output, when it is not out's own (else None).

    ``inputs``: the case's RopeInputs; ``expected``: the float64 reference; ``ok(values)``: elementwise, is each
    value within the accuracy bound of ``expected``. The candidates are the strides a kernel most often borrows by
    mistake: x's, and those of a contiguous tensor of out's shape (an address computed as ``row * HEAD_DIM``).
    """
    out = inputs.out
    view = out.view
    shape, actual = tuple(view.shape), tuple(view.stride())
    storage = out.storage.detach().cpu().to(torch.float64)
    base = view.storage_offset()
    candidates = (("x's strides", tuple(inputs.x.view.stride())),
                  ("the strides of a contiguous tensor (an address such as row * HEAD_DIM)", _contiguous(shape)))
    for words, strides in candidates:
        if strides == actual:
            continue
        offsets = torch.full(shape, base, dtype=torch.int64)
        for dim, (size, stride) in enumerate(zip(shape, strides)):
            index_shape = [1] * len(shape)
            index_shape[dim] = size
            offsets = offsets + (torch.arange(size) * stride).reshape(index_shape)
        if int(offsets.min()) < 0 or int(offsets.max()) >= storage.numel():
            continue
        if bool(ok(storage[offsets]).all()):
            return (f"your stores put every right value where a tensor with {words}, {strides}, keeps it, but out's "
                    f"strides are {actual}")
    return None
