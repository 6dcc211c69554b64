"""ropekit.reliability.safety: every invalid input raises its documented error before any write, and NaN/Inf stay
inside their rotation pair."""

import warnings

import pytest
import torch

from ropekit.reliability import safety
from ropekit.reliability.common import available_backends
from conftest import DEVICE

BACKENDS = available_backends()[0]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", safety.INVALID_INPUTS, ids=[c.name.replace(" ", "-") for c in safety.INVALID_INPUTS])
def test_invalid_input_raises_documented_error_before_any_write(case, inplace):
    assert safety.run_invalid_input(case, inplace=inplace, device=DEVICE) == []


def test_a_call_that_does_not_raise_is_reported():
    valid = safety.Invalid("not invalid at all", lambda v: {}, ValueError, "anything")
    assert safety.run_invalid_input(valid, inplace=False, device=DEVICE)[0].startswith("no error raised")
    wrong_words = safety.Invalid("rotary_dim odd", lambda v: dict(rotary_dim=7), ValueError, "cu_seqlens")
    assert "does not name 'cu_seqlens'" in safety.run_invalid_input(wrong_words, inplace=False, device=DEVICE)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_nan_and_inf_stay_inside_their_rotation_pair(dtype, interleaved, backend):
    assert safety.nan_propagation(backend, dtype=dtype, interleaved=interleaved, device=DEVICE) == []


def test_the_nan_and_inf_run_prints_no_warning():
    """The run feeds NaN and Inf on purpose: NumPy's warnings about them (under the interpreter) stay out of the
    stress output."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert safety.nan_propagation("triton") == []
    assert [str(w.message) for w in caught] == []
