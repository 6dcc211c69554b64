"""ropekit.reliability.properties: random configurations against the float64 reference, and proof that each check
of ``run_config`` can fail (a sabotaged call is caught)."""

import pytest
import torch

from ropekit.reliability import properties as prop
from ropekit.reliability.common import Unsupported, available_backends
from ropekit.reliability.configs import CPU_SCALE, Config, Family
from ropekit.reliability.generate import generate_configs
from conftest import ON_GPU

BACKENDS = available_backends()[0]
# The interpreter runs ~120 configurations in ~15 s. On a GPU every new kernel variant is a compile and
# `python -m ropekit stress` runs 2,000 configurations, so pytest keeps a few there.
PROPERTY_CONFIGS, _ = generate_configs(120, seed=7, scale=CPU_SCALE, n_families=40)
RUN_CONFIGS = PROPERTY_CONFIGS[:8] if ON_GPU else PROPERTY_CONFIGS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", RUN_CONFIGS, ids=[c.short_id() for c in RUN_CONFIGS])
def test_random_configuration_matches_reference(config, backend):
    try:
        failures = prop.run_config(config, backend)
    except Unsupported as why:
        pytest.skip(f"{backend}: {why}")
    assert not failures, f"{config.describe()}: {failures}"


def _config(**family):
    """A small explicit configuration (2 x 5 tokens, GQA 4/2 heads) of the given family."""
    return Config(Family(**family), seed=5, batch=2, seqlen=5, heads_q=4, heads_k=2, pad=8, span=20)


def _sabotage(monkeypatch, after):
    """Replace apply_rope (as the property module calls it) by the real call followed by ``after(q, kwargs,
    result)``."""
    real = prop.apply_rope

    def sabotaged(q, k=None, cos=None, sin=None, **kwargs):
        return after(q, kwargs, real(q, k, cos, sin, **kwargs))

    monkeypatch.setattr(prop, "apply_rope", sabotaged)


def test_checks_pass_the_unsabotaged_configurations():
    for family in (dict(head_dim=40, rotary_dim=24), dict(backward="full"), dict(view="sliced", view_dim=-1,
                                                                                   inplace=True)):
        assert prop.run_config(_config(**family)) == []


def test_checks_catch_a_wrong_rotation(monkeypatch):
    _sabotage(monkeypatch, lambda q, kw, out: (out[0] * 1.001, out[1]))
    assert any(m.startswith("q:") for m in prop.run_config(_config()))


def test_checks_catch_a_wrong_gradient(monkeypatch):
    # forward values unchanged (q - q.detach() is 0), but q's gradient gets 1% of the incoming gradient added
    _sabotage(monkeypatch, lambda q, kw, out: (out[0] + 0.01 * (q - q.detach()), out[1]))
    assert any(m.startswith("q.grad:") for m in prop.run_config(_config(backward="full")))


def test_checks_catch_an_uncopied_tail(monkeypatch):
    def drop_tail(q, kw, out):
        out[0][..., 24:] = 0
        return out
    _sabotage(monkeypatch, drop_tail)
    assert any("tail" in m for m in prop.run_config(_config(head_dim=40, rotary_dim=24)))


def test_checks_catch_a_write_outside_the_view(monkeypatch):
    def spill(q, kw, out):  # one element past the view's last channel: the padding of the storage
        torch.as_strided(q, (1,), (1,), q.storage_offset() + q.shape[-1]).add_(1.0)
        return out
    _sabotage(monkeypatch, spill)
    messages = prop.run_config(_config(view="sliced", view_dim=-1, inplace=True))
    assert any("outside the views" in m for m in messages)


def test_checks_catch_a_modified_input(monkeypatch):
    def touch(q, kw, out):
        q.add_(1.0)
        return out
    _sabotage(monkeypatch, touch)
    assert any("modified its input" in m for m in prop.run_config(_config()))


def test_property_section_counts_every_configuration():
    result = prop.run_property(4, seed=1, backends=("triton",), n_families=2)
    assert result["configs"] == result["planned"] == 4 and result["checked"] == 4 and result["failed"] == 0
    assert sum(result["coverage"]["layout"].values()) == 4
