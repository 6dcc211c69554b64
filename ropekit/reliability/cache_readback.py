"""What a cache must hold after a fused write, and why a call must raise (the fuzzer's cache targets,
:mod:`ropekit.reliability.fuzz_cache`): every written slot the float64 reference (within the dtype's bound, or one
spacing of the quantised format; v's bits exactly), every other slot bitwise unchanged, per-(token, head) scales and
NVFP4 block scales as the reference computes them."""

from __future__ import annotations

import torch

from ropekit import reference as ref
from ropekit.testing import check_close_to_reference, ulp

from .cache_args import FP8, INT8
from .fuzz import same_bits

__all__ = ["as_fp8", "refusals", "table_rows", "cache_problems", "scale_problems", "nvfp4_problems"]


def as_fp8(t: torch.Tensor, dtype: torch.dtype = FP8) -> torch.Tensor:
    """A cache's bytes as the float8 values they hold (``dtype``), a cache of any other dtype as it is."""
    return t.view(dtype) if t.dtype == torch.uint8 else t


def _spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One step of the quantised format at ``|values|`` (float64)."""
    return torch.ones_like(values) if dtype == INT8 else ulp(values, dtype)


def refusals(check_mode: bool, positions: torch.Tensor, rows: int, slots: list[int], n_slots: int,
             overlap: bool, outside: bool = False) -> list[str]:
    """Why the call must raise (empty: it must not): check mode's position and slot checks (``slots``: the
    mapping as passed; ``outside``: a contiguous cache's row outside it), in-place overlap."""
    reasons = []
    if check_mode and bool(((positions < 0) | (positions >= rows)).any()):
        reasons.append("check mode: positions outside the table")
    if check_mode and any(s >= n_slots or s < -1 for s in slots):
        reasons.append("check mode: a slot outside the cache")
    if check_mode and len({s for s in slots if s >= 0}) < sum(s >= 0 for s in slots):
        reasons.append("check mode: two tokens name one slot")
    if check_mode and outside:
        reasons.append("check mode: cache_offsets place a sequence outside the cache")
    if overlap:
        reasons.append("in place on overlapping memory")
    return reasons


def table_rows(logical: dict, pos: torch.Tensor, rows: int, per_pair: bool = False) -> list[torch.Tensor]:
    """The float64 cos and sin rows at ``pos`` (shape ``pos.shape + (half,)``), NaN where a position is outside the
    table's ``rows`` (the kernel's documented result there); ``per_pair`` (M-RoPE): ``pos`` holds a position a pair,
    ``(..., half)``, and pair ``i`` reads column ``i`` of its own row."""
    valid = (pos >= 0) & (pos < rows)
    at = (pos.clamp(0, rows - 1), torch.arange(pos.shape[-1])) if per_pair else (pos.clamp(0, rows - 1),)
    return [torch.where(valid if per_pair else valid[..., None], logical[t].to(torch.float64)[at],
                        torch.tensor(float("nan"), dtype=torch.float64)) for t in ("cos", "sin")]


def cache_problems(name: str, after: torch.Tensor, before: torch.Tensor, want: torch.Tensor, slots: list[int],
                   scale, exact: bool) -> list[str]:
    """``after``/``before``: the cache as one row per slot (CPU); ``want``: the float64 rows, one a token;
    ``scale``: with a quantised cache, the scale (a float, or ``scale(slots)``: the written slots' scales, ``(n,
    heads, 1)``), else None."""
    valid = [(t, s) for t, s in enumerate(slots) if 0 <= s < after.shape[0]]
    untouched = torch.ones(after.shape[0], dtype=torch.bool)
    untouched[[s for _, s in valid]] = False
    problems = []
    if not same_bits(after[untouched], before[untouched]):
        problems.append(f"{name}: a slot no token names changed")
    if not valid:
        return problems
    got = after[[s for _, s in valid]]
    expected = want[[t for t, _ in valid]]
    if after.dtype in ref.CACHE_FORMATS:
        fmt = after.dtype
        scale = torch.as_tensor(scale([s for _, s in valid]) if callable(scale) else scale, dtype=torch.float64)
        if exact:  # v (exact in float32): one float32 division, then the format's rounding (saturating)
            quotient32 = (expected.to(torch.float32) / scale.to(torch.float32)).to(torch.float64)
            if not same_bits(got, ref.quantise(quotient32, 1.0, fmt).to(fmt)):
                problems.append(f"{name}: {fmt} values differ from the format's rounding of values / scale")
        else:
            largest = ref.CACHE_FORMATS[fmt][1]
            target = (expected / scale).clamp(-largest, largest)
            got64 = got.to(torch.float64)
            error = (got64 - target).abs()
            ok = (error <= _spacing(target, fmt)) | (torch.isnan(target) & (torch.isnan(got64) | (fmt == INT8)))
            if not bool(ok.all()):
                problems.append(f"{name}: {fmt} values more than one spacing from the reference / scale")
    elif exact:
        if not same_bits(got, expected.to(after.dtype)):
            problems.append(f"{name}: not its values bit for bit")
    else:
        message = check_close_to_reference(got, expected)
        if message is not None:
            problems.append(f"{name}: {message}")
    return problems


def scale_problems(name: str, after: torch.Tensor, before: torch.Tensor, want: torch.Tensor, slots: list[int],
                   dtype: torch.dtype, exact: bool) -> list[str]:
    """A per-(token, head) scale cache (one row a slot, CPU): untouched slots bitwise, each written slot's scales
    the reference's (v's exactly, k's within float32 math)."""
    valid = [(t, s) for t, s in enumerate(slots) if 0 <= s < after.shape[0]]
    untouched = torch.ones(after.shape[0], dtype=torch.bool)
    untouched[[s for _, s in valid]] = False
    problems = [] if same_bits(after[untouched], before[untouched]) else [f"{name}: a slot no token names changed"]
    if valid:
        got = after[[s for _, s in valid]].to(torch.float64)
        expected = ref.token_head_scale(want[[t for t, _ in valid]], dtype)[..., 0]
        if exact and not torch.equal(got, expected):
            problems.append(f"{name}: not max|v| / the format's largest value")
        elif not exact and not torch.allclose(got, expected, rtol=1e-5, atol=0):
            problems.append(f"{name}: more than float32 math from max|k| / the format's largest value")
    return problems


def nvfp4_problems(name: str, after: torch.Tensor, before: torch.Tensor, blocks: torch.Tensor,
                   blocks_before: torch.Tensor, want: torch.Tensor, slots: list[int],
                   global_scale: float) -> list[str]:
    """An NVFP4 cache and its block-scale cache, one row a slot (CPU bytes): untouched slots bitwise; each written
    slot's block scales within one e4m3 step of ``e4m3(amax / (6 global))`` of the float64 values ``want`` (one row
    a token), and the reader's values (e2m1 x block scale x global scale) within half an e2m1 spacing of them at the
    block's scale (saturation at 6 counted; NaN stores 0)."""
    valid = [(t, s) for t, s in enumerate(slots) if 0 <= s < after.shape[0]]
    untouched = torch.ones(after.shape[0], dtype=torch.bool)
    untouched[[s for _, s in valid]] = False
    problems = []
    if not same_bits(after[untouched], before[untouched]) or not same_bits(blocks[untouched],
                                                                        blocks_before[untouched]):
        problems.append(f"{name}: a slot no token names changed (values or block scales)")
    if not valid:
        return problems
    at, expected = [s for _, s in valid], want[[t for t, _ in valid]].to(torch.float64)
    got_blocks = blocks[at].view(FP8).to(torch.float64)
    want_blocks = ref.nvfp4_quantise(expected, global_scale)[1]
    if not bool(((got_blocks - want_blocks).abs() <= ulp(want_blocks, FP8)).all()):
        problems.append(f"{name}: block scales more than one e4m3 step from amax / (6 global)")
    read = ref.nvfp4_dequantise(after[at], blocks[at], global_scale)
    scale = (got_blocks * global_scale).repeat_interleave(16, -1)
    quotient = expected / scale
    error = (read - expected).abs() / scale
    bound = ref.e2m1_spacing(quotient) / 2 + (quotient.abs() - 6).clamp(min=0) + 1e-5 * quotient.abs().clamp(min=1)
    ok = (error <= bound) | (torch.isnan(expected) & (read == 0)) | ((scale == 0) & (read == 0))
    if not bool(ok.all()):
        problems.append(f"{name}: NVFP4 values more than half an e2m1 spacing from the reference")
    return problems
