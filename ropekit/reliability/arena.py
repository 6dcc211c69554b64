"""The fuzzer's memory: every tensor of a case a view into a larger buffer (guard elements before, after and between
its rows), and a bit-for-bit check, after the call, of everything outside what the call may write."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["VIEW_KINDS", "Arena", "footprint", "self_overlapping", "same_bits"]

_GUARD_NAN_PROBABILITY = 0.5

VIEW_KINDS = ("contiguous", "padded", "stepped", "permuted", "expanded", "overlapping")


def _strides(shape: tuple, kind: str, rng: random.Random) -> tuple[list, bool]:
    """Element strides of a ``kind`` view of ``shape`` (and whether a dimension was expanded to stride 0)."""
    n = len(shape)
    order = list(range(n))[::-1]  # innermost first
    if kind == "permuted":
        rng.shuffle(order)
    strides, acc = [0] * n, (rng.choice((2, 3)) if kind == "stepped" else 1)
    for d in order:
        strides[d] = acc
        acc = acc * max(shape[d], 1) + (rng.randint(1, 3) if kind == "padded" else 0)
    expanded = False
    if kind == "expanded":
        wide = [d for d in range(n) if shape[d] > 1]
        for d in rng.sample(wide, k=min(len(wide), rng.randint(1, 2))):
            strides[d], expanded = 0, True
    elif kind == "overlapping":
        # a dimension whose stride is shorter than the span of the dimensions inside it: its rows share elements
        candidates = [d for d in range(n) if shape[d] > 1 and strides[d] > 1]
        if candidates:
            d = rng.choice(candidates)
            strides[d] = rng.randint(1, strides[d] - 1)
    return strides, expanded


def _extent(shape, strides) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))


def footprint(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """A bool mask over ``base`` (1-D): the elements ``view`` (a view into ``base``'s storage) covers."""
    mask = torch.zeros(base.numel(), dtype=torch.bool)
    if view.numel():
        offset = view.storage_offset() - base.storage_offset()
        mask[torch.arange(base.numel()).as_strided(view.shape, view.stride(), offset).reshape(-1)] = True
    return mask


def self_overlapping(view: torch.Tensor) -> bool:
    """Whether two indices of ``view`` name the same element (a write through it would race)."""
    if view.numel() < 2:
        return False
    index = torch.arange(_extent(view.shape, view.stride())).as_strided(view.shape, view.stride())
    return index.unique().numel() < view.numel()


def _random_fill(base: torch.Tensor, gen: torch.Generator) -> None:
    if base.is_floating_point():
        base.copy_(torch.rand(base.shape, generator=gen, dtype=torch.float64).mul(4).sub(2).to(base.dtype))
    else:
        base.copy_(torch.randint(-9, 1 << 20, base.shape, generator=gen).to(base.dtype))


@dataclass
class _Buffer:
    name: str
    base: torch.Tensor  # 1-D, on the device
    before: torch.Tensor  # its bytes before the call, on the CPU
    writable: torch.Tensor  # bool mask: elements the call may write (an in-place target's own elements)


class Arena:
    """Allocates every tensor of a case as a view into a larger buffer and checks, after the call, that nothing
    outside what the call may write has changed, bit for bit."""

    def __init__(self, rng: random.Random, gen: torch.Generator, device):
        self.rng, self.gen, self.device = rng, gen, device
        self.buffers: list[_Buffer] = []

    def place(self, name: str, shape: tuple, dtype: torch.dtype, kind: str = "contiguous",
              values: Callable[[tuple], torch.Tensor] | None = None, device=None) -> torch.Tensor:
        """A ``kind`` view of ``shape`` inside a fresh buffer with guard elements around and between its rows
        (on the arena's device, or ``device``).

        ``values(core_shape)`` gives the values (CPU tensor) for the view's distinct elements; ``core_shape`` is
        ``shape`` with 1 where the view is expanded. Without it the view reads the buffer's random contents.
        """
        strides, _ = _strides(tuple(shape), kind, self.rng)
        extent = _extent(shape, strides)
        row = max(shape[-1] if shape else 1, 1)
        pre, post = self.rng.randint(1, 2 * row), self.rng.randint(1, 4 * row)
        base_cpu = torch.empty(pre + extent + post, dtype=dtype)
        _random_fill(base_cpu, self.gen)
        view_cpu = base_cpu.as_strided(shape, strides, pre)
        if base_cpu.is_floating_point() and self.rng.random() < _GUARD_NAN_PROBABILITY:
            guard = ~footprint(view_cpu, base_cpu)
            base_cpu[guard] = float("nan")  # a read outside the view poisons the result
        if values is not None and view_cpu.numel():
            core_shape = tuple(1 if st == 0 else s for s, st in zip(shape, strides))
            base_cpu.as_strided(core_shape, strides, pre).copy_(values(core_shape).to(dtype))
        base = base_cpu.to(self.device if device is None else device)
        self.buffers.append(_Buffer(name, base, _bytes(base_cpu).clone(), torch.zeros(base.numel(), dtype=torch.bool)))
        return base.as_strided(shape, strides, pre)

    def buffer_of(self, view: torch.Tensor) -> _Buffer:
        for buffer in self.buffers:
            if buffer.base.untyped_storage().data_ptr() == view.untyped_storage().data_ptr():
                return buffer
        raise KeyError("not a view of this arena")

    def allow_writes(self, view: torch.Tensor) -> None:
        buffer = self.buffer_of(view)
        buffer.writable |= footprint(view, buffer.base)

    def changed(self, *, allow: bool) -> list[str]:
        """Buffers with an element changed (outside the writable elements when ``allow``): ``name: count``."""
        report = []
        for buffer in self.buffers:
            now = _bytes(buffer.base.cpu())
            diff = (now != buffer.before).reshape(buffer.base.numel(), -1).any(dim=1)
            if allow:
                diff &= ~buffer.writable
            if diff.any():
                first = int(torch.nonzero(diff)[0])
                report.append(f"{buffer.name}: {int(diff.sum())} elements changed (first at element {first} of its "
                              f"buffer)")
        return report


def _bytes(t: torch.Tensor) -> torch.Tensor:
    dense = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    return dense.copy_(t.reshape(-1)).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads included) of two tensors of one shape and dtype, on any devices."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(_bytes(a.detach().cpu()), _bytes(b.detach().cpu()))
