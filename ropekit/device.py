"""Where ropekit's calls run: the Triton kernels on a CUDA GPU; without one, plain PyTorch ops on the CPU (the
native backend), or the Triton kernels in Triton's interpreter when asked.

Two decisions, both process-wide:

* ``DEVICE``/``INTERPRET``: whether Triton compiles for a GPU or interprets on the CPU. Triton reads
  ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function, i.e. when ropekit's kernel modules are imported.
  This module therefore has to run before any of them: ``ropekit/__init__.py`` imports it first, and the test
  suite's ``conftest.py`` imports ropekit before anything else.
* :func:`default_backend`: the process's backend, ``"triton"`` (the kernels) or ``"native"`` (:mod:`ropekit.native`,
  the same semantics in PyTorch ops). It is ``"triton"`` on a GPU and ``"native"`` without one, unless
  ``ROPEKIT_BACKEND`` says otherwise or ``TRITON_INTERPRET=1`` was set before ropekit was imported (a request for
  the interpreter). :func:`set_backend` changes it, for the process or for a ``with`` block. A call that is not told
  takes :func:`backend_for` its q: the process's backend, except that tensors the GPU's kernels cannot read (a CPU
  tensor on a machine whose kernels run on its GPU) take the native ops.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

__all__ = ["DEVICE", "INTERPRET", "INTERPRETER_LOCK", "INTERPRETER_MISSING", "BACKENDS", "describe", "default_device",
           "default_backend", "backend_for", "kernels_on_gpu", "kernels_read", "set_backend", "on_device"]

BACKENDS = ("native", "triton")


def _decide() -> tuple[str, bool]:
    """Return (device, interpreted) and set TRITON_INTERPRET when the interpreter is needed."""
    forced = os.environ.get("TRITON_INTERPRET")
    if torch.cuda.is_available():
        # A user may still force the interpreter on a GPU machine (the course's touch pictures do, in a subprocess).
        return ("cpu", True) if forced == "1" else ("cuda", False)
    if forced not in (None, "", "1"):
        # TRITON_INTERPRET=0 on a machine without a GPU would leave Triton with no backend at all.
        raise RuntimeError(
            "ropekit: no CUDA device is available and TRITON_INTERPRET is set to "
            f"{forced!r}; unset it (ropekit then uses the Triton interpreter on the CPU)."
        )
    if INTERPRETER_MISSING:
        return "cpu", True  # the interpreter cannot run here: TRITON_INTERPRET stays unset (triton would need numpy)
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu", True


def _interpreter_missing() -> str:
    """Why Triton's interpreter cannot run in this process ("" when it can): it computes with numpy, which the native
    backend does not need."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        return "Triton's interpreter needs numpy, which is not installed (pip install numpy)"
    return ""


def _interpreter_rounds_bf16() -> None:
    """Make the Triton interpreter round fp32 -> bf16 casts to nearest even, as the GPU does.

    The interpreter (Triton 3.6-3.9) keeps the top 16 bits of an fp32 value: it truncates, up to one bf16 ulp away
    from the correctly rounded result, and the CPU's bits then differ from the GPU's for every bf16 kernel. Its cast
    is replaced by round-to-nearest-even on the fp32 bits (NaN stays NaN; values past the largest bf16 become inf,
    as on the GPU). Nothing changes when the interpreter has no such method.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    truncating_cast = getattr(builder, "cast_impl", None)
    if truncating_cast is None or getattr(truncating_cast, "rounds_bf16", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.asarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            is_nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x7FFFFF) != 0)
            rounded = np.where(is_nan, (bits >> 16) | 0x40, rounded)  # a quiet NaN, never rounded into inf
            return interpreter.TensorHandle(rounded.astype(np.uint16), tl.bfloat16)
        return truncating_cast(self, src, dst_type)

    cast_impl.rounds_bf16 = True
    builder.cast_impl = cast_impl


def _interpreter_indexes_scalars() -> None:
    """Let a kernel use a scalar argument as a Python index under the interpreter, e.g. ``range(0, n_heads, BLOCK_H)``.

    The interpreter holds a scalar as a one-element 1-d array. Triton 3.6 turns it into a Python int with
    ``int(array)``, which NumPy 2.4 refuses for arrays that are not 0-d ("only 0-dimensional arrays can be converted
    to Python scalars"); later Triton squeezes the array first. The interpreter's per-launch patch of
    ``tl.tensor`` is wrapped to squeeze as well. Nothing changes where NumPy still converts such arrays.
    """
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "indexes_scalars", False):
        return
    try:
        int(np.zeros(1, dtype=np.int32))
        return
    except TypeError:
        pass

    def patch_lang_tensor(tensor, scope, *args, **kwargs):
        patch_tensor(tensor, scope, *args, **kwargs)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.indexes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _decide_backend(interpret_was_asked: bool) -> str:
    """The process's default backend: ``ROPEKIT_BACKEND`` when set, else the Triton kernels on a GPU or when
    ``TRITON_INTERPRET=1`` was set before ropekit was imported, else native."""
    asked = os.environ.get("ROPEKIT_BACKEND", "")
    if asked:
        if asked not in BACKENDS:
            raise RuntimeError(f"ropekit: ROPEKIT_BACKEND must be one of {BACKENDS}, got {asked!r}")
        if asked == "triton" and INTERPRETER_MISSING:
            raise RuntimeError(f"ropekit: ROPEKIT_BACKEND=triton, but {INTERPRETER_MISSING}")
        return asked
    return "triton" if DEVICE == "cuda" or interpret_was_asked else "native"


_interpret_was_asked = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRETER_MISSING = "" if torch.cuda.is_available() else _interpreter_missing()
DEVICE, INTERPRET = _decide()
if INTERPRET:
    _interpreter_rounds_bf16()
    _interpreter_indexes_scalars()
_backend = _decide_backend(_interpret_was_asked)
if INTERPRET and not _interpret_was_asked:
    # This process set TRITON_INTERPRET=1 itself (so that the kernels can run when asked): a child process inherits
    # it, and would read it as a request for the interpreter, unless it is told the backend this process chose.
    os.environ.setdefault("ROPEKIT_BACKEND", _backend)


def default_backend() -> str:
    """The process's backend: ``"triton"`` (the kernels; in Triton's interpreter without a GPU) or ``"native"``
    (PyTorch ops). A call that is not told (``apply_rope``'s ``backend=None``, the fused ops and everything built on
    them) takes :func:`backend_for` its q."""
    return _backend


def kernels_on_gpu() -> bool:
    """Whether the kernels run compiled on a CUDA GPU (not in Triton's interpreter): then they read CUDA tensors
    only."""
    return DEVICE == "cuda" and not INTERPRET


def kernels_read(tensor: torch.Tensor) -> bool:
    """Whether the kernels can take ``tensor``: any tensor where they do not run on the GPU (:func:`kernels_on_gpu`);
    there, a CUDA tensor, or a meta one (shape inference reads nothing)."""
    return not kernels_on_gpu() or tensor.is_cuda or tensor.is_meta


def backend_for(tensor) -> str:
    """What a call on ``tensor`` computes with when it is not told: :func:`default_backend`, except that a tensor the
    kernels cannot take (:func:`kernels_read`: a CPU tensor where they run on the GPU) takes the native ops, which run
    wherever torch does (anything but a tensor: the default, for validation to refuse)."""
    if _backend == "triton" and isinstance(tensor, torch.Tensor) and not kernels_read(tensor):
        return "native"
    return _backend


def on_device(device) -> contextlib.AbstractContextManager:
    """A context under which ``device`` (a CUDA device or its index) is the current CUDA device; nothing to do where it
    is already, or for a CPU, meta or no device. Triton compiles, loads and launches a kernel on the current device,
    whatever device the kernel's tensors lie on: in a process whose model spreads over GPUs (transformers'
    ``device_map="auto"``), a layer's tensors lie on ``cuda:1`` while ``cuda:0`` stays current. Planning (the
    device's facts, the autotune's clock, a kernel's registers) and launching therefore run under the call's device
    (:mod:`ropekit.triton.launch`)."""
    if device is None:
        return contextlib.nullcontext()
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device.index)


class set_backend:
    """Make ``backend`` (``"native"`` or ``"triton"``) the default for the process, or, used as a context manager,
    for the ``with`` block only (the previous default comes back on exit, as with ``torch.set_grad_enabled``)::

        ropekit.device.set_backend("triton")          # from here on: the Triton kernels (interpreted on a CPU)
        with ropekit.device.set_backend("native"):     # inside: PyTorch ops
            ...

    Process-wide, like ``TRITON_INTERPRET``: every thread sees it, and ``ROPEKIT_BACKEND`` is set to it so that child
    processes started meanwhile make the same choice.
    """

    def __init__(self, backend: str):
        global _backend
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton" and INTERPRETER_MISSING:
            raise RuntimeError(f"the Triton kernels cannot run here: {INTERPRETER_MISSING}")
        self.previous = (_backend, os.environ.get("ROPEKIT_BACKEND"))
        _backend = backend
        os.environ["ROPEKIT_BACKEND"] = backend

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        global _backend
        _backend, variable = self.previous
        if variable is None:
            os.environ.pop("ROPEKIT_BACKEND", None)
        else:
            os.environ["ROPEKIT_BACKEND"] = variable


# The Triton interpreter runs a launch by swapping process-wide state (triton.language's functions are patched for
# the duration of the launch), so two threads interpreting at once break each other. Launches under the
# interpreter take this lock; on a GPU launches need none (each is queued on the caller's stream).
INTERPRETER_LOCK = threading.Lock()


def default_device() -> torch.device:
    """The torch device the kernels run on in this process."""
    return torch.device(DEVICE)


def describe() -> str:
    """One line for humans: where calls run and why."""
    if _backend == "native":
        where = "CPU" if DEVICE == "cpu" else f"CUDA: {torch.cuda.get_device_name()}"
        kernels = "the Triton kernels cannot run: numpy is missing" if INTERPRETER_MISSING else \
            "the Triton kernels run when asked"
        return f"{where} through PyTorch ops (the native backend; {kernels})"
    if INTERPRET:
        return "CPU through the Triton interpreter (TRITON_INTERPRET=1): correct but slow, never a benchmark"
    return f"CUDA: {torch.cuda.get_device_name()}"
