"""The fuzzer of hostile-but-plausible inputs (ropekit.reliability.fuzz): a seeded run finds no violation, and its
oracle does fail on a wrong kernel and on a write outside the outputs."""

import torch

from ropekit.reliability import fuzz


def test_seeded_fuzz_run_has_no_violation():
    counts = fuzz.run(cases=300, seed=0)
    assert counts["violation"] == 0, "\n".join(counts["violations"][:10])
    # the draw reaches every outcome it is meant to: valid calls, refused calls and hostile device values
    assert counts["matched_reference"] > 150 and counts["documented_error"] > 20 and counts["contained"] > 5


def test_the_oracle_fails_on_an_unrotated_result(monkeypatch):
    def identity(q, k, cos, sin, **kwargs):
        return q.clone(), (k.clone() if k is not None else None)

    monkeypatch.setattr(fuzz, "apply_rope", identity)
    assert fuzz.run(cases=20, seed=0)["violation"] > 0


def test_the_oracle_fails_on_a_write_outside_the_outputs(monkeypatch):
    real = fuzz.apply_rope

    def spills(q, k, cos, sin, **kwargs):
        out = real(q, k, cos, sin, **kwargs)
        if q.numel():
            storage = torch.empty(0, dtype=q.dtype, device=q.device).set_(q.untyped_storage())
            storage[0] = 1.5  # the first guard element of q's buffer
        return out

    monkeypatch.setattr(fuzz, "apply_rope", spills)
    counts = fuzz.run(cases=20, seed=0)
    assert counts["violation"] > 0 and any("outside" in v for v in counts["violations"])
