"""The CUDA C++ variant: the same contract as Triton v4, written by hand in ``rope.cu``.

Three files, one job each:

* ``rope.cu``      the kernels and their launch configuration; CUDA headers only, so ``nvcc`` alone compiles it (CI does
  that on a CPU-only machine, see :func:`compile_check`);
* ``rope.h``       the plain-C++ seam between the two (argument structs);
* ``binding.cpp``  the PyTorch side: checks tensors, picks the current stream, turns launch errors into exceptions.

They are compiled on first use with :func:`torch.utils.cpp_extension.load` and cached in PyTorch's usual extensions
directory (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``); later processes load the cached build.

Public entry points: :func:`rope_cuda` (the ``backend="cuda"`` launcher of :func:`ropekit.apply_rope`),
:func:`cos_sin_table_cuda` (the table kernel), :func:`available`, :func:`load`, :func:`compile_check`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..positions import SCALAR_OFFSET, PositionSpec

__all__ = [
    "SOURCE_DIR",
    "KERNEL_SOURCE",
    "BINDING_SOURCE",
    "HEADER",
    "available",
    "load",
    "compile_check",
    "find_nvcc",
    "rope_cuda",
    "launch_info",
    "cos_sin_table_cuda",
    "LAUNCH_TUNING",
]

log = logging.getLogger("ropekit")

SOURCE_DIR = Path(__file__).resolve().parent
KERNEL_SOURCE = SOURCE_DIR / "rope.cu"
BINDING_SOURCE = SOURCE_DIR / "binding.cpp"
HEADER = SOURCE_DIR / "rope.h"
EXTENSION_NAME = "ropekit_cuda"

# Launch-shape knobs of the rotation kernel (0 = rope.cu's defaults: 256 threads a block, at most 512 threads on one
# token). They exist for benchmarking the mapping (notebook 06); the defaults are what the API uses.
LAUNCH_TUNING = {"block_threads_target": 0, "row_threads_cap": 0}

_module = None
_lock = threading.Lock()


# --------------------------------------------------------------------------------------------------------------------
# Finding the tools, building, checking
# --------------------------------------------------------------------------------------------------------------------

def find_nvcc() -> str | None:
    """Path of the CUDA compiler: ``$CUDA_HOME/bin/nvcc`` (as PyTorch finds it), else ``nvcc`` on PATH."""
    candidates = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), _torch_cuda_home()):
        if home:
            candidates.append(Path(home) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _torch_cuda_home() -> str | None:
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME


def available() -> tuple[bool, str]:
    """``(True, what will be used)`` when the extension can be built and run here, else ``(False, what is missing)``."""
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return False, (f"this PyTorch ({torch.__version__}) is a CPU-only build: the CUDA backend needs a CUDA "
                       "build of PyTorch and a CUDA GPU")
    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    if cpp_extension.CUDA_HOME is None or find_nvcc() is None:
        return False, ("nvcc, the CUDA compiler, was not found: install the CUDA toolkit and set CUDA_HOME or put nvcc "
                       "on PATH")
    if not cpp_extension.is_ninja_available():
        return False, "ninja was not found (torch.utils.cpp_extension needs it to build): pip install ninja"
    major, minor = torch.cuda.get_device_capability()
    return True, f"{torch.cuda.get_device_name()} (sm_{major}{minor}), nvcc at {find_nvcc()}"


def _sources_digest() -> str:
    # torch's loader rebuilds when the listed sources or flags change, but it does not look at included headers;
    # a flag that carries the digest of all three files makes a change to rope.h rebuild too.
    digest = hashlib.sha256()
    for path in (KERNEL_SOURCE, HEADER, BINDING_SOURCE):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def load():
    """Build (first use) or load (cached) the extension module; raise RuntimeError saying what is missing."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"ropekit's CUDA backend is unavailable: {reason}")
        from torch.utils import cpp_extension

        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
        cuda_flags = ["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-lineinfo",
                      f"-DROPEKIT_SOURCES={_sources_digest()}"]
        start = time.perf_counter()
        module = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(KERNEL_SOURCE), str(BINDING_SOURCE)],
            extra_cflags=["-O3", f"-DROPEKIT_SOURCES={_sources_digest()}"],
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(SOURCE_DIR)],
            verbose=False,
        )
        elapsed = time.perf_counter() - start
        built = Path(module.__file__).stat().st_mtime >= time.time() - elapsed - 1.0
        log.info("ropekit CUDA extension %s in %.1f s (sm_%s, %s)", "built" if built else "loaded from cache",
                 elapsed, arch, module.__file__)
        _module = module
        return module


def compile_check(arch: str = "sm_90", source: str | os.PathLike | None = None) -> None:
    """Compile the kernels with nvcc alone (no torch headers needed): ``nvcc -c -arch=<arch> rope.cu``.

    Warnings count as errors, and the defines PyTorch's build adds are set, so what passes here builds there.
    Raises RuntimeError with nvcc's output when compilation fails, FileNotFoundError when nvcc is absent.
    ``source`` compiles another copy of ``rope.cu`` (``rope.h`` must sit beside it); the tests plant errors that way.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc, the CUDA compiler, was not found (set CUDA_HOME or put nvcc on PATH)")
    source = Path(source) if source is not None else KERNEL_SOURCE
    with tempfile.TemporaryDirectory(prefix="ropekit_nvcc_") as tmp:
        command = [nvcc, "-c", f"-arch={arch}", "-std=c++17", "-O3", "--Werror", "all-warnings",
                   # what torch.utils.cpp_extension adds: implicit half/bfloat16 conversions and operators are off
                   "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                   "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                   str(source), "-o", str(Path(tmp) / "rope.o")]
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        log.info("nvcc %s %s: exit %d in %.1f s", arch, source.name, result.returncode, time.perf_counter() - start)
        output = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise RuntimeError(f"nvcc failed to compile {source} for {arch} (exit {result.returncode}):\n{output}")


# --------------------------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------------------------

_LAUNCH_FIELDS = ("grid", "block", "vectorized", "table_vectorized", "pairs_per_thread", "chunk_threads",
                  "heads_per_pass")


def _describe_launch(info: list[int]) -> dict:
    return dict(zip(_LAUNCH_FIELDS, (tuple(info[0:3]), tuple(info[3:6]), *info[6:])))


def _launch(q, k, cos, sin, out_q, out_k, positions: PositionSpec, rotary_dim: int, interleaved: bool,
            conjugate: bool, cos_per_token: bool, copy_tail: bool) -> list[int]:
    if positions.is_varlen:
        raise NotImplementedError("ropekit's CUDA backend does not implement packed varlen sequences (layout 'thd' "
                                  "with cu_seqlens); use backend='triton' for those")
    if q.shape[2] == 0 and k is not None:
        # no q heads (Hq = 0): the extension sizes its launch from q and would launch nothing, so k goes alone
        q, k, out_q, out_k = k, None, out_k, None
    module = load()
    pos_mode = SCALAR_OFFSET if cos_per_token else positions.mode
    return module.rope(q, k, cos, sin, out_q, out_k, pos_mode, positions.offset,
                       positions.tensor if pos_mode != SCALAR_OFFSET else None, rotary_dim, interleaved, conjugate,
                       cos_per_token, copy_tail and rotary_dim < q.shape[-1],
                       LAUNCH_TUNING["block_threads_target"], LAUNCH_TUNING["row_threads_cap"])


def rope_cuda(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
              out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
              interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
              copy_tail: bool = True) -> None:
    """Rotate q (and k) into out_q (and out_k) with the CUDA kernel; the argument contract of
    :func:`ropekit.triton.launch.rope_v4`.

    q/k/out are 4-D ``(batch, seq, heads, head_dim)`` views with any strides (k may have another head count, or be
    None); out may be the input (in place). cos/sin: half-width tables ``(table_len, rotary_dim/2)`` read at each
    token's position (float32 from :func:`ropekit.cos_sin_table`; other float dtypes are read too), or with
    ``cos_per_token`` full-width rows ``(batch, seq, >= rotary_dim)`` of any float dtype and strides.
    ``positions``: a :class:`ropekit.positions.PositionSpec` (scalar offset, per-sequence offsets or position ids;
    tensors stay on the device, so the call can be captured in a CUDA graph). Tokens whose position is outside the
    table come out as NaN; the table is never read outside its rows. ``copy_tail``: out of place with partial
    rotary, copy channels ``[rotary_dim, head_dim)`` (in place they are left alone). Runs on the current CUDA stream;
    a failed launch raises RuntimeError. Varlen (``positions.cu_seqlens``) raises NotImplementedError.
    """
    info = _launch(q, k, cos, sin, out_q, out_k, positions, rotary_dim, interleaved, conjugate, cos_per_token,
                   copy_tail)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("ropekit cuda: %s q=%s k=%s dtype=%s rotary_dim=%d interleaved=%s conjugate=%s pos_mode=%d "
                  "cos_per_token=%s", _describe_launch(info) if info else "nothing to launch", tuple(q.shape),
                  None if k is None else tuple(k.shape), q.dtype, rotary_dim, interleaved, conjugate,
                  positions.mode, cos_per_token)


def launch_info(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
                out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
                interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
                copy_tail: bool = True) -> dict:
    """Like :func:`rope_cuda` (it runs the kernel), and returns the launch it chose: grid, block, whether the 16-byte
    path was taken, ... (an empty dict when there was nothing to launch). For the course and the tests."""
    info = _launch(q, k, cos, sin, out_q, out_k, positions, rotary_dim, interleaved, conjugate, cos_per_token,
                   copy_tail)
    return _describe_launch(info) if info else {}


def cos_sin_table_cuda(max_positions: int, rotary_dim: int, base: float = 10000.0, device="cuda", *,
                       fast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width float32 tables ``(max_positions, rotary_dim/2)``, ``cos[p, i] = cos(p * base**(-2i/rotary_dim))``,
    filled by a CUDA kernel on ``device``.

    The angle and cos/sin are evaluated in float64 and rounded once to float32, like :func:`ropekit.cos_sin_table`.
    ``fast=True`` is the deliberately wrong variant kept for the course: a float32 angle and ``__sincosf``; its error
    grows with the position (see notebook 06). Never use it for a model.
    """
    for name, value in (("max_positions", max_positions), ("rotary_dim", rotary_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if max_positions < 0:
        raise ValueError(f"max_positions must be >= 0, got {max_positions}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim}")
    if not float(base) > 1.0:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"cos_sin_table_cuda fills tables on a CUDA device, got device {device}")
    module = load()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return module.cos_sin_table(max_positions, rotary_dim, float(base), bool(fast), index, 0)
