"""``check(name, code)``: run the reader's code on small inputs and say, in plain words, what is right or wrong.

Kernels run where ropekit runs them: on the GPU when there is one, otherwise under the Triton interpreter on the
CPU. PyTorch exercises run on the CPU. Nothing the reader's code does makes ``check`` raise: an untouched template
reports "not yet solved", an exception is reported with its last line.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch

from .. import device as _device
from . import exercises as _exercises
from .cases import make_inputs
from .diagnose import DIAGNOSES, Finding, analyse

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
        mark = "PASSED" if self.ok else ("not yet solved" if self.diagnosis == "not_solved" else "FAILED")
        lines = [f"[{self.exercise}] {mark} ({self.diagnosis})", self.message]
        if self.case and not self.ok:
            lines.append(f"(case: {self.case})")
        return "\n".join(line for line in lines if line)

    __repr__ = __str__


def _raised(name: str, error: BaseException) -> Finding:
    if isinstance(error, NotImplementedError):
        return Finding("not_solved", "Not yet solved: the template still raises NotImplementedError. Replace it "
                                     "with your code and run the check again.")
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    if len(text) > 1500:
        text = text[:1500] + " ..."
    return Finding("raised", f"Your code raised an exception:\n{text}")


def _device_for(ex) -> str:
    return "cpu" if ex.language == "pytorch" else _device.DEVICE


def check(name: str, code) -> CheckResult:
    """Check the reader's ``code`` for exercise ``name`` (a function, a ``@triton.jit`` kernel, or CUDA source).

    Returns a :class:`CheckResult` (``.ok``, ``.diagnosis``, ``.message``, ``.max_error``); it prints itself
    readably in a notebook, and is truthy only when the exercise is solved.
    """
    ex = _exercises.exercise(name)
    if ex.notes.get("check"):  # an exercise with its own check (notebook 02's warm-ups)
        return ex.notes["check"](ex, code)
    if ex.name == "01_rotate_pair":
        finding = _check_rotate_pair(code)
    elif ex.name == "01_pair_indices":
        finding = _check_pair_indices(code)
    else:
        return _check_rope(ex, code)
    return CheckResult(ex.name, finding.diagnosis == "correct", finding.diagnosis, finding.message,
                       finding.max_error)


def _passed_message(n_cases: int, errors: dict[str, float], note: str = "") -> str:
    """errors: max |error| by output dtype name."""
    parts = []
    for dtype, error in errors.items():
        bound = " (within 1 ulp)" if dtype in ("float16", "bfloat16") else ""
        parts.append(f"{error:.3g} in {dtype}{bound}")
    error_words = f"; max |error| vs the float64 reference: {', '.join(parts)}" if parts else ""
    cases = "the 1 case" if n_cases == 1 else f"all {n_cases} cases"
    return f"Correct on {cases}{error_words}.{note}"


# --- RoPE-shaped exercises (01_rope_torch, 02-06) ------------------------------------------------------------------

def _check_rope(ex, code) -> CheckResult:
    if ex.language == "cuda":
        early = _cuda_precheck(ex, code)
        if early is not None:
            return early
    elif ex.language == "triton" and not hasattr(code, "__getitem__"):
        return CheckResult(ex.name, False, "raised",
                           f"Expected a @triton.jit kernel (the {ex.entry} of the template), got "
                           f"{type(code).__name__}.")
    candidates = frozenset(ex.diagnoses)
    errors: dict[str, float] = {}
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
            finding = _raised(ex.name, error)
        else:
            finding = _validate_returned(ex, inputs, output) or analyse(inputs, output, candidates=candidates)
        if finding.diagnosis == "correct" and touches is not None:
            finding = _reuse_finding(touches) or finding
        if finding.diagnosis != "correct":
            return CheckResult(ex.name, False, finding.diagnosis, finding.message, finding.max_error, case.label)
        dtype = str(case.dtype).replace("torch.", "")
        errors[dtype] = max(errors.get(dtype, 0.0), finding.max_error or 0.0)
    note = ""
    if ex.notes.get("check_reuse") and not _device.INTERPRET:
        note = " (Reuse of cos/sin across heads is checked only under the Triton interpreter, on a CPU machine.)"
    return CheckResult(ex.name, True, "correct", _passed_message(len(ex.cases), errors, note),
                       max(errors.values(), default=0.0))


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


def _reuse_finding(touches) -> Finding | None:
    reuse = max(touches.reuse("cos"), touches.reuse("sin"))
    if reuse < 1.5:
        return None
    return Finding("cos_sin_reloaded", (
        f"The values are right, but the tile does not reuse cos/sin: recorded under the Triton interpreter, one "
        f"program loaded each cos/sin element {reuse:.1f} times on average. Load the tile's cos/sin rows "
        "[BLOCK_S, HEAD_DIM/2] once, outside any loop over heads, and broadcast them (cos[:, None, :]) over the head "
        "axis: that is what the tiled kernel saves."))


def _cuda_precheck(ex, code) -> CheckResult | None:
    """Compile before running: a compile error (or a missing nvcc / GPU) is the answer itself."""
    from . import cuda
    if not isinstance(code, str):
        return CheckResult(ex.name, False, "raised", f"Pass the CUDA source as a string, got {type(code).__name__}.")
    if cuda.find_nvcc() is None:
        return CheckResult(ex.name, False, "needs_gpu",
                           "The CUDA exercise needs nvcc (the CUDA compiler), which this machine lacks, and a CUDA "
                           "GPU to run on; nothing was checked.")
    try:
        if _device.DEVICE == "cuda":
            cuda.build(code)
            return None
        cuda.compile_only(code)
    except cuda.CompileError as error:
        return CheckResult(ex.name, False, "compile_error", f"nvcc rejected the source:\n{error}")
    except Exception as error:  # noqa: BLE001  (a broken toolchain is reported, not raised)
        return CheckResult(ex.name, False, "raised", f"Building the CUDA source failed: {error}")
    return CheckResult(ex.name, False, "needs_gpu",
                       "Compiles with nvcc (-arch=sm_90). Running it needs a CUDA GPU, which this machine lacks; "
                       "on a GPU the checker runs it and diagnoses the output.")


# --- the two small PyTorch exercises -------------------------------------------------------------------------------

def _check_rotate_pair(fn) -> Finding:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 64, dtype=torch.float64, generator=generator)
    theta = (torch.rand(64, dtype=torch.float64, generator=generator) * 2 - 1) * 3.0
    try:
        result = fn(a.clone(), b.clone(), theta.clone())
    except Exception as error:  # noqa: BLE001
        return _raised("01_rotate_pair", error)
    if result is None:
        return Finding("not_solved", "Not yet solved: your function returned None.")
    try:
        out_a, out_b = (torch.as_tensor(t, dtype=torch.float64) for t in result)
    except (TypeError, ValueError):
        return Finding("wrong", "Return two tensors: the turned a and the turned b.")
    expected_a, expected_b = a * torch.cos(theta) - b * torch.sin(theta), b * torch.cos(theta) + a * torch.sin(theta)

    def close(u, v):
        return u.shape == v.shape and bool(((u - v).abs() <= 1e-10).all())

    error = float(max((out_a - expected_a).abs().max(), (out_b - expected_b).abs().max())) \
        if out_a.shape == a.shape and out_b.shape == b.shape else None
    if close(out_a, expected_a) and close(out_b, expected_b):
        return Finding("correct", f"Correct: max |error| = {error:.3g}.", error)
    minus_a, minus_b = a * torch.cos(theta) + b * torch.sin(theta), b * torch.cos(theta) - a * torch.sin(theta)
    if close(out_a, minus_a) and close(out_b, minus_b):
        return Finding("wrong_direction", "Rotation in the wrong direction: your points turn clockwise (by -theta). "
                                          "Counter-clockwise is a' = a cos - b sin, b' = b cos + a sin.", error)
    if close(out_a, expected_b) and close(out_b, expected_a):
        return Finding("wrong", "The two results are swapped: return (turned a, turned b).", error)
    return Finding("wrong", "Not the rotation: for theta = pi/2 the point (1, 0) must go to (0, 1).", error)


def _check_pair_indices(fn) -> Finding:
    for rotary_dim in (8, 12):
        for interleaved in (False, True):
            half = rotary_dim // 2
            pairs = torch.arange(half)
            neox = (pairs, pairs + half)
            gptj = (2 * pairs, 2 * pairs + 1)
            expected, other = (gptj, neox) if interleaved else (neox, gptj)
            call = f"pair_indices({rotary_dim}, interleaved={interleaved})"
            try:
                result = fn(rotary_dim, interleaved)
            except Exception as error:  # noqa: BLE001
                return _raised("01_pair_indices", error)
            if result is None:
                return Finding("not_solved", "Not yet solved: your function returned None.")
            try:
                first, second = (torch.as_tensor(t).to(torch.int64).reshape(-1) for t in result)
            except (TypeError, ValueError, RuntimeError):
                return Finding("wrong", f"{call}: return two integer tensors (first, second).")

            def same(u, v):
                return u.shape == v.shape and bool((u == v).all())

            if same(first, expected[0]) and same(second, expected[1]):
                continue
            name = "GPT-J (interleaved)" if interleaved else "NeoX"
            if same(first, other[0]) and same(second, other[1]):
                return Finding("other_pairing", (
                    f"{call}: you returned the other pairing. {name} pairs channels "
                    + ("(2i, 2i + 1): neighbours." if interleaved else f"(i, i + {half}): the two halves.")))
            if same(first, expected[1]) and same(second, expected[0]):
                return Finding("wrong_direction", (
                    f"{call}: the right pairs in the wrong order (second, first). Rotating (b, a) instead of (a, b) "
                    "turns every pair the other way (-θ)."))
            return Finding("wrong", (
                f"{call} returned first={first.tolist()}, second={second.tolist()}; expected "
                f"first={expected[0].tolist()}, second={expected[1].tolist()}."))
    return Finding("correct", "Correct: both pairings, for rotary_dim 8 and 12 (index maps are exact: error 0).", 0.0)


def describe_diagnoses() -> str:
    return "\n".join(f"{name:22s} {meaning}" for name, meaning in DIAGNOSES.items())
