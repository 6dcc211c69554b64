"""Build and run the reader's CUDA kernel (exercise 06).

The reader writes only the kernel (``rope_pairs_kernel``); the checker appends a small host function
(``templates/ex06_harness.cu``) and builds the whole file with ``nvcc`` into a shared library that it calls through
``ctypes`` with the tensors' device pointers. No PyTorch headers are involved, so a build takes about a second
(``torch.utils.cpp_extension.load_inline`` would compile PyTorch's headers and bindings for every variant, tens of
seconds each); the same file compiles with ``nvcc -c`` on a machine without a GPU, which is what CI does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["harness_source", "full_source", "find_nvcc", "compile_only", "build", "run", "CompileError"]

_HARNESS = Path(__file__).parent / "templates" / "ex06_harness.cu"
_LIBRARIES: dict[str, ctypes.CDLL] = {}


class CompileError(RuntimeError):
    """nvcc rejected the source; the message holds its error lines."""


def harness_source() -> str:
    return _HARNESS.read_text()


def full_source(kernel_source: str) -> str:
    return kernel_source.rstrip() + "\n\n" + harness_source()


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:  # pragma: no cover
        CUDA_HOME = None
    candidate = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    return candidate if candidate and os.path.exists(candidate) else None


def _nvcc(args: list[str], source: str) -> None:
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc (the CUDA compiler) is not on PATH and CUDA_HOME has none")
    with tempfile.TemporaryDirectory(prefix="ropekit-cuda-") as folder:
        path = os.path.join(folder, "exercise.cu")
        Path(path).write_text(source)
        done = subprocess.run([nvcc, *args, path], cwd=folder, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        raise CompileError("\n".join(errors[:12]).replace(path, "exercise.cu"))


def compile_only(kernel_source: str, arch: str = "sm_90") -> None:
    """``nvcc -c -arch=<arch>`` on the kernel plus the harness (raises :class:`CompileError`)."""
    with tempfile.TemporaryDirectory(prefix="ropekit-cuda-obj-") as folder:
        _nvcc(["-c", f"-arch={arch}", "-o", os.path.join(folder, "exercise.o")], full_source(kernel_source))


def build(kernel_source: str) -> ctypes.CDLL:
    """Compile the kernel plus the harness for this GPU into a shared library and load it (cached by source)."""
    major, minor = torch.cuda.get_device_capability()
    source = full_source(kernel_source)
    key = hashlib.sha256(f"sm_{major}{minor}\n{source}".encode()).hexdigest()[:16]
    if key not in _LIBRARIES:
        folder = Path(tempfile.gettempdir()) / "ropekit-course-cuda"
        folder.mkdir(exist_ok=True)
        library = folder / f"exercise-{key}.so"
        if not library.exists():
            partial = folder / f"exercise-{key}.{os.getpid()}.so"
            _nvcc(["-shared", "-Xcompiler", "-fPIC", f"-arch=sm_{major}{minor}", "-o", str(partial)], source)
            os.replace(partial, library)
        lib = ctypes.CDLL(str(library))
        lib.ropekit_course_launch.restype = ctypes.c_int
        lib.ropekit_course_launch.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        _LIBRARIES[key] = lib
    return _LIBRARIES[key]


def run(kernel_source: str, inputs) -> torch.Tensor:
    """Launch the reader's kernel on the checker's inputs (on the GPU) and return the output view."""
    lib = build(kernel_source)
    x, out = inputs.x.view, inputs.out.view
    batch, seq, heads, head_dim = x.shape
    status = lib.ropekit_course_launch(x.data_ptr(), inputs.cos.view.data_ptr(), inputs.sin.view.data_ptr(),
                                       out.data_ptr(), batch, seq, heads, head_dim)
    torch.cuda.synchronize()
    if status != 0:
        raise RuntimeError(f"the kernel launch failed with CUDA error {status}")
    return out
