"""Section 6 of the reliability run: every invalid input raises the documented error, naming its argument, before
any write; a NaN or Inf reaches the two outputs of its rotation pair and nothing else."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ropekit import device as _device
from ropekit.api import apply_rope
from ropekit.frequencies import cos_sin_table

from .common import DTYPE_NAMES, call_backend
from .run import Tally

__all__ = ["Invalid", "INVALID_INPUTS", "run_invalid_input", "nan_propagation", "run_safety"]


def _other_device(device) -> str:
    """A device that is not q's: the CPU next to a GPU; 'meta' next to the CPU (validation needs no data)."""
    return "cpu" if str(device).startswith("cuda") else "meta"


@dataclass(frozen=True)
class Invalid:
    """One invalid call: ``change(valid)`` returns the arguments to override; the call must raise ``error`` whose
    message contains ``words``. ``check_mode``: run with ROPEKIT_CHECK=1 (values inside device tensors)."""

    name: str
    change: Callable[[dict], dict]
    error: type
    words: str
    check_mode: bool = False


def _valid_call(device) -> dict:
    """A valid call (bshd, GQA 4/2 heads, head_dim 32, table of 16 rows) that the table's entries break."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 32, generator=gen).to(device)
    k = torch.randn(2, 3, 2, 32, generator=gen).to(device)
    cos, sin = cos_sin_table(16, 32, device=device)
    return dict(q=q, k=k, cos=cos, sin=sin)


def _thd(v, **extra):
    """The valid call packed as thd (6 tokens in sequences of 2 and 4)."""
    device = v["q"].device
    return dict(q=v["q"].reshape(6, 4, 32), k=v["k"].reshape(6, 2, 32), layout="thd",
                cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32, device=device), max_seqlen=4, **extra)


def _dev(v):
    return v["q"].device


INVALID_INPUTS = [
    # rotary_dim
    Invalid("rotary_dim odd", lambda v: dict(rotary_dim=7), ValueError, "rotary_dim"),
    Invalid("rotary_dim zero", lambda v: dict(rotary_dim=0), ValueError, "rotary_dim"),
    Invalid("rotary_dim negative", lambda v: dict(rotary_dim=-2), ValueError, "rotary_dim"),
    Invalid("rotary_dim > head_dim", lambda v: dict(rotary_dim=64), ValueError, "rotary_dim"),
    Invalid("rotary_dim wider than cos/sin", lambda v: dict(cos=v["cos"][:, :4], sin=v["sin"][:, :4], rotary_dim=16),
            ValueError, "rotary_dim"),
    Invalid("rotary_dim a float", lambda v: dict(rotary_dim=32.0), TypeError, "rotary_dim"),
    Invalid("rotary_dim a bool", lambda v: dict(rotary_dim=True), TypeError, "rotary_dim"),
    # shapes
    Invalid("head_dim of k differs", lambda v: dict(k=v["k"][..., :16]), ValueError, "head_dim"),
    Invalid("q has 3 dims in bshd", lambda v: dict(q=v["q"][0]), ValueError, "q must have 4 dimensions"),
    Invalid("k has 5 dims", lambda v: dict(k=v["k"][None]), ValueError, "k must have 4 dimensions"),
    Invalid("batch of k differs", lambda v: dict(k=v["k"][:1]), ValueError, "k"),
    Invalid("seq of k differs", lambda v: dict(k=v["k"][:, :2]), ValueError, "k"),
    Invalid("seq of k differs (sbhd)", lambda v: dict(layout="sbhd", k=v["k"][:1]), ValueError, "k"),
    Invalid("cos and sin shapes differ", lambda v: dict(sin=v["sin"][:, :8]), ValueError, "cos and sin"),
    Invalid("cos table 1-D", lambda v: dict(cos=v["cos"][:, 0], sin=v["sin"][:, 0]), ValueError, "2-D"),
    Invalid("per-token rows that do not broadcast",
            lambda v: dict(cos=v["cos"][:5].repeat(1, 2), sin=v["sin"][:5].repeat(1, 2), per_token=True),
            ValueError, "broadcast"),
    # dtypes and types
    Invalid("integer q", lambda v: dict(q=v["q"].to(torch.int32)), TypeError, "q must be"),
    Invalid("complex q", lambda v: dict(q=torch.complex(v["q"], v["q"])), TypeError, "q must be"),
    Invalid("bool q", lambda v: dict(q=v["q"] > 0), TypeError, "q must be"),
    Invalid("integer k", lambda v: dict(k=v["k"].to(torch.int64)), TypeError, "k must be"),
    Invalid("q and k dtypes differ", lambda v: dict(k=v["k"].double()), TypeError, "dtype"),
    Invalid("integer cos/sin", lambda v: dict(cos=v["cos"].to(torch.int32), sin=v["sin"].to(torch.int32)),
            TypeError, "cos"),
    Invalid("q is a list", lambda v: dict(q=v["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    Invalid("cos is a list", lambda v: dict(cos=v["cos"].tolist()), TypeError, "cos"),
    Invalid("cos/sin missing", lambda v: dict(cos=None, sin=None), TypeError, "cos"),
    Invalid("both table= and cos/sin", lambda v: dict(table=object()), ValueError, "table"),
    # devices
    Invalid("k on another device", lambda v: dict(k=v["k"].to(_other_device(_dev(v)))), ValueError, "device"),
    Invalid("cos/sin on another device", lambda v: dict(cos=v["cos"].to(_other_device(_dev(v))),
                                                        sin=v["sin"].to(_other_device(_dev(v)))), ValueError, "cos"),
    Invalid("positions on another device",
            lambda v: dict(positions=torch.tensor([1, 2], device=_other_device(_dev(v)))), ValueError, "positions"),
    Invalid("cu_seqlens on another device",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 2, 6], device=_other_device(_dev(v)))),
            ValueError, "cu_seqlens"),
    # positions
    Invalid("int offset beyond the table", lambda v: dict(positions=14), ValueError, "table"),
    Invalid("negative int offset", lambda v: dict(positions=-1), ValueError, "positions"),
    Invalid("positions a bool", lambda v: dict(positions=True), TypeError, "positions"),
    Invalid("positions a float", lambda v: dict(positions=1.5), TypeError, "positions"),
    Invalid("float position tensor", lambda v: dict(positions=torch.zeros(2, device=_dev(v))), TypeError,
            "positions"),
    Invalid("position ids that do not broadcast",
            lambda v: dict(positions=torch.zeros(5, 7, dtype=torch.long, device=_dev(v))), ValueError, "positions"),
    Invalid("3-D position ids", lambda v: dict(positions=torch.zeros(1, 2, 3, dtype=torch.long, device=_dev(v))),
            ValueError, "positions"),
    # layouts, backends, modes
    Invalid("unknown layout", lambda v: dict(layout="bsd"), ValueError, "layout"),
    Invalid("unknown backend", lambda v: dict(backend="rocm"), ValueError, "backend"),
    Invalid("eager_rounding on cuda", lambda v: dict(backend="cuda", eager_rounding=True), ValueError,
            "eager_rounding"),
    Invalid("inplace with requires_grad",
            lambda v: dict(q=v["q"].clone().requires_grad_(), inplace=True), ValueError, "inplace"),
    Invalid("inplace on an expanded (self-overlapping) q",
            lambda v: dict(q=v["q"][:, :, :1].expand(2, 3, 4, 32), inplace=True), RuntimeError, "memory location"),
    Invalid("inplace with k a view of q's heads",
            lambda v: dict(k=v["q"][:, :, 1:3], inplace=True), RuntimeError, "memory location"),
    # varlen
    Invalid("thd without cu_seqlens", lambda v: _thd(v) | dict(cu_seqlens=None), ValueError, "cu_seqlens"),
    Invalid("cu_seqlens with bshd", lambda v: dict(cu_seqlens=torch.tensor([0, 3, 6], device=_dev(v))),
            ValueError, "cu_seqlens"),
    Invalid("float cu_seqlens", lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0., 2., 6.], device=_dev(v))),
            TypeError, "cu_seqlens"),
    Invalid("2-D cu_seqlens",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([[0, 2, 6]], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens"),
    Invalid("negative max_seqlen", lambda v: _thd(v) | dict(max_seqlen=-1), TypeError, "max_seqlen"),
    Invalid("float max_seqlen", lambda v: _thd(v) | dict(max_seqlen=4.0), TypeError, "max_seqlen"),
    Invalid("thd with 4-D q", lambda v: _thd(v) | dict(q=v["q"]), ValueError, "q must have 3 dimensions"),
    Invalid("thd q and k token counts differ", lambda v: _thd(v) | dict(k=v["k"].reshape(6, 2, 32)[:5]),
            ValueError, "tokens"),
    Invalid("thd positions of a wrong length",
            lambda v: _thd(v) | dict(positions=torch.zeros(4, dtype=torch.long, device=_dev(v))), ValueError,
            "positions"),
    Invalid("thd int offset beyond the table", lambda v: _thd(v) | dict(positions=13), ValueError, "table"),
    # values inside device tensors: checked in ROPEKIT_CHECK=1 mode (a host sync, so opt-in)
    Invalid("offsets tensor beyond the table", lambda v: dict(positions=torch.tensor([3, 14], device=_dev(v))),
            ValueError, "table", check_mode=True),
    Invalid("position ids beyond the table",
            lambda v: dict(positions=torch.tensor([[0, 1, 16]] * 2, device=_dev(v))), ValueError, "table",
            check_mode=True),
    Invalid("negative position ids", lambda v: dict(positions=torch.tensor([[0, -1, 2]] * 2, device=_dev(v))),
            ValueError, "positions", check_mode=True),
    Invalid("cu_seqlens decreasing",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("cu_seqlens not starting at 0",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([1, 2, 6], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("cu_seqlens not ending at the token count",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("max_seqlen shorter than the longest sequence", lambda v: _thd(v) | dict(max_seqlen=3), ValueError,
            "max_seqlen", check_mode=True),
    Invalid("varlen offsets beyond the table",
            lambda v: _thd(v) | dict(positions=torch.tensor([0, 13], device=_dev(v))), ValueError, "table",
            check_mode=True),
]


@contextlib.contextmanager
def _env(name: str, value: Optional[str]):
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def run_invalid_input(case: Invalid, *, inplace: bool, device=None) -> list[str]:
    """Make the invalid call (in place or not); it must raise ``case.error`` naming ``case.words`` and leave q and k
    bitwise unchanged. Returns what went wrong."""
    device = device or _device.DEVICE
    args = _valid_call(device)
    args["inplace"] = inplace
    args.update(case.change(args))
    tensors = {name: args[name] for name in ("q", "k") if isinstance(args.get(name), torch.Tensor)}
    before = {name: (torch.view_as_real(t) if t.is_complex() else t).detach().clone() for name, t in tensors.items()
              if t.device.type != "meta"}
    problems = []
    with _env("ROPEKIT_CHECK", "1" if case.check_mode else None):
        try:
            apply_rope(**args)
            problems.append(f"no error raised (expected {case.error.__name__} naming {case.words!r})")
        except case.error as error:
            if case.words.lower() not in str(error).lower():
                problems.append(f"{case.error.__name__} raised, but its message does not name {case.words!r}: "
                                f"{error}")
        except Exception as error:  # noqa: BLE001
            problems.append(f"raised {type(error).__name__} instead of {case.error.__name__}: {error}")
    for name, saved in before.items():
        now = tensors[name]
        now = torch.view_as_real(now) if now.is_complex() else now
        if not torch.equal(now.detach(), saved):
            problems.append(f"{name} was modified by the failed call")
    return problems


def nan_propagation(backend: str = "triton", *, dtype: torch.dtype = torch.float32, interleaved: bool = False,
                    rotary_dim: int = 48, head_dim: int = 64, device=None) -> list[str]:
    """One NaN in q and one Inf in k (inside the rotary part), one NaN in q's tail: each reaches exactly the outputs
    of its own rotation pair (or only itself in the tail); every other element equals the clean run bit for bit."""
    device = device or _device.DEVICE
    gen = torch.Generator().manual_seed(1)
    b, s, hq, hk = 2, 5, 3, 2
    q = torch.randn(b, s, hq, head_dim, generator=gen).to(dtype).to(device)
    k = torch.randn(b, s, hk, head_dim, generator=gen).to(dtype).to(device)
    cos, sin = cos_sin_table(16, rotary_dim, device=device)
    kw = dict(positions=torch.tensor([0, 3], device=device), interleaved=interleaved, rotary_dim=rotary_dim,
              backend=backend)
    clean_q, clean_k = call_backend(lambda: apply_rope(q, k, cos, sin, **kw))
    half = rotary_dim // 2

    def partner(channel):
        if channel >= rotary_dim:
            return channel
        if interleaved:
            return channel ^ 1
        return channel + half if channel < half else channel - half

    spots = {"q": [((1, 0, 2, 5), float("nan")), ((0, 3, 1, rotary_dim + 3), float("nan"))],
             "k": [((0, 0, 1, rotary_dim - 1), float("inf")), ((1, 4, 0, 0), float("-inf"))]}
    dirty = {"q": q.clone(), "k": k.clone()}
    for name, entries in spots.items():
        for index, value in entries:
            dirty[name][index] = value
    with warnings.catch_warnings():
        # NaN/Inf in, NaN out is what this run asks for: the interpreter's NumPy arithmetic reports it as a
        # RuntimeWarning (a GPU reports nothing), which would only clutter the run's output.
        warnings.simplefilter("ignore", RuntimeWarning)
        out_q, out_k = call_backend(lambda: apply_rope(dirty["q"], dirty["k"], cos, sin, **kw))
    problems = []
    for name, out, clean in (("q", out_q, clean_q), ("k", out_k, clean_k)):
        expected_bad = torch.zeros(out.shape, dtype=torch.bool)
        for (bi, si, hi, c), _ in spots[name]:
            expected_bad[bi, si, hi, c] = expected_bad[bi, si, hi, partner(c)] = True
        expected_bad = expected_bad.to(device)
        bad = ~torch.isfinite(out)
        if not torch.equal(bad, expected_bad):
            problems.append(f"{name}: non-finite outputs at {torch.nonzero(bad).tolist()}, expected exactly "
                            f"{torch.nonzero(expected_bad).tolist()}")
        if not torch.equal(out[~expected_bad], clean[~expected_bad]):
            problems.append(f"{name}: finite outputs changed by a NaN/Inf elsewhere")
    return problems


def run_safety(backends=("triton",), device=None) -> dict:
    """Section 6: every invalid input (in place and out of place) and NaN/Inf containment per backend."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    invalid, nan = Tally(), Tally()
    table = []
    for case in INVALID_INPUTS:
        outcome = {}
        for inplace in (False, True):
            mode = "in-place" if inplace else "out-of-place"
            problems = run_invalid_input(case, inplace=inplace, device=device)
            invalid.record(f"{case.name} ({mode})", "api", lambda: problems)
            outcome[mode] = "ok" if not problems else "; ".join(problems)
        table.append({"input": case.name, "error": case.error.__name__, "names": case.words,
                      "check_mode": case.check_mode, **outcome})
    nan_rows = []
    for backend in backends:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for interleaved in (False, True):
                label = f"{DTYPE_NAMES[dtype]} {'gptj' if interleaved else 'neox'}"
                problems = nan.record(label, backend, lambda: nan_propagation(backend, dtype=dtype,
                                                                              interleaved=interleaved, device=device))
                nan_rows.append({"backend": backend, "case": label, "ok": None if problems is None else not problems})
    return {"invalid_inputs": {"cases": len(INVALID_INPUTS), "calls": 2 * len(INVALID_INPUTS), **invalid.as_dict(),
                               "table": table},
            "nan_inf": {**nan.as_dict(), "rows": nan_rows},
            "checked": invalid.checked + nan.checked, "failed": invalid.failed + nan.failed,
            "seconds": round(time.perf_counter() - start, 1)}
