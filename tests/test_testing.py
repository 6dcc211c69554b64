"""Spec for ropekit.testing: the accuracy check passes the right answer and fails wrong ones, NaN/Inf included."""

import pytest
import torch

from ropekit.testing import assert_close_to_reference, check_close_to_reference

DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in
          (torch.float64, torch.float32, torch.float16, torch.bfloat16)]


def reference(with_nonfinite: bool) -> torch.Tensor:
    ref = torch.randn(4, 3, 8, dtype=torch.float64)
    if with_nonfinite:
        ref[0, 0, 0] = float("nan")
        ref[1, 2, 3] = float("inf")
        ref[2, 1, 5] = float("-inf")
    return ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_nonfinite", [False, True], ids=["finite", "nan-inf"])
def test_the_reference_rounded_to_the_dtype_passes(dtype, with_nonfinite):
    ref = reference(with_nonfinite)
    assert check_close_to_reference(ref.to(dtype), ref) is None


WRONG = {
    "3x": lambda ref: ref * 3,
    "zeros": torch.zeros_like,
    "one-element-off": lambda ref: ref.index_put((torch.tensor([3]), torch.tensor([0]), torch.tensor([1])),
                                                 ref[3, 0, 1] + 0.5),
    "nan-moved": lambda ref: torch.where(torch.isnan(ref), 0.0, ref).index_put(
        (torch.tensor([3]), torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"), dtype=ref.dtype)),
    "nan-everywhere": lambda ref: torch.full_like(ref, float("nan")),
    "inf-sign-flipped": lambda ref: torch.where(torch.isinf(ref), -ref, ref),
    "extra-inf": lambda ref: ref.index_put((torch.tensor([3]), torch.tensor([2]), torch.tensor([2])),
                                           torch.tensor(float("inf"), dtype=ref.dtype)),
}


NEEDS_NONFINITE = {"inf-sign-flipped"}  # changes nothing in a finite reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_nonfinite", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_output_fails(dtype, with_nonfinite, wrong):
    if wrong in NEEDS_NONFINITE and not with_nonfinite:
        return
    ref = reference(with_nonfinite)
    out = WRONG[wrong](ref.clone()).to(dtype)
    message = check_close_to_reference(out, ref)
    assert message is not None
    with pytest.raises(AssertionError):
        assert_close_to_reference(out, ref)


def test_the_scale_comes_from_finite_values_only():
    ref = reference(True)
    out = ref.clone()
    out[torch.isfinite(ref)] *= 1.01  # 1% off: far beyond fp32's bound, whatever a NaN would do to the scale
    assert "relative norm error" in check_close_to_reference(out.float(), ref)


def test_a_value_beyond_the_dtype_range_may_round_to_infinity():
    ref = torch.tensor([1e39, -1e39, 1.0], dtype=torch.float64)  # past float32's range: its infinities
    assert check_close_to_reference(ref.float(), ref) is None
    assert check_close_to_reference(torch.tensor([1e38, -1e38, 1.0]), ref) is not None


def test_shape_mismatch_and_empty():
    assert "shape" in check_close_to_reference(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.float64))
    assert check_close_to_reference(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64)) is None
