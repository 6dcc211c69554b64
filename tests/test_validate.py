"""ropekit.validate through the public API: every invalid call raises before anything is written, with an error
that names its argument; device values are checked in check mode only."""

import os

import pytest
import torch

import ropekit
from conftest import DEVICE
from rope_cases import valid_call


ERRORS = [
    ("odd-rotary-dim", lambda q, k, c, s: dict(rotary_dim=7), ValueError, "rotary_dim"),
    ("rotary-dim-too-large", lambda q, k, c, s: dict(rotary_dim=64), ValueError, "rotary_dim"),
    ("head-dim-mismatch", lambda q, k, c, s: dict(k=k[..., :16]), ValueError, "head_dim"),
    ("dtype-mismatch", lambda q, k, c, s: dict(k=k.double()), TypeError, "dtype"),
    ("integer-q", lambda q, k, c, s: dict(q=q.to(torch.int32)), TypeError, "q must be"),
    ("complex-q", lambda q, k, c, s: dict(q=torch.complex(q, q)), TypeError, "q must be"),
    ("bad-layout", lambda q, k, c, s: dict(layout="bsd"), ValueError, "layout"),
    ("positions-beyond-table", lambda q, k, c, s: dict(positions=15), ValueError, "table"),
    ("float-positions", lambda q, k, c, s: dict(positions=torch.zeros(2, device=DEVICE)), TypeError, "positions"),
    ("positions-wrong-shape", lambda q, k, c, s: dict(positions=torch.zeros(5, 7, dtype=torch.long, device=DEVICE)),
     ValueError, "positions"),
    ("cos-sin-shape-mismatch", lambda q, k, c, s: dict(sin=s[:, :8]), ValueError, "cos and sin"),
    ("thd-without-cu-seqlens", lambda q, k, c, s: dict(q=q[0], k=k[0], layout="thd"), ValueError, "cu_seqlens"),
    ("bad-backend", lambda q, k, c, s: dict(backend="rocm"), ValueError, "backend"),
    ("batch-mismatch", lambda q, k, c, s: dict(k=k[:1]), ValueError, "k"),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name,change,error,words", ERRORS, ids=[e[0] for e in ERRORS])
def test_invalid_input_raises_before_any_write(name, change, error, words, inplace):
    q, k, cos, sin = valid_call()
    args = dict(q=q, k=k, cos=cos, sin=sin, inplace=inplace)
    args.update(change(q, k, cos, sin))
    before = [t.clone() for t in (args["q"], args["k"]) if isinstance(t, torch.Tensor)]
    with pytest.raises(error, match=words):
        ropekit.apply_rope(**args)
    after = [t for t in (args["q"], args["k"]) if isinstance(t, torch.Tensor)]
    for b, a in zip(before, after):
        assert torch.equal(b, a) or (b.is_complex() and torch.equal(torch.view_as_real(b), torch.view_as_real(a)))


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_check_mode_follows_the_environment_on_every_call(monkeypatch, value, on):
    """A planned call (the second of a signature) still reads ROPEKIT_CHECK as it is at the call."""
    q, k, cos, sin = valid_call()
    far = torch.tensor([3, 14], device=DEVICE)  # beyond the table: refused in check mode only
    monkeypatch.delenv("ROPEKIT_CHECK", raising=False)
    for _ in range(2):
        ropekit.apply_rope(q, k, cos, sin, positions=far)
    if value is None:
        monkeypatch.delenv("ROPEKIT_CHECK", raising=False)
    else:
        monkeypatch.setenv("ROPEKIT_CHECK", value)
    if on:
        with pytest.raises(ValueError, match="table"):
            ropekit.apply_rope(q, k, cos, sin, positions=far)
    else:
        ropekit.apply_rope(q, k, cos, sin, positions=far)


def test_check_mode_follows_a_replaced_environment(monkeypatch):
    """A test may put another mapping in os.environ's place: check mode reads that one."""
    q, k, cos, sin = valid_call()
    far = torch.tensor([3, 14], device=DEVICE)
    monkeypatch.delenv("ROPEKIT_CHECK", raising=False)
    for _ in range(2):
        ropekit.apply_rope(q, k, cos, sin, positions=far)
    monkeypatch.setattr(os, "environ", {**os.environ, "ROPEKIT_CHECK": "1"})
    with pytest.raises(ValueError, match="table"):
        ropekit.apply_rope(q, k, cos, sin, positions=far)


def test_check_mode_catches_device_values(monkeypatch):
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    q, k, cos, sin = valid_call()
    with pytest.raises(ValueError, match="table"):
        ropekit.apply_rope(q, k, cos, sin, positions=torch.tensor([3, 14], device=DEVICE))
    cu = torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens"):
        ropekit.apply_rope(q.reshape(6, 4, 32), None, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=4)


@pytest.mark.parametrize("op", ["apply_rope", "qk_norm_rope", "rope_and_cache"])
@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_more_sequences_than_the_launch_grid_holds_are_refused_before_anything_is_written(op, layout):
    """The kernels put a call's sequences on the grid's third axis, which CUDA caps at 65535: every op that launches
    them refuses a 65536th sequence in validation (naming where the count comes from), writing nothing; the native
    backend, which launches no such grid, takes it."""
    n = 65536
    q = torch.randn(n, 1, 2, 8, device=DEVICE) if layout == "bshd" else torch.randn(n, 2, 8, device=DEVICE)
    k = q[..., :1, :].clone()
    extra = dict(cu_seqlens=torch.arange(n + 1, device=DEVICE), max_seqlen=1) if layout == "thd" else {}
    cos, sin = ropekit.cos_sin_table(4, 8, device=DEVICE)
    cache = torch.zeros(1, 4, 1, 8, device=DEVICE)
    calls = {"apply_rope": lambda **kw: ropekit.apply_rope(q, k, cos, sin, layout=layout, inplace=True, **extra, **kw),
             "qk_norm_rope": lambda **kw: ropekit.qk_norm_rope(q, k, cos, sin, layout=layout, inplace=True, **extra,
                                                               **kw),
             "rope_and_cache": lambda **kw: ropekit.rope_and_cache(q, k, k, cos, sin, k_cache=cache,
                                                                   v_cache=cache.clone(),
                                                                   slot_mapping=torch.full((n,), -1, device=DEVICE),
                                                                   layout=layout, inplace=True, **extra, **kw)}
    before = q.clone(), k.clone()
    with ropekit.device.set_backend("triton"), pytest.raises(ValueError, match="65535"):
        calls[op]()
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    if op == "apply_rope":
        calls[op](backend="native")


@pytest.mark.parametrize("bad,error,name", [
    (dict(eps="1e-6"), TypeError, "eps"), (dict(eps=float("nan")), TypeError, "eps"), (dict(eps=0.0), ValueError, "eps"),
    (dict(eps=True), TypeError, "eps"), (dict(weight_offset=float("inf")), TypeError, "weight_offset"),
], ids=["str", "nan", "zero", "bool", "inf-offset"])
def test_rope_and_cache_checks_eps_and_weight_offset_without_a_norm(bad, error, name):
    """An argument is valid or refused whatever the others are: eps and weight_offset, not read without a norm, are
    still checked."""
    q, k = torch.randn(1, 2, 2, 8, device=DEVICE), torch.randn(1, 2, 1, 8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(4, 8, device=DEVICE)
    cache = torch.zeros(1, 4, 1, 8, device=DEVICE)
    with pytest.raises(error, match=name):
        ropekit.rope_and_cache(q, k, k, cos, sin, k_cache=cache, v_cache=cache.clone(),
                               slot_mapping=torch.arange(2, device=DEVICE), **bad)
    assert not cache.any()
