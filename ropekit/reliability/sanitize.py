"""The driver that compute-sanitizer runs (``tools/sanitize.sh``): every kernel once on shapes that exercise its
masks and tails, each result checked against the float64 reference (the fused ops' checks live in
:mod:`ropekit.reliability.sanitize_fused`).

``python -m ropekit stress --sanitize-driver`` prints one line per launch (``ok``, ``skip`` or ``FAIL``) and exits 0
when everything ran and matched.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ropekit import device as _device
from ropekit import reference as ref
from ropekit.api import apply_rope
from ropekit.frequencies import cos_sin_table, inverse_frequencies
from ropekit.positions import SCALAR_OFFSET, PositionSpec, resolve_positions
from ropekit.testing import check_close_to_reference

from .build import BuiltCase, build_case, expected_output
from .common import DTYPES, Unsupported, available_backends, to_bshd
from .configs import Config, Family
from .kernels import FlatConfig, TileConfig, plan_rope, rope_v4
from ropekit.triton import choice
from ropekit.triton.model import DeviceFacts, rope_candidates
from .properties import run_config
from .sanitize_fused import (CACHE_ADDRESS_MAPS, FUSED_ANGLES, NORM_PLACES, QUANTISED_CACHES, check_cache_address_map,
                             check_fused_angles, check_fused_nope, check_norm, check_quantised_cache)

__all__ = ["sanitize_configs", "reachable_configs", "run_with_launch_config", "sanitize_driver", "CACHE_ADDRESS_MAPS",
           "check_cache_address_map", "QUANTISED_CACHES", "NORM_PLACES"]


def sanitize_configs() -> list[Config]:
    """Shapes that exercise every mask and tail of v4 / CUDA: non-power-of-two head_dim and pair counts, partial
    rotary with a masked tail, head and token blocks with remainders, GQA, k None, in place, varlen with empty and
    uneven sequences, per-token rows, misaligned storage, every dtype, backward (conjugate). Tables have exactly
    the rows needed, so any read past them is outside the allocation."""
    F, C = Family, Config
    return [
        C(F(layout="bshd", dtype="fp32", head_dim=80, rotary_dim=80, heads="gqa"), 1, 2, 37, (), 6, 2),
        C(F(layout="sbhd", view="sliced", view_dim=0, dtype="bf16", head_dim=40, rotary_dim=24, interleaved=True,
            positions="offsets"), 2, 3, 19, (), 5, 1, pad=8, span=50),
        C(F(layout="bhsd", view="transposed", perm=(0, 2, 3, 1), dtype="fp16", head_dim=96, rotary_dim=64,
            positions="ids", inplace=True), 3, 2, 21, (), 3, 3, span=70),
        C(F(layout="bshd", view="misaligned", dtype="bf16", head_dim=128, rotary_dim=128, positions="int",
            heads="mqa"), 4, 3, 33, (), 7, 1, offset=5),
        C(F(layout="bshd", view="misaligned", dtype="fp16", head_dim=128, rotary_dim=64, interleaved=True,
            positions="ids-1d", heads="none"), 5, 2, 17, (), 9, 0, span=30),
        C(F(layout="bshd", dtype="fp32", head_dim=256, rotary_dim=128, positions="per-token", cos_dtype="bf16",
            cos_shape="shared", backward="full"), 6, 2, 13, (), 3, 1, span=40),
        C(F(layout="bshd", dtype="fp64", head_dim=48, rotary_dim=48, interleaved=True, positions="offsets-0d",
            backward="sum"), 7, 2, 9, (), 2, 2, span=9),
        C(F(layout="bshd", dtype="bf16", head_dim=128, rotary_dim=128, positions="offsets", heads="gqa"),
          8, 5, 1, (), 12, 3, span=90),  # decode: one token per sequence
        C(F(layout="bshd", dtype="bf16", head_dim=64, rotary_dim=64), 9, 2, 0, (), 4, 2),  # empty sequence
        C(F(layout="thd", dtype="bf16", head_dim=80, rotary_dim=80, positions="offsets", max_seqlen="larger",
            heads="gqa"), 10, 0, 0, (5, 0, 1, 23, 2), 4, 2, span=40),
        C(F(layout="thd", view="transposed", perm=(1, 0, 2), dtype="fp16", head_dim=64, rotary_dim=32,
            interleaved=True, positions="ids", cu_dtype="int64"), 11, 0, 0, (7, 3, 11), 3, 1, span=60),
        C(F(layout="thd", dtype="fp32", head_dim=128, rotary_dim=128, positions="per-token", backward="full"),
          12, 0, 0, (4, 9), 2, 2, span=20),
        C(F(layout="bshd", view="packed", dtype="bf16", head_dim=128, rotary_dim=64, positions="offsets",
            heads="gqa", inplace=True), 13, 3, 11, (), 8, 2, span=30),  # q, k, v heads of one fused buffer
        C(F(layout="bshd", dtype="fp32", head_dim=80, rotary_dim=80, positions="ids", backward="full"),
          14, 3, 7, (), 3, 3, span=40),  # q and k of one shape: the paired flat path, forward and conjugate
    ]


def _ladder_launchers() -> list:
    """v1..v3 launchers ``rope_vN(x, cos, sin)`` (positions 0..S-1, NeoX) with the inputs each one accepts:
    (name, launcher or None, why not, dtypes, views, head_dim). v1 takes contiguous fp32 and power-of-two head_dim
    only (no channel masks); v2/v3 get head_dim 80 (40 pairs in a block of 64: masked)."""
    import importlib

    ladder = []
    for name, dtypes, views, head_dim in (("v1", ("fp32",), ("contiguous",), 64),
                                          ("v2", ("fp32", "bf16", "fp16"), ("contiguous", "transposed"), 80),
                                          ("v3", ("fp32", "bf16", "fp16"), ("contiguous", "transposed"), 80)):
        try:
            launch = getattr(importlib.import_module(f"ropekit.triton.{name}"), f"rope_{name}")
        except (ImportError, AttributeError) as error:
            ladder.append((name, None, str(error), (), (), head_dim))
            continue
        ladder.append((name, launch, "", dtypes, views, head_dim))
    return ladder


# H100 SXM figures as published, for choosing candidates where no GPU is present (the interpreter's tests)
_PUBLISHED_H100 = DeviceFacts("H100 SXM (published)", n_sms=132, ceiling_gbps=3350.0, latency_ns=600.0,
                              latency_source="assumed")


def reachable_configs(cfg: Config, device=None, limit: int | None = None) -> list:
    """Every launch configuration the choice can pick for ``cfg``'s call on this device: the model's candidates for
    the call's shape and the device's facts (the autotune picks among them, the disk cache holds only them).
    Under the interpreter, an H100's as published. ``limit``: the first ``limit`` (the model's own choice first)."""
    device = device or _device.DEVICE
    case = build_case(cfg, device, values=False)
    q = case.q.tensor()
    k = case.k.tensor() if case.k is not None else None
    plan = _plan(cfg, case, q, k, conjugate=False)
    if plan is None:
        return []
    facts = _PUBLISHED_H100 if _device.INTERPRET else choice.device_facts(device)
    return rope_candidates(facts, plan.shape)[:limit]


def _kernel_arguments(cfg: Config, case: BuiltCase, q: torch.Tensor, k: Optional[torch.Tensor],
                      conjugate: bool) -> dict:
    """The launcher's arguments for the configuration's tensors: (batch, seq, heads, head_dim) views, or (tokens,
    heads, head_dim) for thd, and fresh outputs (out of place) or the inputs (in place)."""
    f, kwargs = cfg.family, case.kwargs
    cu_seqlens = kwargs.get("cu_seqlens")
    max_seqlen = kwargs.get("max_seqlen")
    if f.varlen:
        max_seqlen = max(cfg.lengths, default=0) if max_seqlen is None else max_seqlen
        token_shape = (q.shape[0],)
        batch, seqlen = cu_seqlens.shape[0] - 1, q.shape[0]
    else:
        q, k = to_bshd(q, f.layout), (None if k is None else to_bshd(k, f.layout))
        batch, seqlen = q.shape[0], q.shape[1]
        token_shape = (batch, seqlen)
    if f.inplace:
        out_q, out_k = q, k
    else:
        out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        out_k = None if k is None else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    cos, sin = case.cos, case.sin
    if f.per_token:
        cos, sin = cos.expand(*token_shape, cos.shape[-1]), sin.expand(*token_shape, sin.shape[-1])
        spec = PositionSpec(SCALAR_OFFSET, 0, None, cu_seqlens, max_seqlen if f.varlen else None)
    else:
        spec = resolve_positions(batch=batch, seqlen=seqlen, positions=kwargs["positions"], cu_seqlens=cu_seqlens,
                                 max_seqlen=max_seqlen if f.varlen else None, device=q.device)
    return dict(q=q, k=k, cos=cos, sin=sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=f.rotary_dim,
                interleaved=f.interleaved, conjugate=conjugate, cos_per_token=f.per_token, copy_tail=not f.inplace)


def _plan(cfg: Config, case: BuiltCase, q, k, conjugate: bool):
    arguments = _kernel_arguments(cfg, case, q, k, conjugate)
    return plan_rope(arguments.pop("q"), arguments.pop("k"), arguments.pop("cos"), arguments.pop("sin"), **arguments)


def _launch_forced(cfg: Config, case: BuiltCase, q: torch.Tensor, k: Optional[torch.Tensor], conjugate: bool,
                   config: TileConfig | FlatConfig) -> tuple:
    """Launch Triton v4 on the configuration's tensors with ``config`` forced; returns the outputs as the kernel
    sees them."""
    arguments = _kernel_arguments(cfg, case, q, k, conjugate)
    rope_v4(arguments.pop("q"), arguments.pop("k"), arguments.pop("cos"), arguments.pop("sin"), config=config,
            **arguments)
    return arguments["out_q"], arguments["out_k"]


def run_with_launch_config(cfg: Config, config: TileConfig | FlatConfig, device=None) -> list[str]:
    """Run ``cfg`` through Triton v4 with the launch configuration ``config`` forced, forward and (for a
    configuration with a backward) the conjugate rotation the backward launches; returns what differs from the
    float64 reference."""
    device = device or _device.DEVICE
    f = cfg.family
    failures = []
    for backward in ((False, True) if f.backward else (False,)):
        case = build_case(cfg, device)  # afresh each time: an in-place launch overwrites its inputs
        q = case.q.tensor()
        k = case.k.tensor() if case.k is not None else None
        expected = {name: to_bshd(expected_output(cfg, case, x, backward=backward), f.layout)
                    for name, x in (("q", q), ("k", k)) if x is not None}
        outputs = dict(zip("qk", _launch_forced(cfg, case, q, k, f.conjugate != backward, config)))
        for name, want in expected.items():
            message = check_close_to_reference(outputs[name], want, DTYPES[f.dtype])
            if message:
                failures.append(f"{name}{' (conjugate)' if backward else ''}: {message}")
    return failures


class _DriverLog:
    """One line per launch (``ok``, ``skip`` or ``FAIL``), and the count of each."""

    def __init__(self, verbose: bool):
        self.verbose, self.ran, self.problems = verbose, 0, 0

    def say(self, line: str) -> None:
        if self.verbose:
            print(line, flush=True)

    def check(self, label: str, run: Callable[[], object], device) -> None:
        """``run()`` returns failure messages (a list or a string; empty: passed); any exception is a failure,
        except :class:`Unsupported`, which is a skip."""
        try:
            messages = run()
            if device == "cuda":
                torch.cuda.synchronize()
        except Unsupported as reason:
            self.say(f"skip  {label}: unsupported ({reason})")
            return
        except Exception as exc:  # noqa: BLE001 - report and keep going: the sanitizer wants every kernel
            messages = f"raised {type(exc).__name__}: {exc}"
        if messages:
            self.problems += 1
            self.say(f"FAIL  {label}: {messages}")
        else:
            self.ran += 1
            self.say(f"ok    {label}")


def _check_ladder(launch, x: torch.Tensor, device) -> Optional[str]:
    b, s = x.shape[:2]
    cos, sin = cos_sin_table(s, x.shape[-1], device=device)  # exactly s rows
    return check_close_to_reference(launch(x, cos, sin), ref.rope(x, ref.token_positions(b, s)))


def _check_out_of_table(backend: str, device) -> str:
    """Positions beyond the table: the kernel must mask the loads (NaN out), never read past the table."""
    q = torch.randn(2, 5, 3, 80, device=device)
    cos, sin = cos_sin_table(8, 80, device=device)
    out, _ = apply_rope(q, None, cos, sin, positions=torch.tensor([[0, 1, 7, 8, 1000]] * 2, device=device),
                        backend=backend)
    ok = bool(torch.isfinite(out[:, :3]).all()) and bool(torch.isnan(out[:, 3:]).all())
    return "" if ok else "tokens past the table are not NaN (or tokens inside it are not finite)"


def _check_table_free(backend: str, device) -> str:
    """Angles without a table: partial rotary of a non-power-of-two pair count (masked frequency loads), GQA, a
    frequency vector of exactly rotary_dim/2 entries (a read past it is outside the allocation), packed sequences
    with an empty one, positions up to 1e7."""
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
    q, k = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device)
    ids = torch.randint(0, 10_000_000, (12,))
    inv_freq = inverse_frequencies(48).to(device)
    out_q, out_k = apply_rope(q, k, inv_freq=inv_freq, scale=0.9, positions=ids.to(device), layout="thd",
                              cu_seqlens=cu, max_seqlen=7, backend=backend)
    for out, x in ((out_q, q), (out_k, k)):
        problem = check_close_to_reference(out, ref.rope(x, ids, rotary_dim=48, attention_scaling=0.9))
        if problem:
            return problem
    return ""


def _check_mrope(backend: str, device, interleaved: bool) -> str:
    """M-RoPE chosen in the kernel: packed sequences with an empty one, partial rotary of a non-power-of-two pair
    count (24 pairs of 40 channels), GQA, strided (3, tokens) ids, a table of exactly the rows the ids reach (a read
    past it is outside the allocation) and one id past it (masked: NaN, never read)."""
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
    q, k = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device)
    ids = torch.randint(0, 30, (3, 24))[:, ::2]
    ids[:, 3] = 29
    section = [8, 8, 8] if interleaved else [4, 10, 10]
    cos, sin = cos_sin_table(30, 48, device=device)
    out_q, out_k = apply_rope(q, k, cos, sin, positions=ids.to(device), layout="thd", cu_seqlens=cu, max_seqlen=7,
                              mrope_section=section, mrope_interleaved=interleaved, backend=backend)
    for out, x in ((out_q, q), (out_k, k)):
        problem = check_close_to_reference(out, ref.mrope(x, ids, section, mrope_interleaved=interleaved,
                                                          rotary_dim=48))
        if problem:
            return problem
    past = ids.clone()
    past[2, 6] = 30  # the width position of token 6
    out_q, _ = apply_rope(q, None, cos, sin, positions=past.to(device), layout="thd", cu_seqlens=cu, max_seqlen=7,
                          mrope_section=section, mrope_interleaved=interleaved, backend=backend)
    pairs = ref.mrope_pair_positions(torch.arange(3)[:, None], section, mrope_interleaved=interleaved)[0] == 2
    spoiled = torch.cat((pairs, pairs, torch.zeros(32, dtype=torch.bool)))  # NeoX: both channels of a width pair
    nan = torch.isnan(out_q).cpu()
    if not (nan[6] == spoiled).all() or nan[:6].any() or nan[7:].any():
        return "an M-RoPE position past the table did not spoil exactly its own pairs"
    return ""


def _check_nope(backend: str, device) -> str:
    """Llama 4's NoPE layer: packed sequences with an empty one, a non-power-of-two head_dim (80: masked channel
    loads), GQA, k copied (out of place) and never touched (in place), positions across several temperatures."""
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
    q, k = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device)
    offsets = torch.tensor([0, 7, 8185])
    kw = dict(positions=offsets.to(device), layout="thd", cu_seqlens=cu, max_seqlen=7, nope_temperature=(4, 0.1),
              backend=backend)
    out_q, out_k = apply_rope(q, k, **kw)
    problem = check_close_to_reference(out_q, ref.nope_temperature(q, ref.varlen_positions(cu, offsets=offsets),
                                                                   4, 0.1))
    if problem or not torch.equal(out_k, k):
        return problem or "k was not copied bit for bit"
    k_before = k.clone()
    apply_rope(q, k, inplace=True, **kw)
    return "" if torch.equal(k, k_before) else "in place, k was written"


def _check_cuda_table(fast: bool) -> str:
    from ropekit.cuda import cos_sin_table_cuda

    cos, sin = cos_sin_table_cuda(1003, 80, 500000.0, fast=fast)
    torch.cuda.synchronize()
    return "" if cos.shape == (1003, 40) and bool(torch.isfinite(cos).all()) else "bad table"


def sanitize_driver(device=None, verbose: bool = True, candidates: int | None = None) -> int:
    """Run every kernel once on mask-and-tail shapes (what compute-sanitizer watches), the Triton backend once more
    with each configuration its launch choice can reach (``candidates``: only the first that many a call). Returns 0
    when everything ran and matched the reference, 1 otherwise; prints one line per launch."""
    device = device or _device.DEVICE
    backends, why = available_backends()
    log = _DriverLog(verbose)
    for name, launch, error, dtypes, views, d in _ladder_launchers():
        if launch is None:
            log.say(f"skip  triton {name}: not available ({error})")
            continue
        for dtype in dtypes:
            for view in views:
                # 37 tokens and 3 heads: remainders in every token and head block (5 tokens under the interpreter,
                # where v1/v2 run one Python program per row)
                x = torch.randn(2, 37 if device == "cuda" else 5, 3, d, device=device).to(DTYPES[dtype])
                if view == "transposed":
                    x = x.transpose(1, 2).contiguous().transpose(1, 2)
                log.check(f"triton {name} {dtype} {view} {tuple(x.shape)}",
                          lambda launch=launch, x=x: _check_ladder(launch, x, device), device)
    for backend in backends:
        for cfg in sanitize_configs():
            log.check(f"{backend} {cfg.describe()}", lambda cfg=cfg: run_config(cfg, backend, device), device)
        if backend == "triton":
            # every configuration the launch choice can reach for the call, each forced once
            for cfg in sanitize_configs():
                for config in reachable_configs(cfg, device, candidates):
                    log.check(f"triton {cfg.describe()} config={config}",
                              lambda cfg=cfg, config=config: run_with_launch_config(cfg, config, device), device)
        log.check(f"{backend} out-of-table position ids (masked loads)", lambda: _check_out_of_table(backend, device),
                  device)
        if backend != "cuda":  # (the CUDA backend takes tables only)
            log.check(f"{backend} table-free angles (thd, partial rotary, GQA, positions < 1e7)",
                      lambda: _check_table_free(backend, device), device)
            log.check(f"{backend} NoPE temperature (thd, head_dim 80, GQA, k copied / untouched)",
                      lambda: _check_nope(backend, device), device)
            for interleaved in (False, True):
                log.check(f"{backend} M-RoPE {'interleaved' if interleaved else 'contiguous'} sections (thd, "
                          "partial rotary, GQA, strided ids, a table of the rows they reach)",
                          lambda interleaved=interleaved: _check_mrope(backend, device, interleaved), device)
    with _device.set_backend("triton"):
        for address, kv_layout, fp8 in CACHE_ADDRESS_MAPS:
            log.check(f"triton fused cache write: {address} {kv_layout}{' float8' if fp8 else ''}",
                      lambda a=address, layout=kv_layout, fp8=fp8: check_cache_address_map(a, layout, fp8, device),
                      device)
    if "triton" in backends:
        for cache_dtype, scales in QUANTISED_CACHES:
            log.check(f"triton fused quantising store {cache_dtype} scales={scales} (head_dim 80, partial rotary, "
                      f"QK-norm, 3 kv heads)", lambda cache_dtype=cache_dtype, scales=scales:
                      check_quantised_cache(cache_dtype, scales, device), device)
        for weighted in (False, True):
            log.check(f"triton fused norm after the rotation{' with weights' if weighted else ''} (thd, head_dim 80, "
                      f"partial rotary, GQA, paged cache, backward)",
                      lambda weighted=weighted: check_norm(device, "after", weighted), device)
        for place in NORM_PLACES:
            log.check(f"triton fused norm across all heads {place} the rotation with weights (thd, head_dim 80, "
                      f"partial rotary, GQA, paged cache, backward)",
                      lambda place=place: check_norm(device, place, True, "heads"), device)
        for name, section, interleaved in FUSED_ANGLES:
            log.check(f"triton fused {name} (thd, head_dim 80, partial rotary, GQA, paged k and v cache, "
                      f"qk_norm_rope backward)", lambda section=section, interleaved=interleaved:
                      check_fused_angles(device, section, interleaved), device)
        log.check("triton fused NoPE layer (thd, head_dim 80, GQA, paged float8 cache, float8 q)",
                  lambda: check_fused_nope(device), device)
    if "cuda" in backends:
        for fast in (False, True):  # the table kernel (fast=True: the course's float32-angle variant)
            log.check(f"cuda table kernel fast={fast} (1003 rows, rotary_dim 80)", lambda fast=fast:
                      _check_cuda_table(fast), device)
    else:
        log.say(f"skip  cuda backend: {why}")
    log.say(f"sanitize driver: {log.ran} launches ok, {log.problems} problems")
    return 1 if log.problems else 0
