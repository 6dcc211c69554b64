"""ropekit.reliability.checks: large-tensor spot checks, bitwise determinism and invariance, and long-context
numerics, at CPU sizes (the GPU run does the full sizes; see docs/reliability.md)."""

from ropekit.reliability import checks
from ropekit.reliability.common import available_backends

BACKENDS = available_backends()[0]


def test_large_tensor_spot_checks():
    result = checks.run_large(BACKENDS, numel=6 * 2**12, heads=3, head_dim=16)
    assert result["failed"] == 0 and {s["spot"] for s in result["spots"]} >= {"first", "middle", "last"}


def test_large_tensor_spot_checks_catch_a_wrong_last_token(monkeypatch):
    real = checks.apply_rope

    def corrupt(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0][-1, -1] += 1.0
        return out

    monkeypatch.setattr(checks, "apply_rope", corrupt)
    result = checks.run_large(("triton",), numel=6 * 2**12, heads=3, head_dim=16)
    assert result["failed"] == 1 and any("last" in m for m in result["failures"][0]["messages"])


def test_bitwise_determinism_and_batch_invariance():
    result = checks.run_determinism(BACKENDS, repeats=3, batch=8, seqlen=6, heads=(2, 1), head_dim=32)
    names = {row["check"] for row in result["rows"]}
    assert {"bshd vs sbhd", "bshd vs thd (packed)", "in place vs out of place"} <= names
    assert any(c.startswith("batch of 1 vs batch of 8") for c in names)
    assert any(c.startswith("prefill vs decode") for c in names)
    assert result["failed"] == 0, result["failures"]


def test_long_context_float64_angles_vs_float32_angles():
    result = checks.run_long_context(BACKENDS, rotary_dim=16, heads=2)
    assert result["failed"] == 0, result["failures"]
    at_1e6 = [r for r in result["rows"] if r["position"] == 1_000_000]
    for row in at_1e6:
        # ropekit: fp32 rounding of cos/sin and of the products (|x| ~ 3 at most): well under 1e-6
        assert row["output_error_ropekit"] < 1e-6 and row["table_cos_error_float64_angles"] < 1e-7
        # a float32 angle at 1e6 is on a grid of 0.0625 rad: the rotation is off by ~1e-3 or more
        assert row["output_error_float32_angles"] > 1e-3 and row["table_cos_error_float32_angles"] > 1e-3
