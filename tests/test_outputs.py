"""ropekit.outputs: where a call writes (fresh outputs, the version bump of tensors written in place)."""

import pytest
import torch

from ropekit.outputs import bump_versions, new_output


def test_a_new_output_is_contiguous_in_the_callers_layout_whatever_the_input_strides():
    x = torch.randn(3, 5, 4, 8).transpose(1, 2)  # a strided view
    out = new_output(x)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert out.is_contiguous() and out.data_ptr() != x.data_ptr()


def test_bumping_versions_makes_a_saved_tensor_fail_backward_loudly():
    q = torch.randn(2, 4, requires_grad=True)
    k = torch.randn(2, 4)
    y = q * 2
    z = (y * y).sum()  # saves y for backward
    before = y._version
    with torch.no_grad():
        bump_versions(y, k)
    assert y._version == before + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_inference_tensors_and_an_absent_k_are_left_alone():
    with torch.inference_mode():
        q = torch.randn(2, 4)
    bump_versions(q, None)  # no error: inference tensors carry no version counter to bump
