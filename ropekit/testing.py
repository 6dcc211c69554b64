"""The accuracy bound every test and notebook uses to compare a kernel's output with the float64 reference.

* float32 / float64 outputs: elementwise ``|out - ref| <= 1e-5 * max|ref|`` and ``||out - ref|| / ||ref|| <= 1e-5``.
* float16 / bfloat16 outputs: the math runs in fp32 and is rounded once, so every element must lie within **one ulp of
  the output dtype at |ref|** (half an ulp for the final rounding, the rest for fp32 math and the float32 table),
  plus 1e-6 * max|ref| for elements near zero whose pair cancels.
* NaN and Inf: the output must have NaN exactly where the reference has NaN and the same infinities; the bounds above
  apply to the finite elements, scaled by the finite reference values.
"""

from __future__ import annotations

import torch

__all__ = ["ulp", "check_close_to_reference", "assert_close_to_reference"]


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` numbers at ``|values|`` (float64), floored at the smallest normal's spacing."""
    info = torch.finfo(dtype)
    magnitude = values.abs().to(torch.float64).clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * info.eps


def check_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> str | None:
    """None when ``out`` meets the bound above for ``dtype`` (default: out's dtype), else a message saying where not."""
    dtype = out.dtype if dtype is None else dtype
    # Compare where the output lives: a GPU checks millions of elements in milliseconds (the same arithmetic).
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    if out64.shape != ref64.shape:
        return f"shape {tuple(out64.shape)} != reference shape {tuple(ref64.shape)}"
    # Non-finite values must match exactly (NaN where the reference has NaN, the same infinities); the bound
    # applies to the finite rest, scaled by the finite reference values only (a NaN or Inf there would make every
    # bound NaN or infinite, and a check that cannot fail).
    ref_finite = torch.isfinite(ref64)
    if not torch.equal(torch.isnan(out64), torch.isnan(ref64)):
        extra = int((torch.isnan(out64) & ~torch.isnan(ref64)).sum())
        missing = int((torch.isnan(ref64) & ~torch.isnan(out64)).sum())
        return (f"NaN pattern differs from the reference: {extra} unexpected NaN elements (unwritten or "
                f"out-of-table positions?), {missing} missing")
    infinite = torch.isinf(ref64) | torch.isinf(out64)
    if not torch.equal(out64[infinite], ref64[infinite]):
        return f"infinities differ from the reference at {int((out64[infinite] != ref64[infinite]).sum())} elements"
    if out64.numel() == 0:
        return None
    out64, ref64 = out64[ref_finite], ref64[ref_finite]
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
        index = int(torch.nonzero(bad)[0])
        return (f"{int(bad.sum())} of {bad.numel()} finite elements beyond the {dtype} bound; first (flat) {index}: "
                f"out={float(out64[index]):.8g} ref={float(ref64[index]):.8g} bound={float(bound[index]):.3g}")
    return None


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    message = check_close_to_reference(out, ref, dtype)
    assert message is None, message
