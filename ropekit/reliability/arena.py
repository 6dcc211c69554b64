"""The fuzzer's memory: every tensor of a case a view into a larger buffer (guard elements before, after and between
its rows), and a bit-for-bit check, after the call, of everything outside what the call may write."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["VIEW_KINDS", "Arena", "footprint", "self_overlapping", "same_bits", "overlaps"]

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
    """A bool mask over ``base`` (1-D): the elements of ``base`` whose bytes ``view`` (a view into ``base``'s
    storage, of any dtype) covers."""
    mask = torch.zeros(base.numel(), dtype=torch.bool)
    if view.numel():
        size, unit = view.element_size(), base.element_size()
        first = view.storage_offset() * size - base.storage_offset() * unit  # in bytes from base's first element
        starts = torch.arange(_extent(view.shape, view.stride())).as_strided(view.shape, view.stride()).reshape(-1)
        covered = (starts[:, None] * size + first + torch.arange(size)).reshape(-1) // unit
        mask[covered] = True
    return mask


def _byte_span(view: torch.Tensor) -> tuple[int, int]:
    """The bytes from ``view``'s lowest to its highest element, ``[low, high)`` in its storage (strides >= 0)."""
    size = view.element_size()
    low = view.storage_offset() * size
    return low, low + _extent(view.shape, view.stride()) * size


def overlaps(arena: "Arena", written: dict, others: dict) -> tuple[list, list]:
    """The pairs ``(w, t)`` of a written tensor and any other tensor of the call (``others`` and the other written
    ones; None entries skipped) that share bytes, and those whose byte spans meet without sharing a byte while
    their strides or element sizes differ (the overlap rule refuses what it cannot prove apart: either outcome)."""
    shared, spans = [], []
    named = {**others, **written}
    for w, a in written.items():
        if a is None or not a.numel():
            continue
        for t, b in named.items():
            if t == w or b is None or not b.numel() or (t in written and (t, w) in shared + spans):
                continue
            if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
                continue
            base = arena.buffer_of(a).base
            if bool((footprint(a, base) & footprint(b, base)).any()):
                shared.append((w, t))
                continue
            (a_lo, a_hi), (b_lo, b_hi) = _byte_span(a), _byte_span(b)
            if a_lo < b_hi and b_lo < a_hi and (a.stride() != b.stride() or a.element_size() != b.element_size()):
                spans.append((w, t))
    return shared, spans


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
        self._share: dict | None = None  # see share()

    def share(self, first: str, second: str, apart: bool) -> None:
        """Place the tensors named ``first`` and ``second`` (whichever comes first) in one byte pool, as engines
        carve caches of several dtypes from one allocation: the second on bytes of the first (``apart``: just past
        its last byte). The read tensor's values win: a tensor placed with ``values`` keeps them."""
        self._share = {"names": (first, second), "apart": apart, "pool": None}

    def pooled(self) -> bool:
        """Whether both tensors named in :meth:`share` were placed in their pool."""
        return self._share is not None and self._share.get("done", False)

    def place(self, name: str, shape: tuple, dtype: torch.dtype, kind: str = "contiguous",
              values: Callable[[tuple], torch.Tensor] | None = None, device=None) -> torch.Tensor:
        """A ``kind`` view of ``shape`` inside a fresh buffer with guard elements around and between its rows
        (on the arena's device, or ``device``).

        ``values(core_shape)`` gives the values (CPU tensor) for the view's distinct elements; ``core_shape`` is
        ``shape`` with 1 where the view is expanded. Without it the view reads the buffer's random contents.
        """
        strides, _ = _strides(tuple(shape), kind, self.rng)
        extent = _extent(shape, strides)
        if self._share is not None and name in self._share["names"] and device in (None, self.device):
            return self._pool_place(tuple(shape), strides, extent, dtype, values)
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

    _POOL_ROOM = 1 << 12  # bytes past the first tensor of a pool (grown when the second needs more)

    def _pool_place(self, shape, strides, extent, dtype, values) -> torch.Tensor:
        share, size = self._share, torch.empty((), dtype=dtype).element_size()
        given = values is not None
        if not given and dtype.is_floating_point and size > 1:  # random bytes would hold NaN and Inf
            def values(s):
                return torch.rand(s, generator=self.gen, dtype=torch.float64).mul(4).sub(2)
        if share["pool"] is None:  # the first of the two: a fresh pool of random bytes
            start = 16 * self.rng.randint(1, 4)
            base = torch.randint(0, 256, (start + extent * size + self._POOL_ROOM,), generator=self.gen,
                                 dtype=torch.uint8).to(self.device)
            share["pool"] = _Buffer(f"pool({'+'.join(share['names'])})", base, base, torch.zeros(
                base.numel(), dtype=torch.bool))
            self.buffers.append(share["pool"])
        else:  # the second: on some of the first's bytes, or just past its last one
            first = share["first"]
            lo, hi = _byte_span(first)
            if share["apart"]:
                start = -(-hi // size) * size + size * self.rng.choice((0, 0, 1, 3))
            else:
                high = max(hi - size, lo)
                low = min(max(0, lo - extent * size + size), high)
                start = self.rng.randint(-(-low // size), high // size) * size
            need = start + extent * size - share["pool"].base.numel()
            if need > 0:  # grow the pool (its storage keeps the first tensor's bytes)
                buffer = share["pool"]
                old = buffer.base.numel()
                buffer.base.untyped_storage().resize_(old + need)
                buffer.base = _carve(buffer.base, 0, (old + need,), [1], torch.uint8)
                buffer.base[old:] = torch.randint(0, 256, (need,), generator=self.gen, dtype=torch.uint8).to(
                    buffer.base.device)
                buffer.writable = torch.cat((buffer.writable, torch.zeros(need, dtype=torch.bool)))
        base = share["pool"].base
        view = _carve(base, start, shape, strides, dtype)
        if share.get("first") is not None and not share["apart"] and view.numel() and first.numel() and not bool(
                (footprint(view, base) & footprint(first, base)).any()):
            view = _carve(base, lo - lo % size, shape, strides, dtype)  # the drawn start missed: on its first byte
        core = view.as_strided(tuple(1 if st == 0 else s for s, st in zip(shape, strides)), strides)
        if values is not None and view.numel():
            core.copy_(values(tuple(core.shape)).to(dtype))
        if share.get("first") is None:
            share["first"], share["first_values"] = view, (core, core.clone()) if given else None
        else:
            if share["first_values"] is not None and not given:  # a read tensor keeps its values
                share["first_values"][0].copy_(share["first_values"][1])
            share["done"] = True
        share["pool"].before = _bytes(base.cpu()).clone()
        return view

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


def _carve(pool: torch.Tensor, start: int, shape: tuple, strides: list, dtype: torch.dtype) -> torch.Tensor:
    """A ``dtype`` view of the byte pool from byte ``start`` (a multiple of the element size)."""
    size = torch.empty((), dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype, device=pool.device).set_(pool.untyped_storage(), start // size, shape, strides)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    dense = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    return dense.copy_(t.reshape(-1)).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads included) of two tensors of one shape and dtype, on any devices."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(_bytes(a.detach().cpu()), _bytes(b.detach().cpu()))
