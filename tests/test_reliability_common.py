"""ropekit.reliability.common: layout permutations, dtype names and backend availability."""

import pytest
import torch

from ropekit.reliability.common import (DTYPE_NAMES, DTYPES, TO_BSHD, Unsupported, available_backends, call_backend,
                                        from_bshd, inverse_permutation, layout_shape, to_bshd)


def test_layouts_round_trip_through_bshd():
    x = torch.randn(2, 3, 4, 5)
    for layout in TO_BSHD:
        stored = from_bshd(x, layout)
        assert stored.shape == layout_shape(layout, 2, 3, 4, 5) and torch.equal(to_bshd(stored, layout), x)
    assert layout_shape("thd", 2, 3, 4, 5, tokens=7) == (7, 4, 5)
    assert inverse_permutation((2, 0, 1)) == (1, 2, 0)
    assert all(DTYPE_NAMES[DTYPES[name]] == name for name in DTYPES)


def test_backends_and_unsupported():
    backends, why = available_backends()
    assert backends[0] == "triton" and isinstance(why, str)

    def refuse():
        raise NotImplementedError("thd")

    with pytest.raises(Unsupported, match="thd"):
        call_backend(refuse)
    assert call_backend(lambda: 3) == 3
