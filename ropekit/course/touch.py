"""Pictures of what each Triton program touches, recorded from a real run under the Triton interpreter.

    touches = touch.record(ropekit.triton.v1.rope_v1, x, cos, sin, out=out)
    touch.plot(touches, "out", kind="store")  # the tensor as a grid coloured by program + one program's addresses

How: the interpreter runs a launch's programs one after the other in Python, every ``tl.load`` / ``tl.store`` through
``triton.runtime.interpreter.interpreter_builder``'s ``create_masked_load(ptrs, mask, ...)`` and
``create_masked_store(ptrs, value, mask, ...)`` (the same first arguments in Triton 3.6 to 3.9). :func:`record` wraps
those two for the launch, notes the byte addresses each program accessed (masked-off lanes excluded) and maps them
back to elements of the tensors passed in. The interpreter must be on when the kernel module is imported: ropekit
turns it on without a GPU; on a GPU machine :func:`record` runs the launch in a subprocess with
``TRITON_INTERPRET=1``, so the launch function must be importable there (module-level, e.g. ``v1.rope_v1``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import device as _device

__all__ = ["TouchRecordingUnavailable", "Access", "Touches", "record", "recording", "plot", "draw_grid",
           "draw_program", "draw_memory"]


class TouchRecordingUnavailable(RuntimeError):
    """The installed Triton's interpreter does not have the hooks :func:`record` needs."""


@dataclass
class Access:
    """One ``tl.load`` or ``tl.store`` executed by one program, restricted to one tensor."""

    launch: int  # 0 for the first kernel launch inside the recorded call, 1 for the next, ...
    program: tuple[int, int, int]  # program_id along axes 0, 1, 2
    kind: str  # "load" or "store"
    tensor: str
    offsets: np.ndarray  # element offsets into the tensor's storage, in lane order (masked-off lanes excluded)
    elements: np.ndarray  # flat index of each into the tensor (its view); -1 when outside the view


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_elements: int
    dtype: str


@dataclass
class Touches:
    """Everything one recorded call loaded and stored, per program and per tensor."""

    tensors: dict[str, TensorInfo]
    accesses: list[Access]
    grids: list[tuple[int, int, int]]  # the grid of each launch
    unattributed: dict[str, int] = field(default_factory=dict)  # lanes that hit none of the given tensors, by kind

    def programs(self, launch: int | None = None) -> list[tuple[int, int, int]]:
        """Program ids in the order they ran (of one launch, or of all)."""
        seen: dict[tuple[int, int, int], None] = {}
        for access in self.accesses:
            if launch is None or access.launch == launch:
                seen.setdefault(access.program, None)
        return list(seen)

    def select(self, tensor: str, kind: str | None = None, program=None, launch: int | None = None) -> list[Access]:
        return [a for a in self.accesses if a.tensor == tensor and (kind is None or a.kind == kind)
                and (program is None or a.program == tuple(program)) and (launch is None or a.launch == launch)]

    def count(self, tensor: str, kind: str = "load") -> np.ndarray:
        """How many times each element of ``tensor`` was accessed (array of the tensor's shape)."""
        info = self.tensors[tensor]
        counts = np.zeros(int(np.prod(info.shape)), dtype=np.int64)
        for access in self.select(tensor, kind):
            inside = access.elements[access.elements >= 0]
            np.add.at(counts, inside, 1)
        return counts.reshape(info.shape)

    def owner(self, tensor: str, kind: str = "store") -> np.ndarray:
        """For each element of ``tensor``, the position in :meth:`programs` of the first program that accessed it
        (-1: never). With several launches, programs of later launches come after those of earlier ones."""
        info = self.tensors[tensor]
        order = {(a.launch, a.program): None for a in self.accesses}
        rank = {key: i for i, key in enumerate(order)}
        owners = np.full(int(np.prod(info.shape)), -1, dtype=np.int64)
        for access in self.select(tensor, kind):
            inside = access.elements[access.elements >= 0]
            fresh = inside[owners[inside] < 0]
            owners[fresh] = rank[(access.launch, access.program)]
        return owners.reshape(info.shape)

    def outside_view(self, tensor: str, kind: str = "store") -> int:
        """Lanes that touched the tensor's allocation but no element of its view."""
        return int(sum(int((a.elements < 0).sum()) for a in self.select(tensor, kind)))

    def reuse(self, tensor: str, kind: str = "load") -> float:
        """The largest number of times one program accessed the same element, on average over its elements."""
        worst = 0.0
        for program in self.programs():
            accesses = self.select(tensor, kind, program)
            if accesses:
                lanes = np.concatenate([a.offsets for a in accesses])
                worst = max(worst, lanes.size / max(np.unique(lanes).size, 1))
        return worst

    def summary(self) -> str:
        lines = [f"{len(self.grids)} launch(es), grid {self.grids}; {len(self.programs())} programs"]
        for name, info in self.tensors.items():
            for kind in ("load", "store"):
                accesses = self.select(name, kind)
                if not accesses:
                    continue
                counts = self.count(name, kind)
                lanes = sum(a.offsets.size for a in accesses)
                lines.append(f"  {name} {tuple(info.shape)}: {kind} {lanes} elements in {len(accesses)} ops; "
                             f"{int((counts > 0).sum())} of {counts.size} distinct, at most {int(counts.max())}x each")
        for kind, n in self.unattributed.items():
            lines.append(f"  ({n} {kind} lanes hit memory of no tensor given to record())")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Touches({self.summary()})"


# --- the hook ------------------------------------------------------------------------------------------------------

_HOOKED = ("create_masked_load", "create_masked_store", "set_grid_dim")


class _Recorder:
    def __init__(self, builder):
        self.builder = builder
        self.raw: list[tuple[int, tuple[int, int, int], str, np.ndarray]] = []
        self.grids: list[tuple[int, int, int]] = []

    def note(self, kind, ptrs, mask):
        addresses = np.asarray(ptrs.data)
        lanes = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        program = tuple(int(i) for i in self.builder.grid_idx)
        self.raw.append((len(self.grids) - 1, program, kind, addresses[lanes].astype(np.uint64).reshape(-1)))


@contextlib.contextmanager
def recording():
    """Record every masked load/store the Triton interpreter executes inside the ``with`` block (raw addresses)."""
    if not _device.INTERPRET:
        raise TouchRecordingUnavailable(
            "the Triton interpreter is off in this process (a GPU is present); use touch.record(), which runs the "
            "launch in a subprocess with TRITON_INTERPRET=1")
    try:
        from triton.runtime import interpreter
        builder = interpreter.interpreter_builder
        originals = {name: getattr(builder, name) for name in _HOOKED}
        saved = {name: builder.__dict__.get(name) for name in _HOOKED}
    except (ImportError, AttributeError) as error:
        version = getattr(sys.modules.get("triton"), "__version__", "?")
        raise TouchRecordingUnavailable(
            f"this Triton ({version}) has no triton.runtime.interpreter.interpreter_builder with "
            f"create_masked_load/create_masked_store/set_grid_dim ({error}); touch pictures need Triton 3.6-3.9"
        ) from error
    recorder = _Recorder(builder)

    def masked_load(ptrs, mask, *rest, **kwargs):
        recorder.note("load", ptrs, mask)
        return originals["create_masked_load"](ptrs, mask, *rest, **kwargs)

    def masked_store(ptrs, value, mask, *rest, **kwargs):
        recorder.note("store", ptrs, mask)
        return originals["create_masked_store"](ptrs, value, mask, *rest, **kwargs)

    def set_grid_dim(*dims):
        recorder.grids.append(tuple(int(d) for d in dims))
        return originals["set_grid_dim"](*dims)

    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store
    builder.set_grid_dim = set_grid_dim
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is not None:
        interpreter._patch_lang_tensor = _index_compatible(patch_tensor)
    try:
        yield recorder
    finally:
        for name in _HOOKED:
            if saved[name] is None:
                builder.__dict__.pop(name, None)
            else:
                setattr(builder, name, saved[name])
        if patch_tensor is not None:
            interpreter._patch_lang_tensor = patch_tensor


def _index_compatible(patch_tensor):
    """Triton 3.6's interpreter turns a scalar tensor into a Python int with ``int(data)`` on a shape-(1,) array,
    which NumPy >= 2.4 refuses (so ``range(pid * BLOCK, ...)`` fails in kernels such as v3/v4); Triton 3.9 uses
    ``int(data.squeeze())``. Give 3.6 the same, for the duration of a recording."""
    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    return patched


def _attribute(recorder: _Recorder, tensors: dict[str, torch.Tensor]) -> Touches:
    """Map raw byte addresses to (tensor, storage offset, element of the view)."""
    infos, spans, lookups = {}, [], {}
    for name, t in tensors.items():
        storage = t.untyped_storage()
        item = t.element_size()
        infos[name] = TensorInfo(tuple(t.shape), tuple(t.stride()), t.storage_offset(), storage.nbytes() // item,
                                 str(t.dtype).replace("torch.", ""))
        spans.append((name, storage.data_ptr(), storage.data_ptr() + storage.nbytes(), item))
        offsets = torch.as_strided(torch.arange(storage.nbytes() // item, dtype=torch.int64), t.shape, t.stride(),
                                   t.storage_offset()).reshape(-1).numpy() if t.numel() else np.zeros(0, np.int64)
        order = np.argsort(offsets, kind="stable")
        lookups[name] = (offsets[order], order)
    accesses, unattributed = [], {}
    for launch, program, kind, addresses in recorder.raw:
        claimed = np.zeros(addresses.size, dtype=bool)
        for name, start, stop, item in spans:
            hit = (addresses >= start) & (addresses < stop) & ~claimed
            if not hit.any():
                continue
            claimed |= hit
            offsets = ((addresses[hit] - np.uint64(start)) // np.uint64(item)).astype(np.int64)
            sorted_offsets, order = lookups[name]
            where = np.searchsorted(sorted_offsets, offsets)
            where_clipped = np.minimum(where, max(sorted_offsets.size - 1, 0))
            found = (where < sorted_offsets.size) & (sorted_offsets[where_clipped] == offsets) if sorted_offsets.size \
                else np.zeros(offsets.size, dtype=bool)
            elements = np.where(found, order[where_clipped] if sorted_offsets.size else -1, -1)
            accesses.append(Access(launch, program, kind, name, offsets, elements.astype(np.int64)))
        if not claimed.all():
            unattributed[kind] = unattributed.get(kind, 0) + int((~claimed).sum())
    return Touches(infos, accesses, list(recorder.grids), unattributed)


def _tensor_names(launch, args, kwargs, names) -> dict[str, torch.Tensor]:
    try:
        bound = inspect.signature(launch).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
    tensors = {name: value for name, value in bound.items() if isinstance(value, torch.Tensor)}
    if names is not None:
        positional = [a for a in args if isinstance(a, torch.Tensor)]
        tensors = {**dict(zip(names, positional)), **{k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}}
    return tensors


def _record_here(launch, args, kwargs, names) -> Touches:
    tensors = _tensor_names(launch, args, kwargs, names)
    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise ValueError(f"record() runs the launch under the Triton interpreter: {name} must be a CPU tensor")
    with recording() as recorder:
        launch(*args, **kwargs)
    return _attribute(recorder, tensors)


def record(launch, *args, names: list[str] | None = None, **kwargs) -> Touches:
    """Call ``launch(*args, **kwargs)`` under the Triton interpreter and record, for every program, which elements of
    each tensor argument it loaded and stored.

    Tensors are named after the launch function's parameters (``names=`` overrides the positional ones). Memory the
    launch allocates itself (an ``out`` it creates) is not attributed: pass ``out=`` to see the stores. On a GPU
    machine the launch runs on CPU copies in a subprocess: the tensors passed in are left unchanged.
    """
    if _device.INTERPRET:
        return _record_here(launch, args, kwargs, names)
    return _record_in_subprocess(launch, args, kwargs, names)


def _record_in_subprocess(launch, args, kwargs, names) -> Touches:
    if getattr(launch, "__module__", None) in (None, "__main__") or "<locals>" in getattr(launch, "__qualname__", ""):
        raise ValueError(
            "On a GPU machine record() runs the launch in a subprocess under the Triton interpreter, so the launch "
            f"function must be importable by name; {getattr(launch, '__qualname__', launch)!r} is defined in "
            "__main__ (a notebook) or inside a function. Pass a module-level function such as "
            "ropekit.triton.v1.rope_v1.")
    try:
        pickle.dumps(launch)
    except Exception as error:  # noqa: BLE001  (any pickling failure means the same thing here)
        raise ValueError(f"record(): the launch function cannot be sent to a subprocess ({error})") from error
    with tempfile.TemporaryDirectory(prefix="ropekit-touch-") as folder:
        request, answer = os.path.join(folder, "request.pt"), os.path.join(folder, "answer.pkl")
        torch.save({"launch": launch, "args": args, "kwargs": kwargs, "names": names}, request)
        env = dict(os.environ, TRITON_INTERPRET="1")
        done = subprocess.run([sys.executable, "-m", "ropekit.course.touch", request, answer], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"the recording subprocess failed:\n{done.stderr[-4000:]}")
        with open(answer, "rb") as f:
            return pickle.load(f)


def _main(argv: list[str]) -> int:
    """Subprocess side of :func:`record` (run with TRITON_INTERPRET=1)."""
    request, answer = argv
    payload = torch.load(request, map_location="cpu", weights_only=False)
    touches = _record_here(payload["launch"], tuple(payload["args"]), payload["kwargs"], payload["names"])
    with open(answer, "wb") as f:
        pickle.dump(touches, f)
    return 0


# --- pictures ------------------------------------------------------------------------------------------------------

def _as_grid(values: np.ndarray) -> np.ndarray:
    """A tensor of any rank as rows x last dim."""
    return values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values.reshape(1, -1)


def _row_labels(shape: tuple[int, ...]) -> list[str]:
    if len(shape) <= 1:
        return [""]
    return [str(tuple(int(i) for i in np.unravel_index(r, shape[:-1]))) for r in range(int(np.prod(shape[:-1])))]


def draw_grid(ax, touches: Touches, tensor: str, kind: str = "store", color: str = "program",
              annotate: bool | None = None):
    """The tensor as a grid (rows = all leading indices, columns = the last dim), coloured by the first program that
    accessed each element (``color="program"``) or by how many times it was accessed (``color="count"``)."""
    import matplotlib
    from matplotlib.colors import BoundaryNorm, ListedColormap

    info = touches.tensors[tensor]
    if color == "count":
        values = _as_grid(touches.count(tensor, kind)).astype(float)
        most = max(int(values.max()), 1)
        shown = np.ma.masked_where(values == 0, values)
        image = ax.imshow(shown, cmap="Blues", vmin=0, vmax=most, aspect="auto", interpolation="nearest")
        ax.figure.colorbar(image, ax=ax, label=f"{kind}s per element", ticks=range(0, most + 1))
        labels = values.astype(int)
    else:
        owners = _as_grid(touches.owner(tensor, kind))
        n = max(int(owners.max()) + 1, 1)
        palette = matplotlib.colormaps["tab20" if n > 10 else "tab10"]
        cmap = ListedColormap([palette(i % palette.N) for i in range(n)])
        shown = np.ma.masked_where(owners < 0, owners)
        ax.imshow(shown, cmap=cmap, norm=BoundaryNorm(np.arange(-0.5, n + 0.5), n), aspect="auto",
                  interpolation="nearest")
        labels = owners
    rows, cols = labels.shape
    if annotate is None:
        annotate = rows * cols <= 600
    if annotate:
        for r in range(rows):
            for c in range(cols):
                if labels[r, c] >= 0 and (color != "count" or labels[r, c] > 0):
                    dark = color == "count" and labels[r, c] > 0.6 * labels.max()
                    ax.text(c, r, str(labels[r, c]), ha="center", va="center", fontsize=9 if rows * cols <= 96 else 6,
                            color="white" if dark else "black")
    ax.set_facecolor("white")
    ax.set_xlabel(f"last dim of {tensor}")
    ax.set_xticks(range(cols))
    ax.set_ylabel("leading indices")
    ax.set_yticks(range(rows))
    ax.set_yticklabels(_row_labels(info.shape), fontsize=8 if rows <= 24 else 6)
    past = {"load": "loaded", "store": "stored"}[kind]
    what = f"times each element was {past}" if color == "count" else f"first program that {past} each element"
    ax.set_title(f"{tensor} {tuple(info.shape)}: {what}", fontsize=9)
    return ax


def _memory_geometry(info: TensorInfo, lanes: np.ndarray, width: int | None):
    """The view's element offsets, and the first offset / row count / width of the memory strip to draw."""
    view = torch.as_strided(torch.arange(info.storage_elements), info.shape, info.stride, info.storage_offset) \
        if np.prod(info.shape) else torch.zeros(0, dtype=torch.int64)
    view_offsets = view.reshape(-1).numpy()
    first = int(min(view_offsets.min(initial=info.storage_offset), lanes.min(initial=info.storage_offset)))
    last = int(max(view_offsets.max(initial=0), lanes.max(initial=0)))
    if width is None:
        width = max(int(info.shape[-1] * info.stride[-1]) if info.shape else 16, 1)
    first -= first % width
    return view_offsets, first, (last - first) // width + 1, width


def _label_memory_axes(ax, tensor: str, first: int, n_rows: int, width: int) -> None:
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels([str(first + r * width) for r in range(n_rows)], fontsize=8 if n_rows <= 24 else 6)
    ax.set_xticks(range(width))
    ax.set_xlabel(f"element offset in {tensor}'s memory (row start + column)")


def draw_program(ax, touches: Touches, tensor: str, program, kind: str = "load", width: int | None = None):
    """One program's accesses to ``tensor`` in memory: the allocation as a strip of elements wrapped into rows of
    ``width``; grey = elements of the view, white = memory outside it, numbers = the order of this program's
    accesses (lane order of each load/store, one op after the other)."""
    info = touches.tensors[tensor]
    accesses = touches.select(tensor, kind, program)
    lanes = np.concatenate([a.offsets for a in accesses]) if accesses else np.zeros(0, dtype=np.int64)
    view_offsets, first, n_rows, width = _memory_geometry(info, lanes, width)
    canvas = np.zeros(n_rows * width)
    canvas[view_offsets - first] = 1.0
    order = np.full(n_rows * width, -1, dtype=np.int64)
    for step, offset in enumerate(lanes):
        if order[offset - first] < 0:
            order[offset - first] = step
    shown = np.where(order >= 0, 2.0, canvas).reshape(n_rows, width)
    ax.imshow(shown, cmap=_program_cmap(), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    if n_rows * width <= 1200:
        grid, size = order.reshape(n_rows, width), 9 if n_rows * width <= 96 else 6
        for r in range(n_rows):
            for c in range(width):
                if grid[r, c] >= 0:
                    ax.text(c, r, grid[r, c], ha="center", va="center", color="white", fontsize=size)
    _label_memory_axes(ax, tensor, first, n_rows, width)
    ax.set_title(f"program {tuple(program)}: {lanes.size} {kind}s of {tensor} "
                 f"({np.unique(lanes).size} distinct), in access order", fontsize=9)
    return ax


def draw_memory(ax, touches: Touches, tensor: str, kind: str = "load", width: int | None = None):
    """The tensor's memory (wrapped into rows of ``width`` elements), each element coloured by the first program
    that accessed it: next to :func:`draw_grid` it shows how a view's logical order maps onto memory."""
    import matplotlib
    from matplotlib.colors import BoundaryNorm, ListedColormap

    info = touches.tensors[tensor]
    order = {(a.launch, a.program): None for a in touches.accesses}
    rank = {key: i for i, key in enumerate(order)}
    accesses = touches.select(tensor, kind)
    lanes = np.concatenate([a.offsets for a in accesses]) if accesses else np.zeros(0, dtype=np.int64)
    view_offsets, first, n_rows, width = _memory_geometry(info, lanes, width)
    owners = np.full(n_rows * width, -1, dtype=np.int64)
    for access in accesses:
        fresh = access.offsets[owners[access.offsets - first] < 0]
        owners[fresh - first] = rank[(access.launch, access.program)]
    n = max(int(owners.max()) + 1, 1)
    palette = matplotlib.colormaps["tab20" if n > 10 else "tab10"]
    cmap = ListedColormap([palette(i % palette.N) for i in range(n)])
    in_view = np.zeros(n_rows * width, dtype=bool)
    in_view[view_offsets - first] = True
    shown = np.ma.masked_where(owners < 0, owners).reshape(n_rows, width)
    ax.imshow(np.where(in_view, 0.5, 0.0).reshape(n_rows, width), cmap="Greys", vmin=0, vmax=2.5, aspect="auto",
              interpolation="nearest")
    ax.imshow(shown, cmap=cmap, norm=BoundaryNorm(np.arange(-0.5, n + 0.5), n), aspect="auto",
              interpolation="nearest")
    if n_rows * width <= 1200:
        grid = owners.reshape(n_rows, width)
        for r in range(n_rows):
            for c in range(width):
                if grid[r, c] >= 0:
                    ax.text(c, r, str(grid[r, c]), ha="center", va="center", fontsize=9 if grid.size <= 96 else 6)
    _label_memory_axes(ax, tensor, first, n_rows, width)
    ax.set_title(f"{tensor}'s memory: first program that {'loaded' if kind == 'load' else 'stored'} each element",
                 fontsize=9)
    return ax


def _program_cmap():
    from matplotlib.colors import ListedColormap
    return ListedColormap(["white", "#d9d9d9", "#d62728"])


def plot(touches: Touches, tensor: str, kind: str = "store", program=None, color: str = "program",
         width: int | None = None, views: tuple[str, ...] = ("grid", "program")):
    """Views of one tensor side by side (returns the matplotlib figure):

    * ``"grid"``: the tensor as a grid coloured by program (or by access count with ``color="count"``);
    * ``"program"``: one program's addresses in memory, in access order (``program``: its id; default: the first
      program that accessed the tensor);
    * ``"memory"``: the tensor's memory coloured by program.
    """
    import matplotlib.pyplot as plt

    if program is None and "program" in views:
        chosen = touches.select(tensor, kind)
        if not chosen:
            raise ValueError(f"no {kind} of {tensor!r} was recorded (tensors: {list(touches.tensors)})")
        program = chosen[0].program
    fig, axes = plt.subplots(1, len(views), figsize=(6 * len(views), 4.5), squeeze=False)
    for ax, view in zip(axes[0], views):
        if view == "grid":
            draw_grid(ax, touches, tensor, kind, color)
        elif view == "program":
            draw_program(ax, touches, tensor, program, kind, width)
        elif view == "memory":
            draw_memory(ax, touches, tensor, kind, width)
        else:
            raise ValueError(f"unknown view {view!r}: use 'grid', 'program' or 'memory'")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    # Run the copy imported under its package name, so that the pickled Touches refers to ropekit.course.touch.
    from ropekit.course.touch import _main as _package_main
    sys.exit(_package_main(sys.argv[1:]))
