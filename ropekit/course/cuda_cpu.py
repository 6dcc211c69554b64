"""Run the reader's CUDA kernel (exercise 06) on a CPU: every thread of the launch, over the checker's guarded buffers.

A CUDA kernel body is C++. Compiled by the system's C++ compiler after a small shim (``templates/ex06_cpu_shim.h``:
``__global__`` becomes a plain function, ``blockIdx``/``threadIdx``/``blockDim``/``gridDim`` globals, and every
``float*`` a checked pointer), it runs on the CPU with the same integer and float arithmetic the reader wrote. A host
loop (``templates/ex06_cpu_harness.cpp``) calls it for every (block, thread) of the launch ``ex06_harness.cu`` makes
on a GPU, one thread after another: exact for a kernel whose threads never talk to each other, which is this
exercise. Each access goes through the checked pointer, so the emulation knows, for the poisoned output and the
inputs inside their canary-filled allocations (``buffers.py``):

* every load or store outside its tensor, with the thread that made it and the index it used (the missing bounds
  guard, a stride too large): carried out only inside the checker's allocation, never past it;
* two threads storing one output element (a stride too small: a race on a GPU).

What it writes inside the tensors is then read by the same ``diagnose.analyse`` as every other exercise (direction,
pairing, positions, unwritten elements). Kernels that share memory between threads (``__shared__``,
``__syncthreads``, warp shuffles) do not compile under the shim, and the checker says they need a GPU.

Why compile instead of translating the body to Python: the C++ compiler reads exactly the language the reader
wrote (types, integer division and overflow, precedence), so no second parser can disagree with nvcc about what the
code means, and a few hundred threads run in microseconds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from .cuda import CompileError
from .diagnose import Finding

__all__ = ["find_cxx", "emulation_source", "build", "run", "KernelFault", "BUFFERS", "THREADS_PER_BLOCK"]

_TEMPLATES = Path(__file__).parent / "templates"
_LIBRARIES: dict[str, ctypes.CDLL] = {}
BUFFERS = ("x", "cos_table", "sin_table", "out")  # the kernel's pointer arguments, in the launch's order
THREADS_PER_BLOCK = 128  # as templates/ex06_harness.cu launches it

# `const float* __restrict__ name` (or `float *name`): the kernel's pointers, as checked pointers.
_FLOAT_POINTER = re.compile(r"\b(const\s+)?float\s*\*\s*(?:const\s+)?(?:__restrict__\s+|__restrict\s+)?")


class KernelFault(RuntimeError):
    """The emulated kernel accessed memory it must not; ``finding`` says which thread did what."""

    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


class _Buffer(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("view_end", ctypes.c_int64), ("alloc_begin", ctypes.c_int64),
                ("alloc_end", ctypes.c_int64), ("writer", ctypes.c_void_p)]


class _Report(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "bad_accesses", "bad_threads",
        "load_seen", "load_buffer", "load_index", "load_block", "load_thread",
        "store_seen", "store_buffer", "store_index", "store_block", "store_thread",
        "overlaps", "overlap_buffer", "overlap_index", "overlap_first", "overlap_second")]


def find_cxx() -> str | None:
    """The host C++ compiler: ``$CXX``, else ``g++``, else ``c++``."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def emulation_source(kernel_source: str) -> str:
    """The shim, the reader's kernel with its float pointers checked, and the host loop over the launch."""
    kernel = _FLOAT_POINTER.sub(lambda m: f"ropekit_emu::Ptr<{m.group(1) or ''}float> ", kernel_source)
    return "\n".join(((_TEMPLATES / "ex06_cpu_shim.h").read_text(), "#line 1 \"exercise.cu\"", kernel.rstrip(),
                      (_TEMPLATES / "ex06_cpu_harness.cpp").read_text()))


def build(kernel_source: str) -> ctypes.CDLL:
    """Compile the emulation into a shared library and load it (cached by source). Raises :class:`CompileError`
    with the compiler's error lines, or FileNotFoundError without a C++ compiler."""
    cxx = find_cxx()
    if cxx is None:
        raise FileNotFoundError("no C++ compiler (g++ or c++) on PATH")
    source = emulation_source(kernel_source)
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    if key not in _LIBRARIES:
        folder = Path(tempfile.gettempdir()) / "ropekit-course-cuda-cpu"
        folder.mkdir(exist_ok=True)
        library = folder / f"emulation-{key}.so"
        if not library.exists():
            path = folder / f"emulation-{key}.{os.getpid()}.cpp"
            partial = folder / f"emulation-{key}.{os.getpid()}.so"
            path.write_text(source)
            # -fwrapv: signed overflow wraps, as it does on the GPU; -O1 keeps the build about a second.
            done = subprocess.run([cxx, "-std=c++17", "-O1", "-fwrapv", "-shared", "-fPIC", "-o", str(partial),
                                   str(path)], capture_output=True, text=True, timeout=120)
            path.unlink(missing_ok=True)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
                raise CompileError("\n".join(errors[:8]).replace(str(path), "exercise.cu"))
            os.replace(partial, library)
        lib = ctypes.CDLL(str(library))
        lib.ropekit_course_emulate.restype = ctypes.c_int
        lib.ropekit_course_emulate.argtypes = [ctypes.POINTER(_Buffer)] + [ctypes.c_int] * 4 + \
            [ctypes.POINTER(_Report)]
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def _buffer(guarded, writer: torch.Tensor | None = None) -> _Buffer:
    view = guarded.view
    if view.device.type != "cpu" or view.dtype != torch.float32:
        raise ValueError("the CPU emulation runs on float32 CPU tensors")
    start = view.storage_offset() - guarded.storage.storage_offset()
    view_end = int(guarded.offsets.max()) - int(guarded.offsets.min()) + 1
    return _Buffer(view.data_ptr(), view_end, -start, guarded.storage.numel() - start,
                   writer.data_ptr() if writer is not None else None)


def run(kernel_source: str, inputs) -> torch.Tensor:
    """Run every thread of the launch on the CPU over the checker's inputs; return the output view.

    Raises :class:`KernelFault` when a thread loads or stores outside its tensor, or two threads store one element.
    """
    lib = build(kernel_source)
    x, out = inputs.x.view, inputs.out.view
    batch, seq, heads, head_dim = x.shape
    writer = torch.full((int(inputs.out.offsets.max()) - int(inputs.out.offsets.min()) + 1,), -1, dtype=torch.int64)
    buffers = (_Buffer * 4)(_buffer(inputs.x), _buffer(inputs.cos), _buffer(inputs.sin), _buffer(inputs.out, writer))
    report = _Report()
    blocks = lib.ropekit_course_emulate(buffers, batch, seq, heads, head_dim, ctypes.byref(report))
    finding = _finding(report, blocks, sizes=[b.view_end for b in buffers], n_pairs=x.numel() // 2,
                       head_dim=head_dim)
    if finding is not None:
        raise KernelFault(finding)
    return out


def _thread(pair: int) -> str:
    return f"threadIdx.x {pair % THREADS_PER_BLOCK} of blockIdx.x {pair // THREADS_PER_BLOCK} (pair {pair})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _finding(report: _Report, blocks: int, *, sizes: list[int], n_pairs: int, head_dim: int) -> Finding | None:
    """The first fault in words: which thread, which tensor, which index, and the usual fix."""
    def where(buffer: int, index: int) -> str:
        return (f"{BUFFERS[buffer]}[{index}], outside {BUFFERS[buffer]}'s {sizes[buffer]} elements "
                f"({BUFFERS[buffer]}[0] … {BUFFERS[buffer]}[{sizes[buffer] - 1}])")

    threads = blocks * THREADS_PER_BLOCK
    if report.bad_accesses:
        store = bool(report.store_seen)
        first = "store" if store else "load"
        block, thread = getattr(report, f"{first}_block"), getattr(report, f"{first}_thread")
        buffer, index = getattr(report, f"{first}_buffer"), getattr(report, f"{first}_index")
        pair = block * THREADS_PER_BLOCK + thread
        verb = "stored to" if store else "read"
        words = (f"Run on the CPU, thread by thread ({_count(blocks, 'block')} of {THREADS_PER_BLOCK} threads = "
                 f"{threads} threads for {n_pairs} pairs): {_count(report.bad_threads, 'thread')} went outside the "
                 f"tensors. The first {first} outside: {_thread(pair)} {verb} {where(buffer, index)}.")
        if pair >= n_pairs:
            words += (f" Pair {pair} does not exist (the pairs are 0 … {n_pairs - 1}): the grid is rounded up to "
                      "whole blocks, so the threads past the last pair must do nothing. Start the body with "
                      "`if (pair >= n_pairs) return;`.")
        else:
            words += (f" Pair {pair} is a real pair, so its index arithmetic runs past the tensor: a row holds "
                      f"head_dim = {head_dim} channels and starts row * head_dim elements in; the pair's channels "
                      "are i and i + head_dim / 2; cos/sin rows hold head_dim / 2 values.")
        diagnosis = "out_of_bounds" if store else "load_out_of_bounds"
        return Finding(diagnosis, words)
    if report.overlaps:
        index = report.overlap_index
        first, second = report.overlap_first, report.overlap_second
        return Finding("overlapping_stores", (
            f"Run on the CPU, thread by thread: two threads stored to the same element. {_thread(first)} and "
            f"{_thread(second)} both wrote out[{index}] ({_count(report.overlaps, 'such store')} in all). On a GPU "
            "that is a race, and elements another pair should "
            f"have written stay unwritten. A row of head_dim = {head_dim} channels starts row * head_dim elements "
            "in, and its pair i writes channels i and i + head_dim / 2: check the row's stride (head_dim, not "
            "head_dim / 2) and the pair's channels."))
    return None
