"""ropekit.reliability.build: a configuration's tensors are the views its family describes, and the table size
depends on the sizes only (so new position values never need another kernel variant)."""

import dataclasses

import torch

from ropekit.reliability.build import build_case, expected_output, full_width, table_rows
from ropekit.reliability.configs import Config, Family


def _config(**family):
    return Config(Family(**family), seed=5, batch=2, seqlen=5, heads_q=4, heads_k=2, pad=8, span=20)


def test_views_are_what_the_family_says():
    packed = build_case(_config(view="packed"), "cpu")
    assert packed.q.storage is packed.k.storage and packed.q.tensor().shape == (2, 5, 4, 64)
    sliced = build_case(_config(view="sliced", view_dim=1), "cpu").q.tensor()
    assert sliced.shape == (2, 5, 4, 64) and sliced.stride(1) == 2 * 4 * (64 + 8)
    expanded = build_case(_config(view="expanded", view_dim=2), "cpu").q.tensor()
    assert expanded.stride(2) == 0
    misaligned = build_case(_config(view="misaligned"), "cpu").q.tensor()
    assert misaligned.storage_offset() == 1
    dry = build_case(_config(), "cpu", values=False)
    assert dry.cos.shape == build_case(_config(), "cpu").cos.shape


def test_table_rows_depend_on_sizes_not_values():
    cfg = _config(positions="ids")
    assert table_rows(cfg, None) == table_rows(dataclasses.replace(cfg, seed=99), None) == 20 + 5
    case = build_case(cfg, "cpu")
    assert int(case.ref_positions.max()) < case.cos.shape[0]


def test_expected_output_is_the_reference_rotation():
    cfg = _config(head_dim=40, rotary_dim=24)
    case = build_case(cfg, "cpu")
    x = case.q.tensor()
    forward, backward = expected_output(cfg, case, x), expected_output(cfg, case, x, backward=True)
    assert torch.equal(forward[..., 24:], x[..., 24:].double())  # the tail is copied
    undone = expected_output(cfg, case, forward, backward=True)  # the conjugate rotation undoes the forward
    torch.testing.assert_close(undone, x.double(), rtol=0, atol=1e-12)
    assert not torch.equal(forward, backward)
    assert torch.equal(full_width(torch.tensor([1.0, 2.0]), True), torch.tensor([1.0, 1.0, 2.0, 2.0]))
