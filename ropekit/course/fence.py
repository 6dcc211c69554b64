"""Keep the reader's kernel inside the tensors it was given, while the Triton interpreter runs it.

On a GPU, a store past an output's end lands in the guard the checker put around the output, or faults with an
illegal address; either way the checker reports it. Under the interpreter every lane of ``tl.store`` writes straight
into this Python process's memory: a store far past the guard corrupts the allocator, and the process dies (in a
notebook: "the kernel died", with every variable lost). :func:`fenced` checks each masked load and store against the
storages of the launch's tensor arguments before the interpreter executes it, and raises :class:`OutsideTensors`
instead, which :func:`finding` turns into the checker's diagnosis.

It hooks what :mod:`ropekit.course.touch` hooks (the interpreter builder's ``create_masked_load`` /
``create_masked_store``) plus the step where the interpreter takes a launch's arguments (``GridExecutor.
_init_args_hst``, Triton 3.6 to 3.9). With another Triton, or with the interpreter off, it does nothing.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import device as _device
from .diagnose import Finding

__all__ = ["OutsideTensors", "fenced", "stopped", "finding"]


class OutsideTensors(RuntimeError):
    """A load or store whose address lies in no tensor the launch was given (stopped before it ran)."""

    def __init__(self, kind: str, lanes: int, where: str):
        self.kind, self.lanes, self.where = kind, lanes, where
        super().__init__(f"{lanes} {kind} lane(s) outside every tensor of the launch; the first {where}")


class _Spans:
    """The byte ranges of the current launch's tensor arguments: (name, start, stop, element size)."""

    def __init__(self):
        self.spans: list[tuple[str, int, int, int]] = []

    def take(self, names, args_hst, kwargs_hst) -> None:
        pairs = list(zip(names, args_hst)) + list(kwargs_hst.items())
        self.spans = [(name, arg.untyped_storage().data_ptr(),
                       arg.untyped_storage().data_ptr() + arg.untyped_storage().nbytes(), arg.element_size())
                      for name, arg in pairs if hasattr(arg, "untyped_storage")]

    def check(self, kind: str, ptrs, mask) -> None:
        if not self.spans:
            return
        addresses = np.asarray(ptrs.data).astype(np.uint64)
        lanes = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        active = addresses[lanes].reshape(-1)
        inside = np.zeros(active.size, dtype=bool)
        for _, start, stop, _ in self.spans:
            inside |= (active >= np.uint64(start)) & (active < np.uint64(stop))
        if inside.all():
            return
        raise OutsideTensors(kind, int((~inside).sum()), self._nearest(int(active[~inside][0])))

    def _nearest(self, address: int) -> str:
        def distance(span):
            _, start, stop, _ = span
            return start - address if address < start else address - stop + 1
        name, start, stop, item = min(self.spans, key=distance)
        if address < start:
            return f"{(start - address + item - 1) // item} element(s) before the nearest tensor, {name}"
        return f"{(address - stop) // item + 1} element(s) past the end of the nearest tensor, {name}"


@contextlib.contextmanager
def fenced():
    """Inside the ``with`` block, interpreted loads and stores outside the launch's tensors raise
    :class:`OutsideTensors` before they touch memory. Does nothing when the interpreter is off."""
    if not _device.INTERPRET:
        yield
        return
    try:
        from triton.runtime import interpreter
        builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
        originals = (builder.create_masked_load, builder.create_masked_store, executor._init_args_hst)
    except (ImportError, AttributeError):
        yield
        return
    spans = _Spans()
    saved = {name: builder.__dict__.get(name) for name in ("create_masked_load", "create_masked_store")}
    load, store, init_args = originals

    def masked_load(ptrs, mask, *rest, **kwargs):
        spans.check("load", ptrs, mask)
        return load(ptrs, mask, *rest, **kwargs)

    def masked_store(ptrs, value, mask, *rest, **kwargs):
        spans.check("store", ptrs, mask)
        return store(ptrs, value, mask, *rest, **kwargs)

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        spans.take(self.arg_names, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    executor._init_args_hst = init_args_hst
    try:
        yield
    finally:
        executor._init_args_hst = init_args
        for name, value in saved.items():
            if value is None:
                builder.__dict__.pop(name, None)
            else:
                setattr(builder, name, value)


def stopped(error: BaseException | None) -> OutsideTensors | None:
    """The :class:`OutsideTensors` that :func:`fenced` raised behind ``error`` (the interpreter wraps it), else None."""
    while error is not None and not isinstance(error, OutsideTensors):
        error = error.__cause__ or error.__context__
    return error


def finding(error: BaseException) -> Finding | None:
    """The checker's finding for an error that :func:`fenced` raised (the interpreter wraps it), else None."""
    error = stopped(error)
    if error is None:
        return None
    if error.kind == "store":
        return Finding("out_of_bounds", (
            f"{error.lanes} store lane(s) pointed outside every tensor the kernel was given (the first "
            f"{error.where}). The checker stopped the store before it ran: under the interpreter it would have "
            "overwritten this process's memory, and on a GPU it corrupts memory or faults with an illegal address. "
            "Check the address arithmetic, not only the mask: a row of a contiguous (rows, n) tensor starts at "
            "row * n, and a stride multiplies the index of its own axis only."))
    return Finding("load_out_of_bounds", (
        f"{error.lanes} load lane(s) pointed outside every tensor the kernel was given (the first {error.where}). "
        "The checker stopped the load before it ran (on a GPU: garbage or an illegal-address fault). Check the "
        "address arithmetic (the row start and the strides) and give every load the mask of the lanes that exist."))
