"""Sections 4, 5 and 7 of the reliability run: a tensor past 2**31 elements, bitwise determinism and invariance,
and numerics at long context."""

from __future__ import annotations

import math
import time

import torch

from ropekit import device as _device
from ropekit import reference as ref
from ropekit.api import apply_rope
from ropekit.frequencies import cos_sin_table, inverse_frequencies
from ropekit.testing import check_close_to_reference

from .build import full_width
from .common import DTYPE_NAMES, TO_BSHD, Unsupported, call_backend, to_bshd
from .run import Tally

__all__ = ["run_large", "run_determinism", "LONG_POSITIONS", "run_long_context"]


def run_large(backends=("triton",), *, numel: int = 2_200_000_000, heads: int = 32, head_dim: int = 128,
              dtype: torch.dtype = torch.bfloat16, device=None) -> dict:
    """Section 4: q of ``numel`` elements (past 2**31 by default) as (2, seq, heads, head_dim); spot-check the first,
    middle and last tokens, and the tokens around element 2**31, against the reference."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    batch = 2
    seqlen = -(-numel // (batch * heads * head_dim))
    shape = (batch, seqlen, heads, head_dim)
    total = math.prod(shape)
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    cos, sin = cos_sin_table(seqlen, head_dim, device=device)
    per_token = heads * head_dim
    boundary_token = (2**31 // per_token)  # flat token index holding element 2**31
    spots = {"first": (0, 0), "middle": (0, seqlen // 2), "last": (batch - 1, seqlen - 1)}
    if total > 2**31:
        b, s = divmod(boundary_token, seqlen)
        spots["element 2**31"] = (b, s)
    tally = Tally()
    rows, outputs = [], {}
    for backend in backends:
        def check(backend=backend):
            try:
                out, _ = apply_rope(q, None, cos, sin, backend=backend)
            except NotImplementedError as why:
                raise Unsupported(str(why)) from None
            messages = []
            for name, (b, s) in spots.items():
                lo, hi = max(0, s - 2), min(seqlen, s + 3)  # a few tokens around each spot
                expected = ref.rope(q[b:b + 1, lo:hi], ref.token_positions(1, hi - lo, offsets=lo))[0]
                message = check_close_to_reference(out[b, lo:hi], expected)
                rows.append({"backend": backend, "spot": name, "batch": b, "tokens": [lo, hi], "ok": message is None})
                if message:
                    messages.append(f"{name}: {message}")
            if bool(torch.isnan(out).any()):
                messages.append("NaN in the output")
            outputs[backend] = out
            return messages
        tally.record(f"q {shape}", backend, check)
    cross = None
    if len(outputs) == 2:
        a, b = outputs.values()
        cross = bool(torch.equal(a, b))
    result = {"shape": list(shape), "numel": total, "past_2_31": total > 2**31, "dtype": DTYPE_NAMES[dtype],
              "spots": rows, "backends_bitwise_equal": cross, **tally.as_dict(),
              "seconds": round(time.perf_counter() - start, 1)}
    q = outputs = None  # free the large tensors before the next section
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def run_determinism(backends=("triton",), *, repeats: int = 100, batch: int = 64, seqlen: int = 256,
                    heads: tuple = (8, 2), head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                    device=None) -> dict:
    """Section 5: bitwise reproducibility and invariance. Each check is a row {check, backend, bitwise_equal}; a
    row that is not equal is a failure (except the informational triton-vs-cuda row)."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    hq, hk = heads
    q = torch.randn(batch, seqlen, hq, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
    k = torch.randn(batch, seqlen, hk, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
    cos, sin = cos_sin_table(4 * seqlen, head_dim, device=device)
    offsets = torch.randint(0, 3 * seqlen, (batch,), generator=gen, device=device)
    grad = torch.randn(q.shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    rows, tally, first_by_backend = [], Tally(), {}

    def row(check, backend, a, b, *, counted=True, note=""):
        equal = bool(torch.equal(a, b))
        diff = 0.0 if equal else float((a.double() - b.double()).abs().max())
        rows.append({"check": check, "backend": backend, "bitwise_equal": equal, "max_abs_diff": diff, "note": note})
        if counted:
            tally.add(check, backend, [] if equal else [f"not bitwise equal (max |diff| {diff:.3g})"])

    def rope(x, kk=None, **kw):
        return apply_rope(x, kk, cos, sin, **kw)

    def checks(backend):
        bk = dict(backend=backend)
        first_q, first_k = rope(q, k, positions=offsets, **bk)
        first_by_backend[backend] = first_q
        first = torch.cat((first_q.flatten(), first_k.flatten()))
        differing = None  # the first repeat that differs, if any
        for _ in range(repeats - 1):
            again = torch.cat([t.flatten() for t in rope(q, k, positions=offsets, **bk)])
            if differing is None and not torch.equal(again, first):
                differing = again
        row(f"{repeats} repeated forward runs (q and k)", backend, first if differing is None else differing, first)
        x = q.detach().clone().requires_grad_()
        first_grad, differing = None, None
        for _ in range(repeats):
            x.grad = None
            rope(x, None, positions=offsets, **bk)[0].backward(grad)
            if first_grad is None:
                first_grad = x.grad
            elif differing is None and not torch.equal(x.grad, first_grad):
                differing = x.grad
        row(f"{repeats} repeated backward runs", backend, first_grad if differing is None else differing, first_grad)
        # batch of 1 (a contiguous copy) vs the same sequence inside the batch
        for j in sorted({0, batch // 2, batch - 1}):
            alone_q, alone_k = rope(q[j:j + 1].clone(), k[j:j + 1].clone(), positions=offsets[j:j + 1], **bk)
            row(f"batch of 1 vs batch of {batch}: sequence {j}, q and k", backend,
                torch.cat((alone_q[0].flatten(), alone_k[0].flatten())),
                torch.cat((first_q[j].flatten(), first_k[j].flatten())))
        # prefill (positions 0..S-1) vs decoding one token with its position given as an offset
        prefill_q, _ = rope(q, k, **bk)
        for t in sorted({0, 1, seqlen // 2, seqlen - 1}):
            step = q[:, t:t + 1].clone()
            by_tensor, _ = rope(step, None, positions=torch.full((batch,), t, device=device), **bk)
            row(f"prefill vs decode: token {t}, offsets tensor", backend, by_tensor[:, 0], prefill_q[:, t])
            by_int, _ = rope(step, None, positions=t, **bk)
            row(f"prefill vs decode: token {t}, int offset", backend, by_int[:, 0], prefill_q[:, t])
        # KV-cache decode: every sequence at its own position, vs the same token inside a prefill
        lengths = torch.randint(0, seqlen, (batch,), generator=gen, device=device)
        every = torch.arange(batch, device=device)
        decode_q, _ = rope(q[every, lengths][:, None], None, positions=lengths, **bk)
        row("KV-cache decode (per-sequence positions) vs prefill", backend, decode_q[:, 0], prefill_q[every, lengths])
        # layouts: the same values stored as sbhd / bhsd, or packed as thd
        for layout in ("sbhd", "bhsd"):
            out, _ = rope(q.permute(TO_BSHD[layout]).contiguous(), None, positions=offsets, layout=layout, **bk)
            row(f"bshd vs {layout}", backend, to_bshd(out, layout), first_q)
        cu = torch.arange(0, batch * seqlen + 1, seqlen, device=device, dtype=torch.int32)
        try:
            out, _ = rope(q.reshape(batch * seqlen, hq, head_dim), None, positions=offsets.reshape(-1, 1), layout="thd",
                          cu_seqlens=cu, max_seqlen=seqlen, **bk)
            row("bshd vs thd (packed)", backend, out.reshape(q.shape), first_q)
        except NotImplementedError as why:
            rows.append({"check": "bshd vs thd (packed)", "backend": backend, "bitwise_equal": None,
                         "max_abs_diff": 0.0, "note": f"unsupported: {why}"})
        # q alone vs q and k in one launch (other head blocks in the grid); in place vs out of place
        alone, _ = rope(q, None, positions=offsets, **bk)
        row("q alone vs q with k in one launch", backend, alone, first_q)
        in_place = q.clone()
        rope(in_place, None, positions=offsets, inplace=True, **bk)
        row("in place vs out of place", backend, in_place, first_q)

    for backend in backends:
        try:
            checks(backend)
        except Exception as error:  # noqa: BLE001 - a crash is one failure; the other backend still runs
            tally.add("determinism", backend, [f"raised {type(error).__name__}: {error}"])
    if len(first_by_backend) == 2:
        row("triton vs cuda, same inputs (informational: two compilers may contract multiply-adds differently)",
            "both", *first_by_backend.values(), counted=False)
    return {"shape_q": [batch, seqlen, hq, head_dim], "heads_k": hk, "dtype": DTYPE_NAMES[dtype],
            "repeats": repeats, "rows": rows, **tally.as_dict(), "seconds": round(time.perf_counter() - start, 1)}


LONG_POSITIONS = (0, 1, 1000, 32_000, 131_072, 500_000, 999_999, 1_000_000)


def run_long_context(backends=("triton",), *, rotary_dim: int = 128, heads: int = 4, bases=(500000.0, 1e6),
                     positions=LONG_POSITIONS, device=None) -> dict:
    """Section 7: rotate tokens at positions up to 1e6 through the float64-angle table (ours) and through a table
    whose angles are formed in float32 (``position.float() * inv_freq.float()``, then cos/sin: the common approach,
    handed to the same kernel as per-token rows); both against the float64 reference. Errors are max |out - ref|
    over inputs with |x| ~ 1, per position."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    rows, tally = [], Tally()
    gen = torch.Generator().manual_seed(2)
    pos = torch.tensor(positions, dtype=torch.int64)
    x = torch.randn(1, len(positions), heads, rotary_dim, generator=gen).to(device)
    for base in bases:
        inv_freq = inverse_frequencies(rotary_dim, base)
        cos, sin = cos_sin_table(int(pos.max()) + 1, rotary_dim, base=base, device=device)
        # the common approach: float32 angles, float32 cos/sin (what a float32 arange * inv_freq table holds)
        angle32 = pos.to(device, torch.float32)[:, None] * inv_freq.to(device, torch.float32)[None, :]
        cos32, sin32 = full_width(torch.cos(angle32), False)[None], full_width(torch.sin(angle32), False)[None]
        expected = ref.rope(x, pos[None], base=base)
        theta64 = ref.angles(pos, inv_freq)
        table_error = {
            "float64 angles (ropekit table)": (cos[pos.to(device)].double().cpu() - torch.cos(theta64)).abs().amax(-1),
            "float32 angles": (cos32[0, :, :rotary_dim // 2].double().cpu() - torch.cos(theta64)).abs().amax(-1),
        }
        for backend in backends:
            outs = {}

            def run(backend=backend):
                outs["ropekit"], _ = call_backend(lambda: apply_rope(x, None, cos, sin, positions=pos[None].to(device),
                                                              backend=backend))
                outs["fp32"], _ = call_backend(lambda: apply_rope(x, None, cos32, sin32, per_token=True,
                                                                  backend=backend))
                message = check_close_to_reference(outs["ropekit"], expected)
                return [f"base {base:g}: {message}"] if message else []
            tally.record(f"base {base:g}", backend, run)
            if not outs:
                continue
            err_ours = (outs["ropekit"].double().cpu() - expected).abs().amax(dim=(0, 2, 3))
            err_fp32 = (outs["fp32"].double().cpu() - expected).abs().amax(dim=(0, 2, 3))
            for i, p in enumerate(positions):
                rows.append({"base": base, "backend": backend, "position": int(p),
                             "table_cos_error_float64_angles": float(table_error["float64 angles (ropekit table)"][i]),
                             "table_cos_error_float32_angles": float(table_error["float32 angles"][i]),
                             "output_error_ropekit": float(err_ours[i]), "output_error_float32_angles":
                                 float(err_fp32[i])})
    fp32_eps = torch.finfo(torch.float32).eps
    return {"positions": list(positions), "bases": list(bases), "rotary_dim": rotary_dim, "rows": rows,
            "fp32_eps": fp32_eps, **tally.as_dict(), "seconds": round(time.perf_counter() - start, 1)}
