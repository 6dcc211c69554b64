"""Inputs and outputs laid out so that a kernel's mistakes show up in memory.

* Every output element is **poisoned** before the run (``POISON``): one still holding it afterwards was never written.
* The memory around and between the output's elements is filled with **canaries** (``CANARY``): one that changed was
  written out of bounds.
* Inputs sit inside a larger allocation too, with random values in the gaps, so that a kernel reading past a row or
  ignoring a stride reads *something* (deterministic, and never outside the allocation) instead of crashing.

A :class:`Layout` says how a tensor's elements are placed: the memory order of its dimensions, a gap after each
dimension's block, and the step between neighbouring elements of the last dimension (>1 makes a non-contiguous
channel axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["POISON", "CANARY", "Layout", "CONTIGUOUS", "GuardedTensor", "guarded"]

POISON = -8192.0  # exactly representable in fp16/bf16/fp32; a rotation of randn data never produces it
CANARY = 4096.0


@dataclass(frozen=True)
class Layout:
    order: tuple[int, ...] | None = None  # dims from outermost to innermost in memory; the last dim must be innermost
    gaps: tuple[int, ...] | None = None  # extra elements after the block of each dim (indexed by dim)
    last_stride: int = 1  # step between neighbouring elements of the last dim
    label: str = "contiguous"


CONTIGUOUS = Layout()


@dataclass
class GuardedTensor:
    """A view into a larger 1-D allocation; ``in_view`` marks the allocation's elements that belong to the view."""

    view: torch.Tensor
    storage: torch.Tensor
    in_view: torch.Tensor  # bool, CPU, shape (storage.numel(),)
    offsets: torch.Tensor  # int64, CPU, shape view.shape: storage offset of every view element

    def outside(self) -> torch.Tensor:
        """The allocation's elements that are not part of the view (CPU copy)."""
        return self.storage.detach().cpu()[~self.in_view]


def _strides(shape: tuple[int, ...], layout: Layout) -> tuple[tuple[int, ...], int]:
    ndim = len(shape)
    order = tuple(range(ndim)) if layout.order is None else layout.order
    gaps = (0,) * ndim if layout.gaps is None else layout.gaps
    if sorted(order) != list(range(ndim)) or order[-1] != ndim - 1 or len(gaps) != ndim:
        raise ValueError(f"bad layout {layout} for shape {shape}")
    strides = [0] * ndim
    strides[ndim - 1] = layout.last_stride
    span = layout.last_stride * shape[ndim - 1] + gaps[ndim - 1]
    for dim in reversed(order[:-1]):
        strides[dim] = span
        span = span * shape[dim] + gaps[dim]
    return tuple(strides), span


def guarded(shape, layout: Layout = CONTIGUOUS, *, dtype: torch.dtype, device, guard: int,
            fill_view: float | torch.Tensor, fill_rest: float | torch.Tensor) -> GuardedTensor:
    """Allocate ``guard`` elements, the view's span, ``guard`` elements; fill the view and the rest.

    ``fill_view``: a number or a tensor of ``shape``; ``fill_rest``: a number or a 1-D tensor of at least the
    allocation's length (random gap values).
    """
    shape = tuple(int(s) for s in shape)
    strides, span = _strides(shape, layout)
    total = guard + span + guard
    storage = torch.empty(total, dtype=dtype)
    if isinstance(fill_rest, torch.Tensor):
        storage.copy_(fill_rest[:total].to(dtype))
    else:
        storage.fill_(fill_rest)
    view = storage.as_strided(shape, strides, guard)
    if isinstance(fill_view, torch.Tensor):
        view.copy_(fill_view.to(dtype))
    else:
        view.fill_(fill_view)
    offsets = torch.full(shape, guard, dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(shape, strides)):
        index_shape = [1] * len(shape)
        index_shape[dim] = size
        offsets = offsets + (torch.arange(size) * stride).reshape(index_shape)
    in_view = torch.zeros(total, dtype=torch.bool)
    in_view[offsets.reshape(-1)] = True
    storage = storage.to(device)
    view = storage.as_strided(shape, strides, guard)
    return GuardedTensor(view, storage, in_view, offsets)
