"""The accuracy bound every test and notebook uses to compare a kernel's output with the float64 reference.

* float32 / float64 outputs: elementwise ``|out - ref| <= 1e-5 * max|ref|`` and ``||out - ref|| / ||ref|| <= 1e-5``.
* float16 / bfloat16 outputs: the math runs in fp32 and is rounded once, so every element must lie within **one ulp of
  the output dtype at |ref|** (half an ulp for the final rounding, the rest for fp32 math and the float32 table),
  plus 1e-6 * max|ref| for elements near zero whose pair cancels.
"""

from __future__ import annotations

import torch

__all__ = ["ulp", "check_close_to_reference", "assert_close_to_reference"]


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` numbers at ``|values|`` (float64), floored at the smallest normal's spacing."""
    info = torch.finfo(dtype)
    magnitude = values.abs().to(torch.float64).clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * info.eps


def _nonfinite_mismatch(out64: torch.Tensor, ref64: torch.Tensor) -> str | None:
    """Where ``ref`` holds NaN or ±Inf, ``out`` must hold exactly the same; elsewhere it must be finite.
    (``ref64`` here is the reference rounded to the output dtype: a value past that dtype's range is its infinity.)"""
    out_nan, ref_nan = torch.isnan(out64), torch.isnan(ref64)
    if not torch.equal(out_nan, ref_nan):
        where = torch.nonzero(out_nan != ref_nan)[0]
        index = tuple(int(i) for i in where)
        return (f"NaN where the reference has none or the other way round ({int((out_nan != ref_nan).sum())} "
                f"elements; unwritten or out-of-table positions?); first at {index}: "
                f"out={float(out64[index]):.8g} ref={float(ref64[index]):.8g}")
    out_inf, ref_inf = torch.isinf(out64), torch.isinf(ref64)
    same_inf = torch.equal(out_inf, ref_inf) and torch.equal(out64[ref_inf], ref64[ref_inf])
    if not same_inf:
        index = tuple(int(i) for i in torch.nonzero((out_inf != ref_inf) | (ref_inf & (out64 != ref64)))[0])
        return (f"infinities differ from the reference; first at {index}: out={float(out64[index]):.8g} "
                f"ref={float(ref64[index]):.8g}")
    return None


def check_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> str | None:
    """None when ``out`` meets the bound above for ``dtype`` (default: out's dtype), else a message saying where not.

    Non-finite reference values are compared exactly (NaN where the reference is NaN, the same infinities); the
    bound's scale and the norms are taken over the finite elements only, so one NaN cannot make the check vacuous.
    """
    dtype = out.dtype if dtype is None else dtype
    # Compare where the output lives: a GPU checks millions of elements in milliseconds (the same arithmetic).
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        return f"shape {tuple(out64.shape)} != reference shape {tuple(ref64.shape)}"
    if out64.numel() == 0:
        return None
    message = _nonfinite_mismatch(out64, ref64.to(dtype).to(torch.float64))
    if message is not None:
        return message
    finite = torch.isfinite(ref64.to(dtype))
    out64, ref64 = out64[finite], ref64[finite]
    if ref64.numel() == 0:
        return None
    error = (out64 - ref64).abs()
    scale = float(ref64.abs().max())
    if dtype in (torch.float32, torch.float64):
        bound = torch.full_like(ref64, 1e-5 * scale)
        rel = float(torch.linalg.vector_norm(out64 - ref64) / max(float(torch.linalg.vector_norm(ref64)), 1e-300))
        if rel > 1e-5:
            return f"relative norm error {rel:.3g} > 1e-5"
    else:
        bound = ulp(ref64, dtype) + 1e-6 * scale
    bad = error > bound
    if bad.any():
        at = int(torch.nonzero(bad)[0])
        index = tuple(int(i) for i in torch.nonzero(finite)[at])
        return (f"{int(bad.sum())} of {bad.numel()} finite elements beyond the {dtype} bound; first at {index}: "
                f"out={float(out64[at]):.8g} ref={float(ref64[at]):.8g} bound={float(bound[at]):.3g}")
    return None


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    message = check_close_to_reference(out, ref, dtype)
    assert message is None, message
