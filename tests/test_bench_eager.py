"""The eager host-cost benchmark (ropekit.bench.eager) on the CPU: every call checked at tiny shapes, the clock's
arithmetic with a fake clock, the targets' arithmetic, the JSON and the page. No time is asserted: on the CPU the
calls compute with other code, and a dry run measures nothing (the page says so)."""

import json

import pytest
import torch

from conftest import ON_GPU
from ropekit.bench import eager, timing

DECODE = eager.tiny(eager.CASES[0])


def test_the_cases_are_the_issues_decode_and_small_prefill():
    decode, prefill = eager.CASES
    assert (decode.rope.batch, decode.rope.seqlen, decode.rope.heads_q, decode.rope.heads_k, decode.rope.head_dim) \
        == (64, 1, 32, 8, 128)
    assert (prefill.rope.batch, prefill.rope.seqlen) == (1, 512)
    for case, (batch, seqlen) in ((decode, (64, 1)), (prefill, (1, 512))):
        for fused_case in (case.cache, case.qknorm, case.fp8, case.mla):
            assert (fused_case.batch, fused_case.seqlen) == (batch, seqlen)
        assert (case.cache.heads_q, case.cache.heads_kv, case.cache.head_dim) == (32, 8, 128)
        assert case.qknorm.qk_norm and case.fp8.fp8 and case.mla.kind == "mla"


def test_every_fused_op_is_timed_beside_its_unfused_chain():
    names = [op.name for op in eager.OPS]
    fused = [op for op in eager.OPS if op.kind == "fused"]
    assert {"rope_and_cache", "rope_and_cache + QK-norm", "qk_norm_rope", "mla_rope_and_cache"} <= {
        op.name for op in fused}
    assert all(op.chain in names and names.index(op.chain) == names.index(op.name) + 1 for op in fused)
    assert {eager.APPLY_ROPE, eager.APPLY_ROPE_INPLACE, eager.LIGER} <= set(names)


def test_back_to_back_calls_are_timed_with_one_sync_at_the_end(monkeypatch):
    """µs a call = the wall clock of N calls (a fake clock: a call takes 3 µs) over N; one sync before, one after."""
    now, events = [0.0], []

    def call():
        now[0] += 3e-6
        events.append("call")
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    us = timing.back_to_back_us(call, 7, lambda: events.append("sync"))
    assert us == pytest.approx(3.0) and events == ["sync"] + ["call"] * 7 + ["sync"]


def _fake_ops(log, broken=False):
    def make(name, wrong=False):
        def prepare(case, device):
            return eager.CheckedCall(lambda: log.append(name), 2.0 if wrong else 0.1,
                                  "wrong result: made up" if wrong else None)
        return lambda peers: prepare
    return (eager.Op(eager.APPLY_ROPE, "rope", make(eager.APPLY_ROPE)),
            eager.Op("fused op", "fused", make("fused op", wrong=broken), "its chain"),
            eager.Op("its chain", "chain", make("its chain")))


def test_the_runs_of_every_call_are_interleaved_every_other_one_reversed_and_a_wrong_call_is_never_timed(monkeypatch):
    log = []
    monkeypatch.setattr(eager, "OPS", _fake_ops(log))
    rows = eager.run_case(DECODE, "cpu", calls=3, repeats=3, warmup=1, log=lambda line: None)
    warmup, timed = log[:3], log[3:]
    assert warmup == [eager.APPLY_ROPE, "fused op", "its chain"]
    in_order = [eager.APPLY_ROPE] * 3 + ["fused op"] * 3 + ["its chain"] * 3
    assert timed == in_order + in_order[::-1] + in_order
    assert all(len(r["runs_us"]) == 3 and r["us"] > 0 for r in rows)

    log.clear()
    monkeypatch.setattr(eager, "OPS", _fake_ops(log, broken=True))
    rows = eager.run_case(DECODE, "cpu", calls=3, repeats=2, warmup=1, log=lambda line: None)
    wrong = next(r for r in rows if r["op"] == "fused op")
    assert wrong["status"] == "wrong result" and wrong["us"] is None and "fused op" not in log


def _doc(us: dict, dry_run=False):
    return {"dry_run": dry_run, "cases": [{"name": "decode", "title": "decode"}],
            "rows": [{"case": "decode", "op": op, "us": value} for op, value in us.items()]}


MEASURED = {eager.APPLY_ROPE: 40.0, eager.APPLY_ROPE_INPLACE: 20.0, eager.LIGER: 60.0,
            "rope_and_cache": 29.0, "apply_rope + index_copy_ x2": 60.0}


@pytest.mark.parametrize("target, value, met", [
    ("rope_and_cache <= 1.5x apply_rope", 29 / 40, True),
    ("rope_and_cache <= 1.5x apply_rope (in place)", 29 / 20, True),
    ("rope_and_cache <= 0.5x its unfused chain", 29 / 60, True),
    ("apply_rope <= 0.6x Liger rope", 40 / 60, False),
    ("apply_rope (in place) <= 0.6x Liger rope", 20 / 60, True),
    ("qk_norm_rope <= 0.5x its unfused chain", None, None),  # not measured is not a pass
], ids=["fused-vs-apply_rope", "fused-vs-in-place", "fused-vs-chain", "apply_rope-vs-liger",
        "in-place-vs-liger", "not-measured"])
def test_targets_are_the_issues_ratios_of_the_medians(target, value, met):
    judged = {t["target"]: t for t in eager.evaluate_targets(_doc(MEASURED))}
    assert judged[target]["met"] is met
    assert judged[target]["value"] == (None if value is None else pytest.approx(value))


def test_a_ratio_pairs_the_runs_of_one_round():
    """The host sped up after two runs (Liger's rope 50 -> 35 µs) and apply_rope had two long runs of its own: run by
    run apply_rope took 0.56x Liger's three times out of five, the target's verdict. The ratio of the medians, 28 /
    35 = 0.8, would mix the host's two speeds."""
    doc = _doc(MEASURED)
    runs = {eager.APPLY_ROPE: [28.0, 28.0, 19.6, 40.0, 40.0], eager.LIGER: [50.0, 50.0, 35.0, 35.0, 35.0]}
    for row in doc["rows"]:
        if row["op"] in runs:
            row.update(runs_us=runs[row["op"]], us=sorted(runs[row["op"]])[2])
    judged = {t["target"]: t for t in eager.evaluate_targets(doc)}["apply_rope <= 0.6x Liger rope"]
    assert judged["value"] == pytest.approx(0.56) and judged["met"] is True


def test_a_dry_run_judges_nothing():
    assert all(t["met"] is None for t in eager.evaluate_targets(_doc(MEASURED, dry_run=True)))


def test_dry_run_end_to_end(tmp_path, capsys):
    # no peers folder (a checkout's .peers holds Liger for the GPU)
    code = eager.main(["--out", str(tmp_path), "--dry-run", "--cases", "decode", "--calls", "2", "--repeats", "2",
                       "--peers", str(tmp_path / "no-peers")])
    assert code == 0
    doc = json.loads((tmp_path / "benchmarks_eager.json").read_text())
    assert doc["dry_run"] and doc["settings"]["calls"] == 2 and doc["environment"]["torch"] == torch.__version__
    rows = {r["op"]: r for r in doc["rows"]}
    assert set(rows) == {op.name for op in eager.OPS}
    for op in eager.OPS:
        row = rows[op.name]
        if op.kind == "peer" and row["status"] == "skipped":  # Liger is optional
            assert "Liger" in row["reason"]
            continue
        if op.kind == "peer" and not ON_GPU:
            # a Liger another test put on the path (.peers) runs under the interpreter here, which is no GPU's
            # arithmetic for its kernel: checked, reported, never timed when wrong
            assert row["status"] in ("ok", "wrong result") and (row["status"] == "ok") == (row["check_error"] <= 1.0)
            continue
        assert row["status"] == "ok", row
        assert row["check_error"] <= 1.0 and len(row["runs_us"]) == 2 and row["us"] > 0
    assert all(t["met"] is None for t in doc["targets"])
    page = (tmp_path / "benchmarks_eager.md").read_text()
    assert "**Dry run**" in page and "| rope_and_cache (fused) |" in page and "## Targets" in page
    assert "eager host cost" in capsys.readouterr().out


@pytest.mark.skipif(ON_GPU, reason="on a GPU the benchmark times")
def test_without_a_gpu_only_a_dry_run_runs(tmp_path):
    assert eager.main(["--out", str(tmp_path)]) == 2 and not list(tmp_path.iterdir())


def test_a_fused_op_that_skips_the_norm_fails_its_check(monkeypatch):
    """The qk_norm_rope check is a real one: a call that rotates without normalising is reported wrong."""
    def rope_only(q, k, cos, sin, w_q, w_k, *, eps, **kwargs):
        return eager.apply_rope(q, k, cos, sin, **kwargs)
    monkeypatch.setattr(eager, "qk_norm_rope", rope_only)
    op = next(op for op in eager.OPS if op.name == "qk_norm_rope")
    prepared = op.make(None)(DECODE, "cpu")
    assert prepared.message and prepared.check_error > 1.0


def test_a_spent_time_budget_marks_the_remaining_cases_not_run(monkeypatch):
    log = []
    monkeypatch.setattr(eager, "OPS", _fake_ops(log))
    doc = eager.run([DECODE, DECODE], "cpu", calls=1, repeats=1, warmup=0, dry_run=True, log=lambda line: None,
                    budget_s=1e-9)
    assert [r["status"] for r in doc["rows"]] == ["ok"] * 3 + ["not run"] * 3  # the first case always runs
    assert "not run" in eager.render_markdown(doc)
