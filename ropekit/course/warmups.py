"""The three warm-up exercises of notebook 02: their launches, their cases and their checks.

Each warm-up practises one part of the Triton primer on several shapes, with tails (sizes that are not multiples of
the block) and sizes that are not powers of two:

* ``02_warmup_copy`` — pointers, a block of offsets, masks (a copy);
* ``02_warmup_rotate_half`` — a ``tl.constexpr`` declared inside the kernel (transformers' ``rotate_half``);
* ``02_warmup_angles`` — broadcasting with ``[:, None]`` and a 2-D mask (the angle table ``p * inv_freq[i]``).

The output lies in a buffer with padding past its end: poison (NaN) where the kernel must write, canaries in the
padding. A canary that changed is a store out of bounds, poison left is an element never written; then the values are
compared with the expected ones and with the expected ones of a known mistake.

A load without a mask leaves no trace in the output (a masked store throws the stray values away), so under the
Triton interpreter (a CPU machine) the check records every load's addresses and reports lanes that read past an
input; on a GPU it cannot see them and says so. One angle case stores INV_FREQ in float16: Triton multiplies an int32
block by a float16 block in float16, so an angle computed without converting the positions to float32 is rounded to
float16's 11 bits, and the check names that.
"""

from __future__ import annotations

import functools

import torch
import triton

from .. import device as _device
from . import fence, touch
from .diagnose import Finding

__all__ = ["check", "checker", "cases", "launch_copy", "launch_rotate_half", "launch_angles", "COPY_BLOCK",
           "ANGLES_BLOCK_P"]

COPY_BLOCK = 64
ANGLES_BLOCK_P = 16
PAD = 64  # elements of padding after every buffer: a whole stray block lands in it
CANARY = 12345.0

# Hints for compile errors a first kernel meets, found by their message.
_HINTS = (
    ("arange's arguments must be of type tl.constexpr",
     "tl.arange needs compile-time constants. A name computed inside the kernel is an ordinary variable unless you "
     "declare it one: write `HALF: tl.constexpr = D // 2`, not `HALF = D // 2`."),
    ("incompatible", "Two blocks of different shapes met. Broadcasting needs a column (BLOCK_P, 1) and a row "
                     "(1, BLOCK_I): index one with [:, None] and the other with [None, :]."),
    ("shape", "A shape mismatch: check which blocks are columns ([:, None]) and which are rows ([None, :])."),
)


def launch_copy(kernel, src, dst):
    n = src.numel()
    kernel[(triton.cdiv(n, COPY_BLOCK),)](src, dst, n, BLOCK=COPY_BLOCK)


def launch_rotate_half(kernel, x, out):
    kernel[(x.shape[0],)](x, out, D=x.shape[1])


def launch_angles(kernel, inv_freq, out):
    n_positions, n_pairs = out.shape
    kernel[(triton.cdiv(n_positions, ANGLES_BLOCK_P),)](inv_freq, out, n_positions, n_pairs,
                                                         BLOCK_P=ANGLES_BLOCK_P,
                                                         BLOCK_I=triton.next_power_of_2(n_pairs))


def _padded(shape, device, fill=None, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): a contiguous view of ``shape`` at the start of a buffer with PAD more elements."""
    n = 1
    for size in shape:
        n *= size
    if fill is None:
        buffer = torch.randn(n + PAD, generator=generator).to(device)
    else:
        buffer = torch.full((n + PAD,), CANARY, device=device)
        buffer[:n] = fill
    return buffer, buffer[:n].view(shape)


def _copy_cases(device, generator):
    for n in (64, 100, 1, 300):  # one whole block, a tail, a single element, several blocks and a tail
        _, src = _padded((n,), device, generator=generator)
        yield f"n = {n} (BLOCK = {COPY_BLOCK})", (src,), src.clone(), {}


def _rotate_half_cases(device, generator):
    for rows, d in ((3, 8), (5, 16), (1, 64)):
        _, x = _padded((rows, d), device, generator=generator)
        half = d // 2
        expected = torch.cat((-x[:, half:], x[:, :half]), dim=1)
        mistake = torch.cat((x[:, half:], -x[:, :half]), dim=1)
        yield f"{rows} rows of D = {d}", (x,), expected, {"wrong_direction": mistake}


def _angles_cases(device, generator):
    for n_positions, n_pairs, dtype in ((16, 8, torch.float32), (37, 12, torch.float32), (5, 3, torch.float32),
                                        (40, 6, torch.float16)):
        # the frequencies as stored (float16 in the last case); p * inv_freq is exact in float32 for these p
        inv_freq = (10000.0 ** (-torch.arange(n_pairs, dtype=torch.float64) / n_pairs)).to(dtype).double()
        positions = torch.arange(n_positions, dtype=torch.float64)[:, None]
        expected = (positions * inv_freq).float().to(device)
        mistakes = {"position_shift": ((positions + 1) * inv_freq).float().to(device)}
        words = ""
        if dtype == torch.float16:  # int32 * float16 is a float16 product in Triton: rounded to 11 bits
            mistakes["half_precision_math"] = (positions.half() * inv_freq.half()).float().to(device)
            words = ", INV_FREQ stored in float16"
        yield (f"{n_positions} positions x {n_pairs} pairs (BLOCK_P = {ANGLES_BLOCK_P}){words}",
               (inv_freq.to(dtype).to(device),), expected, mistakes)


# name -> (launch, cases, relative tolerance, the inputs' names in the kernel's signature, the output's name)
_SETUPS = {
    "02_warmup_copy": (launch_copy, _copy_cases, 0.0, ("SRC",), "DST"),
    "02_warmup_rotate_half": (launch_rotate_half, _rotate_half_cases, 0.0, ("X",), "OUT"),
    "02_warmup_angles": (launch_angles, _angles_cases, 1e-6, ("INV_FREQ",), "OUT"),
}

_MISTAKES = {
    "wrong_direction": "OUT is cat(x2, -x1): the quarter turn the other way. rotate_half negates the SECOND half and "
                       "puts it first: cat(-x[D/2:], x[:D/2]).",
    "position_shift": "Every angle is that of the next position: (p + 1) * inv_freq. Positions start at 0.",
    "half_precision_math": "Every angle is the float16 product p * inv_freq, rounded to float16's 11 bits: Triton "
                           "multiplies an int32 block by a float16 block in float16. Convert the positions to "
                           "float32 first (positions.to(tl.float32), section 1.5): then the product is float32.",
}

_NOT_ON_GPU = (" (Loads past the end of an input are found only under the Triton interpreter, on a CPU machine: on a "
               "GPU a load without a mask leaves no trace in the output, so check that every load has one.)")


def _raised(error: BaseException) -> Finding:
    stopped = fence.finding(error)
    if stopped is not None:
        return stopped
    text = f"{type(error).__name__}: {error}".strip()
    if len(text) > 1200:
        text = text[:1200] + " ..."
    hint = next((h for key, h in _HINTS if key in text), None)
    return Finding("raised", f"Your kernel raised an exception:\n{text}" + (f"\nHint: {hint}" if hint else ""))


def _stray_loads(recorder, args, out, input_names, output_name) -> Finding | None:
    """Lanes that loaded outside an input's elements (the recording of one run under the interpreter)."""
    touches = touch._attribute(recorder, {**dict(zip(input_names, args)), output_name: out})
    for name, tensor in zip(input_names, args):
        stray = touches.outside_view(name, "load")
        if stray:
            return Finding("load_out_of_bounds", (
                f"{stray} load lane(s) read past the {tensor.numel()} elements of {name}. The output is right only "
                "because the masked store threw those values away; on a GPU such a load reads memory that is not "
                "yours (garbage, or an illegal-address fault at the end of an allocation). Give every load the mask "
                "of the lanes that exist: tl.load(ptr, mask=inside)."))
    if touches.unattributed.get("load"):
        return Finding("load_out_of_bounds", (
            f"{touches.unattributed['load']} load lane(s) read memory outside every tensor of the launch: give every "
            "load the mask of the lanes that exist, tl.load(ptr, mask=inside)."))
    return None


def _finding(run, kernel, args, expected, mistakes, rtol, device, input_names=(), output_name="OUT") -> Finding:
    buffer, out = _padded(tuple(expected.shape), device, fill=float("nan"))
    try:
        if _device.INTERPRET:
            with touch.recording() as recorder:
                run(kernel, *args, out)
        else:
            recorder = None
            run(kernel, *args, out)
    except Exception as error:  # noqa: BLE001  (the reader's error is reported, not raised)
        return _raised(error)
    n = out.numel()
    if not bool((buffer[n:] == CANARY).all()):
        stray = int((buffer[n:] != CANARY).sum())
        return Finding("out_of_bounds", f"{stray} element(s) past the end of {output_name} were written: some lanes "
                                        "stored outside the tensor. Every store needs the mask of the lanes that "
                                        "exist.")
    unwritten = torch.isnan(out)
    if bool(unwritten.all()):
        return Finding("not_solved", f"Not yet solved: the kernel ran but wrote nothing ({output_name} still holds "
                                     "the poison value the checker put there).")
    if bool(unwritten.any()):
        first = tuple(int(i) for i in torch.nonzero(unwritten)[0])
        return Finding("unwritten", f"{int(unwritten.sum())} of {n} elements of {output_name} were never written (the "
                                    f"first at index {first}). Does every program store its own block, with a mask "
                                    "that keeps every lane that exists?")
    error = float((out.double() - expected.double()).abs().max())
    scale = float(expected.double().abs().max()) or 1.0
    if error <= rtol * scale:
        stray = _stray_loads(recorder, args, out, input_names, output_name) if recorder is not None else None
        return stray or Finding("correct", "", error)
    for diagnosis, wrong in mistakes.items():
        if torch.allclose(out.double(), wrong.double(), rtol=max(rtol, 1e-12), atol=0.0):
            return Finding(diagnosis, _MISTAKES[diagnosis], error)
    at = tuple(int(i) for i in torch.nonzero((out.double() - expected.double()).abs() > rtol * scale)[0])
    return Finding("wrong", f"Wrong values, first at index {at}: {float(out[at]):.6g} where {float(expected[at]):.6g} "
                            "was expected.", error)


def cases(name: str, device="cpu", generator=None):
    """The cases :func:`check` runs for warm-up ``name``: (label, the kernel's inputs, the expected output, the known
    mistakes' outputs by diagnosis), as a generator."""
    return _SETUPS[name][1](device, generator or torch.Generator().manual_seed(0))


def check(name: str, kernel) -> Finding:
    """The check of warm-up exercise ``name``: a Finding (the exercise's ``check`` hook, see :func:`checker`)."""
    if not hasattr(kernel, "__getitem__"):
        return Finding("raised", f"Expected a @triton.jit kernel (the template's), got {type(kernel).__name__}.")
    run, _, rtol, input_names, output_name = _SETUPS[name]
    device = _device.DEVICE
    worst = 0.0
    n_cases = 0
    for label, args, expected, mistakes in cases(name, device):
        finding = _finding(run, kernel, args, expected.to(device), mistakes, rtol, device, input_names, output_name)
        if finding.diagnosis != "correct":
            return Finding(finding.diagnosis, f"{finding.message} (case {label})", finding.max_error)
        worst, n_cases = max(worst, finding.max_error or 0.0), n_cases + 1
    note = "" if _device.INTERPRET or name == "02_warmup_rotate_half" else _NOT_ON_GPU
    return Finding("correct", f"Correct on all {n_cases} cases; max |error| {worst:.3g}.{note}", worst)


def checker(name: str):
    """``check(code) -> Finding`` for warm-up ``name``: the hook its Exercise entry carries."""
    return functools.partial(check, name)
