"""Section 2 of the reliability run: Transformer Engine's fused-rope test matrix (the parameters of its
``test_fused_rope`` and ``test_fused_rope_thd``), checked against the float64 reference."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import torch

from ropekit import device as _device
from ropekit import reference as ref
from ropekit.api import apply_rope
from ropekit.frequencies import cos_sin_table, inverse_frequencies
from ropekit.testing import check_close_to_reference

from .common import DTYPES, Unsupported, from_bshd, tensor_summary, to_bshd
from .run import Tally, run_jobs

__all__ = ["reference_on_device", "TECase", "TE_CU_SEQLENS", "te_cases", "run_te_case", "te_job", "run_te_matrix"]


def reference_on_device(x: torch.Tensor, positions: torch.Tensor, *, rotary_dim: int, interleaved: bool,
                        conjugate: bool = False, base: float = 10000.0) -> torch.Tensor:
    """``ref.rope``'s arithmetic, kept on x's device (for GPU-sized tensors): the float64 angles and cos/sin of
    ``ref.angles`` (computed on the CPU exactly as ``ref.rope`` does) and the pair rotation of ``ref.rotate_pairs``.
    Bit-identical to ``ref.rope`` on the CPU (tested)."""
    theta = ref.angles(positions, inverse_frequencies(rotary_dim, base))[..., None, :]
    cos, sin = torch.cos(theta).to(x.device), torch.sin(theta).to(x.device)
    x64 = x.detach().to(torch.float64)
    rotated = ref.rotate_pairs(x64[..., :rotary_dim], cos, sin, interleaved=interleaved, conjugate=conjugate)
    return torch.cat((rotated, x64[..., rotary_dim:]), dim=-1)


@dataclass(frozen=True)
class TECase:
    """One row of TE's matrix (``test_fused_rope`` / ``test_fused_rope_thd``), loss shapes included."""

    dtype: str
    seq_length: int                   # rows of the cos/sin table (TE's ``emb``); tokens = seq_length - margin
    hidden_size: int                  # head_dim
    rotary_percent: float
    margin: int
    tensor_format: str                # sbhd | bshd | thd
    transpose: Optional[tuple]        # TE's non-contiguous input: storage transposed along these axes
    interleaved: bool
    start_positions: bool
    cu_seqlens: tuple = ()            # thd only

    @property
    def rotary_dim(self) -> int:
        return int(self.hidden_size * self.rotary_percent)

    def describe(self) -> str:
        return (f"{self.tensor_format} {self.dtype} seq{self.seq_length} hidden{self.hidden_size} "
                f"rotary{self.rotary_percent} margin{self.margin} transpose={self.transpose} "
                f"{'gptj' if self.interleaved else 'neox'} start_positions={self.start_positions}")


TE_CU_SEQLENS = (0, 400, 542, 711, 727, 752, 1270, 1426, 1450, 1954, 2044, 2048)  # TE's packed batch


def te_cases(full: bool = True, seq_scale: int = 1) -> list[TECase]:
    """TE's parameter matrix. ``full``: every combination TE runs (its skips applied: start positions need a
    margin); otherwise a seeded slice that still covers every value of every dimension. ``seq_scale`` divides
    the sequence lengths (and the packed lengths) for the interpreter."""
    cases = []
    for dtype in ("fp32", "bf16", "fp16"):
        for seq in (2048, 4096):
            for hidden in (128, 256):
                for rp in (0.5, 1.0):
                    for margin in (0, 10):
                        for fmt in ("sbhd", "bshd"):
                            for transpose in (None, (0, 1), (2, 3)):
                                for interleaved in (True, False):
                                    for start in (True, False):
                                        if margin == 0 and start:
                                            continue  # TE: start positions need table rows beyond the sequence
                                        cases.append(TECase(dtype, seq // seq_scale, hidden, rp, margin, fmt,
                                                            transpose, interleaved, start))
    cu = tuple(round(c / seq_scale) for c in TE_CU_SEQLENS)
    for dtype in ("fp32", "bf16", "fp16"):
        for hidden in (128, 256):
            for rp in (0.5, 1.0):
                for transpose in (None, (1, 2)):
                    for interleaved in (True, False):
                        for start in (True, False):
                            cases.append(TECase(dtype, cu[-1], hidden, rp, 10, "thd", transpose, interleaved, start,
                                                cu))
    if full:
        return cases
    rng = random.Random(0)
    fixed = [c for c in cases if c.tensor_format != "thd"]
    thd = [c for c in cases if c.tensor_format == "thd"]
    chosen = rng.sample(fixed, 12) + rng.sample(thd, 4)
    # make sure every value of every dimension appears at least once
    for attr in ("dtype", "hidden_size", "rotary_percent", "margin", "tensor_format", "transpose", "interleaved",
                 "start_positions"):
        for value in {getattr(c, attr) for c in cases}:
            if not any(getattr(c, attr) == value for c in chosen):
                chosen.append(next(c for c in cases if getattr(c, attr) == value))
    return chosen


def run_te_case(case: TECase, backends=("triton",), *, batch: int = 2, heads: int = 8, seed: int = 0,
                device=None) -> dict:
    """Run one TE row on every backend: forward vs the reference, then both of TE's loss shapes (each gradient vs
    the reference's VJP). Returns {backend: [failure messages]} (or an :class:`Unsupported` where the backend says
    NotImplementedError; any other exception is a failure message)."""
    device = device or _device.DEVICE
    dtype = DTYPES[case.dtype]
    gen = torch.Generator(device=device).manual_seed(seed)
    rd = case.rotary_dim
    cos, sin = cos_sin_table(case.seq_length, rd, device=device)  # TE's emb: seq_length rows
    if case.tensor_format == "thd":
        cu = torch.tensor(case.cu_seqlens, dtype=torch.int32, device=device)
        n_seqs, tokens = len(case.cu_seqlens) - 1, case.cu_seqlens[-1]
        values = torch.randn((tokens, heads, case.hidden_size), generator=gen, device=device).to(dtype)
        starts = torch.randint(0, case.margin, (n_seqs,), generator=gen, device=device, dtype=torch.int32) \
            if case.start_positions else None
        positions = ref.varlen_positions(case.cu_seqlens, offsets=starts.cpu() if starts is not None else 0)
        kwargs = dict(layout="thd", cu_seqlens=cu, max_seqlen=max(b - a for a, b in zip(case.cu_seqlens,
                                                                                        case.cu_seqlens[1:])))
    else:
        tokens = case.seq_length - case.margin
        values = torch.randn((tokens, batch, heads, case.hidden_size), generator=gen, device=device).to(dtype)
        if case.tensor_format == "bshd":
            values = values.transpose(0, 1).contiguous()
        starts = torch.randint(0, case.margin, (batch,), generator=gen, device=device, dtype=torch.int32) \
            if case.start_positions else None
        positions = ref.token_positions(batch, tokens, offsets=starts.cpu() if starts is not None else 0)
        kwargs = dict(layout=case.tensor_format)
    if case.transpose:  # TE: t.transpose(*p).contiguous().transpose(*p) — same values, other strides
        values = values.transpose(*case.transpose).contiguous().transpose(*case.transpose)
    grad_full = torch.randn(values.shape, generator=gen, device=device).to(dtype)

    def expect(x, conjugate=False):
        out = reference_on_device(to_bshd(x, case.tensor_format), positions, rotary_dim=rd,
                                  interleaved=case.interleaved, conjugate=conjugate)
        return from_bshd(out, case.tensor_format)

    want = expect(values)
    want_grad = {"sum": expect(torch.full(values.shape, 2.0, dtype=dtype, device=device), conjugate=True),
                 "full": expect(grad_full, conjugate=True)}
    results = {}
    for backend in backends:
        failures = []
        x = values.detach().clone().requires_grad_()  # clone keeps the (transposed) strides
        try:
            out, _ = apply_rope(x, None, cos, sin, positions=starts, interleaved=case.interleaved, rotary_dim=rd,
                                backend=backend, **kwargs)
            message = check_close_to_reference(out, want, dtype)
            if message:
                failures.append(f"output: {message}")
            if not out.is_contiguous():
                failures.append(f"output is not contiguous: {tensor_summary(out)}")
            for loss_name in ("sum", "full"):
                x.grad = None
                loss = out.sum() * 2 if loss_name == "sum" else (out * grad_full).sum()  # TE's two loss shapes
                loss.backward(retain_graph=loss_name == "sum")
                message = check_close_to_reference(x.grad, want_grad[loss_name], dtype)
                if message:
                    failures.append(f"grad ({loss_name} loss): {message}")
        except NotImplementedError as why:
            results[backend] = Unsupported(str(why))
            continue
        except Exception as error:  # noqa: BLE001 - a crash fails this case, the matrix goes on
            failures.append(f"raised {type(error).__name__}: {error}")
        results[backend] = failures
    return results


def te_job(case: TECase, backends, **options) -> dict:
    """A worker job: one TE row on each backend -> {backend: failure messages, or "unsupported: why"}."""
    return {backend: (f"unsupported: {outcome}" if isinstance(outcome, Unsupported) else outcome)
            for backend, outcome in run_te_case(case, backends, **options).items()}


def run_te_matrix(*, full: bool = True, backends=("triton",), seq_scale: int = 1, batch: int = 2, heads: int = 8,
                  workers: int = 1, budget_s: Optional[float] = None) -> dict:
    """Section 2: TE's matrix; every row counts as two TE cases (one per loss shape), as TE parametrises it."""
    start = time.perf_counter()
    cases = te_cases(full, seq_scale)
    jobs = [(te_job, case, tuple(backends), dict(batch=batch, heads=heads, seed=i)) for i, case in enumerate(cases)]
    kernel_groups = {}  # compile-time values of a row: dtype, head_dim, rotary_dim, pairing
    groups = [kernel_groups.setdefault((c.dtype, c.hidden_size, c.rotary_percent, c.interleaved), len(kernel_groups))
              for c in cases]
    tally = Tally()
    for case, outcome in zip(cases, run_jobs(jobs, groups, workers, budget_s)):
        tally.add_outcomes(case.describe(), outcome)
    ran = len(cases) - tally.not_run
    dimensions = {name: sorted({str(getattr(c, attr)) for c in cases}) for name, attr in (
        ("dtype", "dtype"), ("seq_length (table rows)", "seq_length"), ("hidden (head_dim)", "hidden_size"),
        ("rotary_percent", "rotary_percent"), ("margin", "margin"), ("format", "tensor_format"),
        ("transpose", "transpose"), ("interleaved", "interleaved"), ("start positions", "start_positions"))}
    return {"rows": ran, "planned_rows": len(cases), "te_cases": 2 * ran, "full_matrix": full, "dimensions": dimensions,
            "backends": list(backends),
            "batch": batch, "heads": heads, "seq_lengths": sorted({c.seq_length for c in cases}),
            "formats": dict(Counter(c.tensor_format for c in cases)), **tally.as_dict(), "workers": workers,
            "seconds": round(time.perf_counter() - start, 1)}
