"""Where in the output something happened, in the reader's words, and stores addressed with the wrong strides.

* :class:`Names` turns an index of the checked output into the name the reader's kernel knows it by. Exercise 05
  writes q and k into two tensors (``out_q``, ``out_k``); the checker reads them back as one output whose heads are
  q's heads then k's, and :class:`Names` splits that index back: element ``[b, s, 5, d]`` of a 4-q-head case is
  ``out_k[b, s, 1, d]``, k's head 1.
* :func:`matching_strides` recognises a kernel that stored the right values at the addresses of another layout (x's
  strides, or a contiguous tensor's) instead of out's: every value is right, only the address is not, so the stores
  land in the gaps of the output's allocation like a loose mask's would.
* the words for where things happened, which the diagnosis (:mod:`ropekit.course.diagnose`) puts in its messages:
  :func:`describe_cells` (where a mask of elements is set), :func:`unwritten_hint` (what to look at for elements never
  written), :func:`describe_outside` (the elements each overwritten canary lies past), :func:`past_ks_heads` (stores
  past k's last head, exercise 05).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from .cases import RopeInputs

__all__ = ["Names", "ranges", "matching_strides", "whole_tokens_or_heads", "describe_cells", "unwritten_hint",
           "describe_outside", "past_ks_heads"]


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


# --- words for where things happened -------------------------------------------------------------------------------

def whole_tokens_or_heads(mask: torch.Tensor) -> tuple[str, torch.Tensor] | None:
    """("tokens", (batch, seq) mask) when a (batch, seq, heads, head_dim) mask is whole tokens (every head and channel
    of them), ("heads", (heads,) mask) when it is whole heads of every token, else None."""
    tokens = mask.any(dim=(2, 3))
    if torch.equal(mask, tokens[:, :, None, None].expand_as(mask)):
        return "tokens", tokens
    heads = mask.any(dim=(0, 1, 3))
    if torch.equal(mask, heads[None, None, :, None].expand_as(mask)):
        return "heads", heads
    return None


def describe_cells(mask: torch.Tensor, names: Names = Names()) -> str:
    """Where a (batch, seq, heads, head_dim) boolean mask is set, in words."""
    n, total = int(mask.sum()), mask.numel()
    channels = mask.any(dim=(0, 1, 2))
    rows = mask.any(dim=-1)
    if bool(rows.all()) and torch.equal(mask, channels.expand_as(mask)):
        return f"channels {ranges(torch.nonzero(channels).flatten())} of every head vector ({n} of {total} elements)"
    whole = whole_tokens_or_heads(mask)
    if whole is not None and whole[0] == "tokens":
        tokens = whole[1]
        per_seq = [f"sequence {b}: tokens {ranges(torch.nonzero(tokens[b]).flatten())}"
                   for b in range(mask.shape[0]) if bool(tokens[b].any())]
        return "all heads and channels of " + "; ".join(per_seq) + f" ({n} of {total} elements)"
    if whole is not None:
        return f"every element of {names.heads(torch.nonzero(whole[1]).flatten())} ({n} of {total} elements)"
    examples = ", ".join(names.element(i) for i in torch.nonzero(mask)[:3])
    return f"{n} of {total} elements, e.g. {examples}"


def unwritten_hint(mask: torch.Tensor, names: Names = Names()) -> str:
    """What to look at, from the shape of the unwritten (batch, seq, heads, head_dim) elements: whole heads point at
    the heads a program covers, whole tokens at the grid, a part of every row at a mask."""
    whole = whole_tokens_or_heads(mask)
    if whole is not None and whole[0] == "heads":
        return ("Whole heads were skipped: does every head get a program, or a turn of your head loop (its range "
                "and step), and does the head offset reach " + names.heads(torch.nonzero(whole[1]).flatten()) + "?")
    if whole is not None:
        return "Whole tokens were skipped: does the grid (or a loop over tokens) cover every token of every sequence?"
    return "Is a mask too tight (an off-by-one, or a bound smaller than the row/tile)?"


def describe_outside(inputs: RopeInputs, touched_storage: torch.Tensor, names: Names = Names()) -> str:
    """Name the output elements right before each overwritten canary."""
    out = inputs.out
    flat_offsets = out.offsets.reshape(-1)
    order = torch.argsort(flat_offsets)
    sorted_offsets = flat_offsets[order]
    anchors: dict[int, int] = {}
    before_start = 0
    for offset in touched_storage.tolist():
        position = int(torch.searchsorted(sorted_offsets, torch.tensor(offset))) - 1
        if position < 0:
            before_start += 1
            continue
        element = int(order[position])
        anchors[element] = anchors.get(element, 0) + 1
    shape = out.view.shape
    parts = []
    for element, count in list(anchors.items())[:3]:
        index = torch.unravel_index(torch.tensor(element), shape)
        parts.append(f"{count} just past {names.element(index)}")
    if len(anchors) > 3:
        parts.append(f"... ({len(anchors)} places in all)")
    if before_start:
        parts.append(f"{before_start} before out[0, 0, 0, 0]")
    return "; ".join(parts)


def past_ks_heads(inputs: RopeInputs, names: Names, touched_storage: torch.Tensor) -> list[int] | None:
    """k's heads (numbered as k numbers them) past its last one whose elements hold every overwritten canary, when
    the output holds q's heads then k's (exercise 05) and k has fewer heads than q; else None. Such stores come from
    k's head lanes masked with q's head count (or the block's width), not from an address that is off."""
    if names.split is None:
        return None
    view = inputs.out.view
    n_q = names.split
    n_k = view.shape[2] - n_q
    if not 0 < n_k < n_q:
        return None
    first = inputs.out.offsets[:, :, n_q:n_q + 1, :]  # where k's head 0 lies, for every token and channel
    head_of = {int(offset): head for head in range(n_k, n_q)
               for offset in (first + head * view.stride(2)).reshape(-1).tolist()}
    heads = [head_of.get(int(offset)) for offset in touched_storage.tolist()]
    if not heads or None in heads:
        return None
    return sorted(set(heads))
