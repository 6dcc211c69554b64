"""Section 1 of the reliability run: seeded random configurations against the float64 reference, and what each
one checks (outputs, untouched inputs, nothing written outside the views, the partial-rotary tail, gradients)."""

from __future__ import annotations

import time
from typing import Optional

import torch

from ropekit import device as _device
from ropekit.api import apply_rope
from ropekit.testing import check_close_to_reference

from .build import build_case, expected_output
from .common import DTYPES, Unsupported, call_backend, tensor_summary
from .configs import CPU_SCALE, GPU_SCALE, Config, Scale, coverage
from .generate import generate_configs
from .run import Tally, run_jobs

__all__ = ["run_config", "property_job", "run_property"]


def run_config(cfg: Config, backend: str = "triton", device=None) -> list[str]:
    """Run one configuration on ``backend`` and return what went wrong (empty list: it passed).

    Checked: outputs vs the float64 reference (``ropekit.testing`` bound); out of place: inputs untouched, output
    contiguous with the input's shape, the partial-rotary tail copied bit for bit; in place: the result lands in q/k,
    nothing outside the views is written, the tail is untouched; backward: gradients vs the reference's VJP.
    Raises :class:`Unsupported` when the backend says NotImplementedError.
    """
    device = device or _device.DEVICE
    f = cfg.family
    case = build_case(cfg, device)
    operands = [("q", case.q)] + ([("k", case.k)] if case.k is not None else [])
    storages = {id(op.storage): op.storage for _, op in operands}  # packed q/k share one
    if f.backward:
        for storage in storages.values():
            storage.requires_grad_()
    inputs = {name: op.tensor() for name, op in operands}
    if f.backward:
        for x in inputs.values():
            x.retain_grad()
    storage_before = {key: storage.detach().clone() for key, storage in storages.items()}
    values_before = {name: x.detach().clone() for name, x in inputs.items()}
    expected = {name: expected_output(cfg, case, x) for name, x in inputs.items()}
    out_q, out_k = call_backend(lambda: apply_rope(inputs["q"], inputs.get("k"), case.cos, case.sin, backend=backend,
                                            **case.kwargs))
    outputs = {"q": out_q, "k": out_k}
    failures = []
    if case.k is None and out_k is not None:
        failures.append("k is None but k_out is not")
    rd = f.rotary_dim
    for name, op in operands:
        out, x = outputs[name], inputs[name]
        message = check_close_to_reference(out, expected[name], DTYPES[f.dtype])
        if message:
            failures.append(f"{name}: {message}")
        if f.inplace:
            if out.data_ptr() != x.data_ptr():
                failures.append(f"{name}: in-place output is not the input tensor")
            if rd < f.head_dim and not torch.equal(x.detach()[..., rd:], values_before[name][..., rd:]):
                failures.append(f"{name}: in-place call changed the tail past rotary_dim")
        else:
            if tuple(out.shape) != tuple(x.shape) or not out.is_contiguous():
                failures.append(f"{name}: output {tensor_summary(out)} is not a contiguous {tuple(x.shape)}")
            elif rd < f.head_dim and not torch.equal(out.detach()[..., rd:], x.detach()[..., rd:]):
                failures.append(f"{name}: the tail past rotary_dim was not copied bit for bit")
    for key, storage in storages.items():
        if f.inplace:
            # Put the original values back into the views: anything written outside them then shows.
            probe = storage.detach().clone()
            for name, op in operands:
                if id(op.storage) == key:
                    op.view(probe).copy_(values_before[name])
            if not torch.equal(probe, storage_before[key]):
                views = [tensor_summary(x) for x in inputs.values()]
                failures.append(f"in-place call wrote outside the views {views}")
        elif not torch.equal(storage.detach(), storage_before[key]):
            failures.append("out-of-place call modified its input")
    if f.backward and not failures:
        grads = {}
        if f.backward == "sum":  # Transformer Engine's first loss: the gradient arrives as an expanded scalar
            loss = sum(outputs[name].sum() for name, _ in operands) * 2
        else:
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            for name, _ in operands:
                grads[name] = torch.randn(outputs[name].shape, generator=gen).to(outputs[name].dtype).to(device)
            loss = sum((outputs[name] * grads[name]).sum() for name, _ in operands)
        call_backend(loss.backward)
        for name, _ in operands:
            x = inputs[name]
            grad_out = grads.get(name, torch.full(x.shape, 2.0, dtype=x.dtype))
            if x.grad is None:
                failures.append(f"{name}: no gradient reached the input")
                continue
            message = check_close_to_reference(x.grad, expected_output(cfg, case, grad_out, backward=True),
                                               DTYPES[f.dtype])
            if message:
                failures.append(f"{name}.grad: {message}")
    return failures


def property_job(cfg: Config, backends) -> dict:
    """A worker job: ``cfg`` on each backend -> {backend: failure messages, or "unsupported: why"}."""
    result = {}
    for backend in backends:
        try:
            result[backend] = run_config(cfg, backend)
        except Unsupported as why:
            result[backend] = f"unsupported: {why}"
        except Exception as error:  # noqa: BLE001 - a crash fails this configuration only
            result[backend] = [f"raised {type(error).__name__}: {error}"]
    return result


def run_property(count: int, *, seed: int = 0, backends=("triton",), scale: Optional[Scale] = None,
                 n_families: int = 48, variant_quota: Optional[int] = 4, workers: int = 1,
                 budget_s: Optional[float] = None, device=None) -> dict:
    """Section 1: ``count`` random configurations on every backend (each forward, some backward)."""
    device = device or _device.DEVICE
    scale = scale or (CPU_SCALE if _device.INTERPRET else GPU_SCALE)
    start = time.perf_counter()
    configs, stats = generate_configs(count, seed=seed, scale=scale, n_families=n_families,
                                      variant_quota=None if _device.INTERPRET else variant_quota, device=device)
    generated = time.perf_counter()
    families = {}
    groups = [families.setdefault(cfg.family, len(families)) for cfg in configs]  # a family's variants: one worker
    outcomes = run_jobs([(property_job, cfg, tuple(backends), {}) for cfg in configs], groups, workers, budget_s)
    tally = Tally()
    for cfg, outcome in zip(configs, outcomes):
        tally.add_outcomes(cfg.describe(), outcome)
    return {"configs": len(configs) - tally.not_run, "planned": len(configs), "backends": list(backends),
            **tally.as_dict(), "generator": stats,
            "with_backward": sum(bool(c.family.backward) for c in configs), "coverage": coverage(configs),
            "workers": workers, "seconds_generating": round(generated - start, 1),
            "seconds": round(time.perf_counter() - start, 1)}
