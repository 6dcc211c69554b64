"""ropekit.bench.fused_tune on the CPU: the bounded sweep, every configuration checked through the public op under
the forced configuration, the rows timed by a fake clock (made-up numbers, never asserted as timings), the JSON."""

import json

import pytest

from conftest import DEVICE
from ropekit.bench import fused, fused_cases, fused_tune
from ropekit.triton import fused as triton_fused
from ropekit.triton.fused_tiles import (E4M3, E5M2, INT8, NVFP4, PER_BLOCK, PER_HEAD, PER_TENSOR, PER_TOKEN_HEAD,
                                        PLAIN)
from ropekit.triton.launch import plans

CASES = {c.name: c for c in fused_cases.CASES}


class FakeClock:
    """A made-up time per captured graph (not a measurement): the n-th capture takes 10 - n "us"."""

    def __init__(self):
        self.captured = 0

    def copy_ceiling(self):
        return {"gbps": 1.0, "time_us": 1.0, "method": "fake"}

    def capture(self, fns, estimate_us):
        self.captured += 1
        return self.captured

    def replay_rounds(self, graphs):
        return [(10.0 - g, 0.0, 1) for g in graphs]


def test_the_sweep_is_bounded_and_starts_from_the_launch_choice():
    total = 0
    for name in fused_tune.TUNED_CASES:
        configs = fused_tune.candidates(CASES[name])
        assert len(set(configs)) == len(configs)
        c = CASES[name]
        assert configs[0] == triton_fused.fused_config_for(fused_tune.case_shape(c), None)
        if c.decode:
            assert {config.block_s for config in configs[1:]} == {1}  # one token per sequence: one token block
        if c.kind != "backward":
            assert {config.token_blocks for config in configs} == {1}  # a forward program is one token block
        total += len(configs)
    assert total <= 150  # every case of the sweep in one device call


def test_a_case_whose_cache_reduces_its_scales_also_sweeps_v_in_programs_of_its_own():
    """v's own programs are a choice of the model only where the cache's scales are reduced (at decode, and at a
    prefill's scale per (token, head)): the sweep times each tile of such a forward case with and without them (the
    launch choice's tile too), and never elsewhere."""
    for name, case in CASES.items():
        if case.kind == "backward":
            continue
        configs = fused_tune.candidates(case)
        reduced = fused_tune.case_shape(case).reduces_scales
        tiles = {config._replace(v_apart=False) for config in configs}
        if reduced:
            assert {config._replace(v_apart=False) for config in configs if config.v_apart} == tiles, name
            assert {config for config in configs if not config.v_apart} == tiles, name
        else:
            assert not any(config.v_apart for config in configs), name
    assert any(CASES[name].decode and fused_tune.case_shape(CASES[name]).reduces_scales for name in CASES)
    assert any(not CASES[name].decode and CASES[name].kind != "backward"
               and fused_tune.case_shape(CASES[name]).reduces_scales for name in CASES)


# a case -> the formats its call writes: the cache's format and scales, q's output format
WRITTEN = {
    "prefill-b4-s4096": (PLAIN, PER_TENSOR, PLAIN),
    "decode-b64-fp8": (E4M3, PER_TENSOR, PLAIN),
    "decode-b64-e5m2": (E5M2, PER_TENSOR, PLAIN),
    "prefill-b4-s4096-fp8-head": (E4M3, PER_HEAD, PLAIN),
    "prefill-b4-s4096-fp8-token-head": (E4M3, PER_TOKEN_HEAD, PLAIN),
    "prefill-b4-s4096-int8-token-head": (INT8, PER_TOKEN_HEAD, PLAIN),
    "prefill-b4-s4096-fp8-q": (E4M3, PER_TENSOR, E4M3),
    "decode-b64-nvfp4": (NVFP4, PER_BLOCK, PLAIN),  # e2m1 bytes, an e4m3 block scale per 16 channels
    "prefill-b4-s4096-nvfp4": (NVFP4, PER_BLOCK, PLAIN),
}


@pytest.mark.parametrize("name", list(WRITTEN))
def test_a_case_is_tuned_in_the_bucket_of_the_formats_it_writes(name):
    shape = fused_tune.case_shape(CASES[name])
    assert (shape.cache_format, shape.cache_scales, shape.q_format) == WRITTEN[name]
    assert shape.quantised_cache == (WRITTEN[name][0] != PLAIN)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tools_shape_is_the_one_the_library_asks_the_launch_choice_for(monkeypatch, name):
    """The tool asks the launch choice (the model, the autotune's disk cache) for the bucket the library's own plan
    of the case's call asks for: the same tokens, heads, width, norm and formats written."""
    asked = []
    choose = triton_fused.fused_config_for

    def spy(shape, device, bench=None, registers=None):
        asked.append(shape)
        return choose(shape, device, bench, registers)

    monkeypatch.setattr(triton_fused, "fused_config_for", spy)  # where every fused plan gets its configuration
    plans.clear()  # a call signature planned before would not ask again
    case = fused_cases.tiny(CASES[name])
    result, _, _ = fused.checked_call(case, fused.impls()["ropekit-fused"], DEVICE, seed=0)
    assert result["ok"]
    assert asked[-1] == fused_tune.case_shape(case)  # (the backward's call plans its forward first)


def test_every_configuration_is_checked_through_the_forced_config(monkeypatch):
    seen = []
    choose = triton_fused.fused_config_for

    def spy(shape, device, bench=None, registers=None):
        config = choose(shape, device, bench, registers)
        if not seen or seen[-1] != config:  # (a plan is made once per configuration and call signature)
            seen.append(config)
        return config

    monkeypatch.setattr(triton_fused, "fused_config_for", spy)  # where every fused plan gets its configuration
    case = fused_cases.tiny(CASES["decode-b64-fp8"])
    rows = fused_tune.tune_case(case, FakeClock(), DEVICE, ceiling_gbps=1.0, log=lambda line: None)
    assert [r["status"] for r in rows] == ["ok"] * len(rows)
    assert seen == fused_tune.candidates(case)
    assert all(r["graph_us"] is not None and r["floor_pct"] > 0 for r in rows)
    shape = triton_fused.FusedShape(1, 1, 1, 2)
    assert choose(shape, DEVICE) != seen[1]  # the override ends with the block


def test_a_wrong_configuration_is_reported_not_timed(monkeypatch):
    case = fused_cases.tiny(CASES["decode-b64"])
    monkeypatch.setattr(fused_tune, "candidates", lambda c: [triton_fused.FusedConfig(1, 1, 1)])
    monkeypatch.setattr(fused, "check", lambda *a: {"ok": False})  # what checked_call judges the call by
    rows = fused_tune.tune_case(case, FakeClock(), DEVICE, ceiling_gbps=1.0, log=lambda line: None)
    assert rows[0]["status"] == "wrong result" and rows[0]["graph_us"] is None


def test_cli_dry_run_writes_the_json(tmp_path, capsys):
    assert fused_tune.main(["--out", str(tmp_path), "--dry-run", "--cases", "decode-b64"]) == 0
    doc = json.loads((tmp_path / "fused_tune.json").read_text())
    assert doc["copy_ceiling"] is None and doc["best"] == {}
    assert {r["status"] for r in doc["rows"]} == {"ok"} and sum(r["table"] for r in doc["rows"]) == 1
    assert "decode-b64" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fused_tune.main(["--out", str(tmp_path), "--cases", "no-such-case"])


def test_a_spent_time_budget_leaves_the_remaining_cases_not_run():
    case = fused_cases.tiny(CASES["decode-b64"])
    doc = fused_tune.tune([case], FakeClock(), DEVICE, budget_s=1e-9, log=lambda line: None)
    assert doc["rows"] == [dict(case=case.name, status="not run", reason="time budget of 1e-09 s used up")]


def test_an_nvfp4_case_is_swept_over_every_configuration():
    """Every launch configuration of the sweep writes NVFP4 that passes the benchmark's check (the reader round trip
    and the block scales), through the public op under the forced configuration."""
    case = fused_cases.tiny(CASES["prefill-b4-s4096-nvfp4"])
    rows = fused_tune.tune_case(case, None, DEVICE, ceiling_gbps=None, log=lambda line: None)  # checked, not timed
    assert len(rows) == len(fused_tune.candidates(case)) > 10
    assert [r["status"] for r in rows] == ["ok"] * len(rows) and all(r["quant_ulps"] <= 0.5 + 1e-3 for r in rows)
    assert rows[0]["shape"]["cache_format"] == NVFP4 and rows[0]["shape"]["cache_scales"] == PER_BLOCK
