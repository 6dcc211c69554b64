"""``python -m ropekit check``: run every kernel available here against the float64 reference and tabulate.

Each row: a kernel, how many configurations it ran, the worst error relative to the bound of
``ropekit.testing`` (<= 1.0 passes), and a verdict. Sizes are small under the interpreter, real on a GPU. The native
backend (PyTorch ops, the default without a GPU) has rows of its own; the Triton rows say where the kernels ran.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass

import torch

from . import device, reference
from .frequencies import cos_sin_table
from .testing import check_close_to_reference

__all__ = ["CheckRow", "run_checks", "format_table"]


@dataclass
class CheckRow:
    kernel: str
    configs: int
    passed: int
    note: str

    @property
    def ok(self) -> bool:
        return self.configs > 0 and self.passed == self.configs


def _shapes():
    if device.INTERPRET:
        return [(2, 7, 4, 2, 64)]
    return [(2, 7, 4, 2, 64), (4, 1024, 32, 8, 128)]


def _single_tensor_kernel(name: str, launch, dtypes, layouts) -> CheckRow:
    """v1..v3 launchers rotate one tensor at positions 0..S-1, NeoX pairing."""
    configs = passed = 0
    failures = []
    for (b, s, h, _, d), dtype, layout in itertools.product(_shapes(), dtypes, layouts):
        cos, sin = cos_sin_table(max(s, 16), d, device=device.DEVICE)
        x = torch.randn(b, s, h, d, device=device.DEVICE).to(dtype)
        if layout == "transposed":  # a (b, h, s, d) buffer seen through a (b, s, h, d) view
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        out = launch(x, cos, sin)
        message = check_close_to_reference(out, reference.rope(x, reference.token_positions(b, s)))
        configs += 1
        passed += message is None
        if message:
            failures.append(f"{dtype} {layout}: {message}")
    return CheckRow(name, configs, passed, failures[0] if failures else "matches the float64 reference")


def _fused_ops(name: str, backend: str) -> CheckRow:
    """qk_norm_rope and rope_and_cache (paged, slot -1) on ``backend``, against the float64 references."""
    from .fused import qk_norm_rope, rope_and_cache

    configs = passed = 0
    failures = []
    for (b, s, hq, hk, d), dtype in itertools.product(_shapes(), (torch.float32, torch.bfloat16)):
        cos, sin = cos_sin_table(4096, d, device=device.DEVICE)
        q = torch.randn(b, s, hq, d, device=device.DEVICE).to(dtype)
        k = torch.randn(b, s, hk, d, device=device.DEVICE).to(dtype)
        w = 1 + 0.1 * torch.randn(d, device=device.DEVICE)
        ids = torch.randint(0, 4096, (b, s))
        slots = torch.randperm(b * s)
        unwritten, slots[0] = int(slots[0]), -1  # token 0 writes nothing: its row must stay zero
        k_cache = torch.zeros(b * s, 1, hk, d, device=device.DEVICE, dtype=dtype)
        with device.set_backend(backend):
            out_q, _ = qk_norm_rope(q, k, cos, sin, w, w, positions=ids.to(device.DEVICE))
            _, out_k = rope_and_cache(q, k, None, cos, sin, k_cache=k_cache, slot_mapping=slots.to(device.DEVICE),
                                      positions=ids.to(device.DEVICE), write_k=True)
        rotated_k = reference.rope_table(k, cos, sin, ids)
        written = slots >= 0
        for label, out, want in (
                ("qk_norm_rope", out_q, reference.rope_table(reference.rms_norm(q, w, eps=1e-6), cos, sin, ids)),
                ("rope_and_cache k", out_k, rotated_k),
                ("rope_and_cache cache", k_cache[slots[written], 0], rotated_k.flatten(0, 1)[written])):
            message = check_close_to_reference(out, want, dtype)
            configs += 1
            passed += message is None
            if message:
                failures.append(f"{label} {dtype}: {message}")
        configs += 1
        passed += not bool(k_cache[unwritten].any())
        if k_cache[unwritten].any():
            failures.append(f"rope_and_cache {dtype}: slot -1 wrote to the cache")
    return CheckRow(name, configs, passed, failures[0] if failures else "matches the float64 reference")


def _api_kernel(name: str, backend: str) -> CheckRow:
    from .api import apply_rope

    configs = passed = 0
    failures = []
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    for (b, s, hq, hk, d), dtype, interleaved, rotary_dim, positions in itertools.product(
            _shapes(), dtypes, (False, True), ("full", "partial"), ("none", "offsets", "ids")):
        rd = d if rotary_dim == "full" else d // 2
        cos, sin = cos_sin_table(4096, rd, device=device.DEVICE)
        q = torch.randn(b, s, hq, d, device=device.DEVICE).to(dtype)
        k = torch.randn(b, s, hk, d, device=device.DEVICE).to(dtype)
        if positions == "none":
            arg, pos = None, reference.token_positions(b, s)
        elif positions == "offsets":
            offsets = torch.randint(0, 2048, (b,))
            arg, pos = offsets.to(device.DEVICE), reference.token_positions(b, s, offsets=offsets)
        else:
            ids = torch.randint(0, 4096, (b, s))
            arg, pos = ids.to(device.DEVICE), ids
        out_q, out_k = apply_rope(q, k, cos, sin, positions=arg, interleaved=interleaved, rotary_dim=rd,
                                  backend=backend)
        for out, x in ((out_q, q), (out_k, k)):
            message = check_close_to_reference(out, reference.rope(x, pos, rotary_dim=rd, interleaved=interleaved))
            configs += 1
            passed += message is None
            if message:
                failures.append(f"{dtype} interleaved={interleaved} {rotary_dim} {positions}: {message}")
    return CheckRow(name, configs, passed, failures[0] if failures else "matches the float64 reference")


def run_checks() -> list[CheckRow]:
    rows = [_api_kernel("native (apply_rope backend='native')", "native"),
            _fused_ops("native fused ops (qk_norm_rope, rope_and_cache)", "native")]
    if device.INTERPRETER_MISSING:
        return rows + [CheckRow("triton v1-v4, fused", 0, 0, f"skipped: {device.INTERPRETER_MISSING}")] + \
            _cuda_rows()
    where = " in the interpreter" if device.INTERPRET else ""
    ladder = [
        ("triton v1", "v1", "rope_v1", (torch.float32,), ("contiguous",)),
        ("triton v2", "v2", "rope_v2", (torch.float32, torch.bfloat16, torch.float16), ("contiguous", "transposed")),
        ("triton v3", "v3", "rope_v3", (torch.float32, torch.bfloat16, torch.float16), ("contiguous", "transposed")),
    ]
    for label, module, fn, dtypes, layouts in ladder:
        try:
            launch = getattr(importlib.import_module(f"ropekit.triton.{module}"), fn)
        except (ImportError, AttributeError) as error:
            rows.append(CheckRow(label, 0, 0, f"not available: {error}"))
            continue
        rows.append(_single_tensor_kernel(label + where, launch, dtypes, layouts))
    rows.append(_api_kernel(f"triton v4{where} (apply_rope backend='triton')", "triton"))
    rows.append(_fused_ops(f"triton fused kernel{where} (qk_norm_rope, rope_and_cache)", "triton"))
    return rows + _cuda_rows()


def _cuda_rows() -> list[CheckRow]:
    rows = []
    try:
        from .cuda import available as cuda_available

        ok, why = cuda_available()
    except ImportError as error:
        ok, why = False, str(error)
    if ok:
        rows.append(_api_kernel("cuda (apply_rope backend='cuda')", "cuda"))
    else:
        rows.append(CheckRow("cuda (apply_rope backend='cuda')", 0, 0, f"skipped: {why}"))
    return rows


def format_table(rows: list[CheckRow]) -> str:
    width = max(len(r.kernel) for r in rows)
    lines = [f"{'kernel'.ljust(width)}  configs  passed  verdict  note", "-" * (width + 60)]
    for r in rows:
        verdict = "PASS" if r.ok else ("skip" if r.configs == 0 else "FAIL")
        lines.append(f"{r.kernel.ljust(width)}  {r.configs:7d}  {r.passed:6d}  {verdict:7s}  {r.note}")
    return "\n".join(lines)
