"""ropekit.layouts: every layout's view as (batch, seq, heads, head_dim), written once."""

import pytest
import torch

from ropekit.layouts import LAYOUTS, TO_BSHD, batch_and_seq_axes, to_bshd


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "thd"])
def test_each_layout_views_as_bshd_and_back(layout):
    bshd = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    stored = bshd.permute(TO_BSHD[layout]).contiguous()  # a tensor in `layout` (the permutations are involutions)
    assert stored.shape == tuple((2, 3, 4, 5)[i] for i in TO_BSHD[layout])
    assert torch.equal(to_bshd(stored, layout), bshd)
    batch_axis, seq_axis = batch_and_seq_axes(layout)
    assert (stored.shape[batch_axis], stored.shape[seq_axis]) == (2, 3)
    assert layout[batch_axis] == "b" and layout[seq_axis] == "s"


def test_packed_tokens_stay_as_they_are():
    x = torch.randn(7, 2, 4)
    assert to_bshd(x, "thd") is x
    assert set(LAYOUTS) == {*TO_BSHD, "thd"}
