"""``check(name, code)``: run the reader's code on small inputs and say, in plain words, what is right or wrong.

Kernels run where ropekit runs them: on the GPU when there is one, otherwise under the Triton interpreter on the
CPU. PyTorch exercises run on the CPU. Nothing the reader's code does makes ``check`` raise: an untouched template
reports "not yet solved", an exception is reported with its last line and, when the checker recognises it (a
compile error, a kernel decorated before ``import ropekit``), a hint that names the fix (``errors.py``). An exercise's
``grade`` hook (e.g. speed) runs after its code is correct and decides the verdict.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .. import device as _device
from . import exercises as _exercises
from . import fence
from .addressing import Names
from .cases import make_inputs
from .diagnose import DIAGNOSES, GENERIC, Finding, analyse
from .errors import IMPORT_ORDER, explain

__all__ = ["CheckResult", "check"]


@dataclass
class CheckResult:
    exercise: str
    ok: bool
    diagnosis: str  # a key of ropekit.course.DIAGNOSES
    message: str
    max_error: float | None = None  # max |output - float64 reference| over the cases that ran
    case: str | None = None  # the case that showed the problem (None when all passed)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            mark = "PASSED"
        elif self.diagnosis == "not_solved":
            mark = "not yet solved"
        elif self.diagnosis == "needs_gpu":
            mark = "NOT RUN: needs a GPU, not a failure"
        else:
            mark = "FAILED"
        lines = [f"[{self.exercise}] {mark} ({self.diagnosis})", self.message]
        if self.case and not self.ok:
            lines.append(f"(case: {self.case})")
        return "\n".join(line for line in lines if line)

    __repr__ = __str__


def _device_for(ex) -> str:
    return "cpu" if ex.language == "pytorch" else _device.DEVICE


def check(name: str, code) -> CheckResult:
    """Check the reader's ``code`` for exercise ``name`` (a function, a ``@triton.jit`` kernel, or CUDA source).

    Returns a :class:`CheckResult` (``.ok``, ``.diagnosis``, ``.message``, ``.max_error``); it prints itself
    readably in a notebook, and is truthy only when the exercise is solved.
    """
    ex = _exercises.exercise(name)
    with fence.fenced():  # under the interpreter, a stray address is stopped before it reaches memory
        if ex.check is None:
            return _check_rope(ex, code)
        try:
            finding = ex.check(code)
        except Exception as error:  # noqa: BLE001  (a check calls the reader's code: whatever escapes is reported)
            finding = explain(error)
        return _graded(ex, code, CheckResult(ex.name, finding.diagnosis == "correct", finding.diagnosis,
                                             finding.message, finding.max_error))


def _graded(ex, code, result: CheckResult) -> CheckResult:
    """Run the exercise's ``grade`` hook (e.g. speed against the copy ceiling) on code that is already correct.

    The hook returns a Finding: "correct" passes (its message is added: the measured speed, or why speed could not
    be graded on this machine), any other diagnosis fails the check with its message; None adds nothing.
    """
    if ex.grade is None or not result.ok:
        return result
    try:
        finding = ex.grade(code)
    except Exception as error:  # noqa: BLE001  (the grade runs the reader's code too)
        finding = explain(error)
    if finding is None:
        return result
    message = f"{result.message}\n{finding.message}" if finding.message else result.message
    return CheckResult(result.exercise, finding.diagnosis == "correct", finding.diagnosis, message,
                       result.max_error, result.case)


def _passed_message(n_cases: int, errors: dict[str, float], note: str = "") -> str:
    """errors: max |error| by output dtype name."""
    parts = []
    for dtype, error in errors.items():
        bound = " (within 1 ulp)" if dtype in ("float16", "bfloat16") else ""
        parts.append(f"{error:.3g} in {dtype}{bound}")
    error_words = f"; max |error| vs the float64 reference: {', '.join(parts)}" if parts else ""
    cases = "the 1 case" if n_cases == 1 else f"all {n_cases} cases"
    return f"Correct on {cases}{error_words}.{note}"


# --- RoPE-shaped exercises: the reader's code runs on each of the exercise's cases ---------------------------------

def _check_rope(ex, code) -> CheckResult:
    if ex.language == "cuda":
        early = _cuda_precheck(ex, code)
        if early is not None:
            return early
    elif ex.language == "triton":
        early = _triton_precheck(ex, code)
        if early is not None:
            return early
    candidates = frozenset(ex.diagnoses) | GENERIC
    errors: dict[str, float] = {}
    reloads = None  # the touches of the case that reloaded cos/sin most (the 04 exercise under the interpreter)
    for case in ex.cases:
        inputs = make_inputs(case, _device_for(ex))
        touches = None
        try:
            if ex.notes.get("check_reuse") and _device.INTERPRET:
                from . import touch
                with touch.recording() as recorder:
                    output = ex.run(code, inputs)
                touches = touch._attribute(recorder, {"cos": inputs.cos.view, "sin": inputs.sin.view})
            else:
                output = ex.run(code, inputs)
        except Exception as error:  # noqa: BLE001  (whatever the reader's code raises is reported, not re-raised)
            finding = explain(error)
        else:
            split = ex.notes.get("split_heads")  # q's heads then k's in one output (exercise 05)
            names = Names(split(case.heads)) if split else Names()
            finding = (_validate_returned(ex, inputs, output)
                       or analyse(inputs, output, candidates=candidates, names=names,
                                  program="function" if ex.language == "pytorch" else ex.notes.get("program", "tile")))
        if finding.diagnosis == "correct" and touches is not None:
            finding = _stray_table_loads(touches, case) or finding
        if finding.diagnosis == "correct" and touches is not None:
            reloads = touches if reloads is None or touches.reuse("cos") > reloads.reuse("cos") else reloads
        if finding.diagnosis != "correct":
            return CheckResult(ex.name, False, finding.diagnosis, finding.message, finding.max_error, case.label)
        dtype = str(case.dtype).replace("torch.", "")
        errors[dtype] = max(errors.get(dtype, 0.0), finding.max_error or 0.0)
    note = ""
    if ex.notes.get("check_reuse") and not _device.INTERPRET:
        note = " (Reuse of cos/sin across heads is checked only under the Triton interpreter, on a CPU machine.)"
    result = CheckResult(ex.name, True, "correct", _passed_message(len(ex.cases), errors, note),
                         max(errors.values(), default=0.0))
    if reloads is not None:
        result = _reuse_finding(reloads, result)
    return _graded(ex, code, result)


def _triton_precheck(ex, code) -> CheckResult | None:
    if not hasattr(code, "__getitem__"):
        return CheckResult(ex.name, False, "raised",
                           f"Expected a @triton.jit kernel (the {ex.entry} of the template), got "
                           f"{type(code).__name__}.")
    if _device.INTERPRET and type(code).__name__ != "InterpretedFunction":
        # Decorated while TRITON_INTERPRET was unset: it would look for a GPU driver and fail with "0 active drivers".
        return CheckResult(ex.name, False, "import_order", IMPORT_ORDER)
    return None


def _validate_returned(ex, inputs, output) -> Finding | None:
    """What a returned tensor must be before its values mean anything (PyTorch exercises)."""
    if ex.language != "pytorch":
        return None
    if output is None:
        return Finding("not_solved", "Not yet solved: your function returned None.")
    if not isinstance(output, torch.Tensor):
        return Finding("wrong", f"Return a tensor, not {type(output).__name__}.")
    expected_shape = tuple(inputs.x.view.shape)
    if tuple(output.shape) != expected_shape:
        return Finding("wrong", f"Your output has shape {tuple(output.shape)}; x's shape {expected_shape} was "
                                "expected (the tail past rotary_dim is part of the output).")
    if output.dtype != inputs.case.dtype:
        return Finding("wrong", f"Your output is {output.dtype} for a {inputs.case.dtype} x: compute in float32 but "
                                "return x's dtype.")
    return None


def _stray_table_loads(touches, case) -> Finding | None:
    """Loads of cos/sin rows past the table (recorded under the interpreter): the values are right only because the
    masked stores dropped them, so the output alone cannot show it."""
    stray = touches.outside_view("cos", "load") + touches.outside_view("sin", "load")
    if not stray:
        return None
    return Finding("load_out_of_bounds", (
        f"{stray} cos/sin load lane(s) read outside the table ({case.table_len} rows, one per position the tokens "
        "reach): the tile's tokens past seq_len read rows that do not exist. The output is right only because the "
        "masked stores dropped those lanes; on a GPU such a load reads memory that is not yours (garbage, or an "
        "illegal-address fault at the end of an allocation). Give the cos/sin loads the token mask: "
        "tl.load(COS + rows, mask=inside[:, None], other=0.0). (Found by recording the loads under the Triton "
        "interpreter, on a CPU machine.)"))


def _reuse_finding(touches, result: CheckResult) -> CheckResult:
    """Correct values that reload cos/sin in the head loop still pass: the rows come back from L2, and notebook 04's
    section 5 measures what the reloading costs on a GPU (about the run-to-run spread). The note says what the tile
    is for, so the reader can still choose to load them once."""
    reuse = max(touches.reuse("cos"), touches.reuse("sin"))
    if reuse < 1.5:
        return result
    note = (f"Passed, with a note: recorded under the Triton interpreter, one program loaded each cos/sin element "
            f"{reuse:.1f} times on average, once per head step. Loading the tile's cos/sin rows [BLOCK_S, HEAD_DIM/2] "
            "once, before the loop over heads, and broadcasting them (cos[:, None, :]) is what the tile is for; on a "
            "GPU the reloads mostly hit L2, and notebook 04's section 5 measures what they cost: about the "
            "run-to-run spread.")
    return CheckResult(result.exercise, True, "cos_sin_reloaded", f"{result.message}\n{note}", result.max_error)


def _cuda_precheck(ex, code) -> CheckResult | None:
    """Build before running: a compile error (or no way to run the kernel here) is the answer itself.

    On a GPU the kernel is built with nvcc and run there. Without one, nvcc (where installed) checks that the source
    compiles for the GPU, and the kernel then runs on the CPU emulation (``cuda_cpu``: host C++, every thread of the
    launch over the checker's guarded buffers)."""
    from . import cuda, cuda_cpu
    if not isinstance(code, str):
        return CheckResult(ex.name, False, "raised", f"Pass the CUDA source as a string, got {type(code).__name__}.")
    if _device.DEVICE == "cuda":
        if cuda.find_nvcc() is None:
            return CheckResult(ex.name, False, "needs_gpu", "The CUDA exercise needs nvcc (the CUDA compiler), "
                                                            "which this machine lacks; nothing was checked.")
        return _nvcc_verdict(ex, cuda.build, code)
    if cuda_cpu.find_cxx() is None:
        rejected = _nvcc_verdict(ex, cuda.compile_only, code) if cuda.find_nvcc() else None
        return rejected or CheckResult(ex.name, False, "needs_gpu", (
            f"{'Compiles with nvcc (-arch=sm_90). ' if cuda.find_nvcc() else ''}Running it needs a CUDA GPU, or a "
            "C++ compiler (g++) for the CPU emulation; this machine has neither, so nothing ran."))
    # nvcc (the GPU's verdict on the source) and the host compiler (the emulation) build side by side.
    with ThreadPoolExecutor(1) as pool:
        emulation = pool.submit(cuda_cpu.build, code)
        rejected = _nvcc_verdict(ex, cuda.compile_only, code) if cuda.find_nvcc() else None
        error = emulation.exception()
    if rejected is not None:
        return rejected
    if isinstance(error, cuda.CompileError):
        if cuda.find_nvcc():  # nvcc accepts it: it uses what the emulation leaves out (shared memory, shuffles)
            return CheckResult(ex.name, False, "needs_gpu", (
                "Compiles with nvcc (-arch=sm_90). The CPU emulation cannot run it (it runs one thread at a time "
                "and supports the kernel's float pointers indexed or offset, not shared memory, barriers, warp "
                f"shuffles or vector types); on a GPU the checker runs it. The host compiler said:\n{error}"))
        return CheckResult(ex.name, False, "compile_error",
                           f"The source does not compile (as host C++ for the CPU emulation; this machine has no "
                           f"nvcc):\n{error}")
    if error is not None:
        return CheckResult(ex.name, False, "raised", f"Building the CPU emulation failed: {error}")
    return None


def _nvcc_verdict(ex, build, code) -> CheckResult | None:
    """None when nvcc builds ``code``; else the answer (its errors, or a broken toolchain, reported not raised)."""
    from .cuda import CompileError
    try:
        build(code)
    except CompileError as error:
        return CheckResult(ex.name, False, "compile_error", f"nvcc rejected the source:\n{error}")
    except Exception as error:  # noqa: BLE001
        return CheckResult(ex.name, False, "raised", f"Building the CUDA source failed: {error}")
    return None


def describe_diagnoses() -> str:
    return "\n".join(f"{name:22s} {meaning}" for name, meaning in DIAGNOSES.items())
