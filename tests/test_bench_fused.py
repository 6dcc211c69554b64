"""The fused benchmark (ropekit.bench.fused, fused_cases, fused_report) on the CPU: byte floors, every implementation
checked against the float64 reference at tiny shapes, the runner with a fake clock, the targets' arithmetic, and the
JSON / markdown / PNG. No timing is asserted: the fake clock's numbers are made up and say so."""

import json

import pytest
import torch

from conftest import DEVICE, gpu_only
import ropekit
from ropekit.bench import fused, fused_cases, fused_report

CASES = {c.name: c for c in fused_cases.CASES}


def test_byte_floors_match_the_published_table():
    """decode b64: 1.57 MB (0.37 us at 4253 GB/s); prefill b4 s4096: 402.7 MB (94.7 us): the published floors."""
    assert fused_cases.floor_bytes(CASES["decode-b64"]) == 64 * (32 + 8 + 8) * 128 * 2 * 2
    assert fused_cases.floor_bytes(CASES["prefill-b4-s4096"]) / 4253e3 == pytest.approx(94.7, abs=0.05)
    assert fused_cases.floor_bytes(CASES["decode-b64"]) / 4253e3 == pytest.approx(0.37, abs=0.005)
    assert fused_cases.floor_bytes(CASES["decode-b64-qknorm"]) == fused_cases.floor_bytes(CASES["decode-b64"])
    # float8: k and v land as one byte each
    fp8 = fused_cases.floor_bytes(CASES["prefill-b4-s4096-fp8"])
    assert fused_cases.floor_bytes(CASES["prefill-b4-s4096"]) - fp8 == 4 * 4096 * 2 * 8 * 128
    mla = CASES["mla-decode-b64"]
    assert fused_cases.floor_bytes(mla) == 64 * (2 * 128 * 64 + 2 * 64 + 512) * 2 + 64 * 576 * 2
    assert fused_cases.meta_bytes(mla) == 64 * (16 + 64 * 4)


def test_inputs_address_a_shuffled_paged_cache():
    data = fused_cases.make_data(fused_cases.tiny(CASES["decode-b64"]), DEVICE, seed=0)
    assert data.slots.dtype == torch.int64 and len(set(data.slots.tolist())) == data.case.tokens
    assert int(data.slots.max()) < data.k_cache.shape[0] * data.k_cache.shape[1]
    positions = data.token_positions
    assert torch.equal(data.slots % fused_cases.BLOCK_SIZE, positions % fused_cases.BLOCK_SIZE)


class FakeClock:
    """Made-up times (not a measurement): a fixed number per implementation, to exercise the runner and report."""

    US = {"ropekit-fused": 1.0, "unfused (index_copy_)": 3.0, "unfused (index_put_)": 4.0, "torch.compile": 0.9,
          fused.COPY_REFERENCE: 0.95, fused.LAUNCH_FLOOR: 0.8}
    # in capture order within one case: its implementations, its copy reference, (decode) its launch-chain floor

    def __init__(self):
        self.captured = []

    def copy_ceiling(self):
        return {"gbps": 1.0, "time_us": 1.0, "bytes_read": 1, "bytes_written": 1, "method": "fake"}

    def capture(self, fns, estimate_us):
        self.captured.append(fns)
        return len(self.captured) - 1

    def replay_rounds(self, graphs):  # one call per case: the i-th graph of a case gets the i-th time
        return [(self.US[list(self.US)[i % len(self.US)]], 0.0, 1) for i in range(len(graphs))]


@pytest.fixture(scope="module")
def fake_doc():
    cases = [fused_cases.tiny(CASES[n]) for n in ("decode-b64-fp8", "prefill-b4-s4096-qknorm", "mla-decode-b64",
                                                    "qknorm-backward-b4-s4096")]
    builders = fused.impls("aot_eager")
    doc = fused.run(cases, builders, FakeClock(), DEVICE, log=lambda line: None)
    doc["targets"] = fused_report.evaluate_targets(doc)
    return doc


def test_every_implementation_is_checked_and_timed(fake_doc):
    rows = [r for r in fake_doc["rows"] if r["impl"] in fused.IMPL_NAMES]
    assert len(rows) == 4 * len(fused.IMPL_NAMES)
    for row in rows:
        if row["impl"] == "unfused (index_put_)" and row["case"].startswith("qknorm-backward"):
            assert row["status"] == "skipped"
            continue
        assert row["status"] == "ok", row
        assert row["error_ratio"] <= 1.0 and row["graph_us"] is not None
    fp8 = [r for r in rows if r["case"] == "decode-b64-fp8"]
    assert all(r["quant_ulps"] is not None for r in fp8)
    fused_fp8 = next(r for r in fp8 if r["impl"] == "ropekit-fused")
    assert fused_fp8["quant_ulps"] <= 0.5 + 1e-3  # the kernel rounds the float32 value once


def test_each_timed_case_has_a_copy_of_its_floor_as_a_reference_row(fake_doc):
    copies = [r for r in fake_doc["rows"] if r["impl"] == fused.COPY_REFERENCE]
    assert [r["case"] for r in copies] == [c["name"] for c in fake_doc["cases"]]
    assert all(r["status"] == "reference" and r["graph_us"] is not None for r in copies)
    # the reference is timed, never judged: the targets compare the implementations only
    decode = fused_report.timed_rows(fake_doc, "decode-b64-fp8")
    assert fused_report.best_unfused(decode)["impl"] == "unfused (index_copy_)"
    page = fused_report.render_markdown(fake_doc)
    assert f"| {fused.COPY_REFERENCE} | 0.95 |" in page


def test_each_timed_decode_case_has_the_launch_chain_floor_as_a_reference_row(fake_doc):
    chains = [r for r in fake_doc["rows"] if r["impl"] == fused.LAUNCH_FLOOR]
    assert [r["case"] for r in chains] == [c["name"] for c in fake_doc["cases"] if c["decode"]]
    assert all(r["status"] == "reference" and r["graph_us"] == 0.8 for r in chains)
    target = next(t for t in fake_doc["targets"] if t["case"] == "decode-b64-fp8" and "launch-chain" in t["target"])
    assert target["target"] == "decode <= 1.3x the launch-chain floor"
    assert target["value"] == pytest.approx(1.0 / 0.8) and target["met"] is True  # fake: 1.0 us against 0.8 us
    assert not [t for t in fake_doc["targets"] if "launch-chain" in t["target"] and t["case"] != "decode-b64-fp8"
                and not t["case"].startswith("mla-decode")]
    page = fused_report.render_markdown(fake_doc)
    assert f"| {fused.LAUNCH_FLOOR} | 0.80 |" in page and "Launch-chain floor 0.80 µs; ropekit-fused at 1.25x" in page


@pytest.mark.parametrize("fused_us, met", [(1.04, True), (1.3, True), (1.31, False)], ids=["1.04x", "1.30x", "1.31x"])
def test_fused_decode_is_judged_against_1_3x_the_launch_chain_floor(fused_us, met):
    doc = {"cases": [{"name": "d", "kind": "cache", "decode": True, "fp8": False, "floor_us": 0.4}],
           "rows": [{"case": "d", "impl": fused.LAUNCH_FLOOR, "graph_us": 1.0},
                    {"case": "d", "impl": "ropekit-fused", "graph_us": fused_us}]}
    target = next(t for t in fused_report.evaluate_targets(doc) if "launch-chain" in t["target"])
    assert target["value"] == pytest.approx(fused_us) and target["met"] is met


def test_the_copy_reference_moves_the_floor_in_random_bytes():
    case = fused_cases.tiny(CASES["prefill-b4-s4096"])
    dst = fused.copy_of_floor(case, DEVICE)()
    assert dst.dtype == torch.uint8 and 2 * dst.numel() == fused_cases.floor_bytes(case)
    assert dst.unique().numel() > 200  # random bytes, not a constant


def test_a_wrong_implementation_is_reported_not_timed():
    case = fused_cases.tiny(CASES["decode-b64"])

    def forgets_the_rotation(data):
        q, k, v = data.split()
        return lambda: q  # writes no cache and leaves q unrotated

    rows = fused.run_case(case, {"broken": forgets_the_rotation}, FakeClock(), DEVICE, log=lambda line: None)
    assert rows[0]["status"] == "wrong result" and rows[0]["graph_us"] is None


def test_targets_are_judged_from_the_document(fake_doc):
    decode = [t for t in fake_doc["targets"] if t["case"] == "decode-b64-fp8"]
    assert {t["target"] for t in decode} >= {"decode <= 0.5x the best unfused pipeline",
                                            "decode no slower than torch.compile of the chain"}
    half = next(t for t in decode if t["target"].startswith("decode <="))
    assert half["value"] == pytest.approx(1.0 / 3.0) and half["met"] is True  # fake: 1.0 us against 3.0 us
    versus = next(t for t in decode if "torch.compile" in t["target"])
    assert versus["value"] == pytest.approx(1.0 / 0.9) and versus["met"] is False
    prefill = [t for t in fake_doc["targets"] if t["case"] == "prefill-b4-s4096-qknorm"]
    assert {t["target"].split()[0] for t in prefill} == {"prefill", ">="}
    assert all(t["met"] is not None for t in fake_doc["targets"])


def test_json_markdown_and_plot(fake_doc, tmp_path):
    paths = fused_report.write_outputs(fake_doc, tmp_path)
    assert [p.name for p in paths] == ["benchmarks_fused.json", "benchmarks_fused.md", "benchmarks_fused.png"]
    doc = json.loads(paths[0].read_text())
    assert doc["rows"] == json.loads(json.dumps(fake_doc["rows"]))
    page = paths[1].read_text()
    assert "### DeepSeek MLA decode b64" in page and "## Targets" in page and "FlashInfer" in page
    assert paths[2].stat().st_size > 10_000
    assert fused_report.main([str(paths[0]), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "benchmarks_fused.md").read_text() == page


def test_cli_dry_run(tmp_path, capsys):
    assert fused.main(["--out", str(tmp_path), "--dry-run", "--cases", "decode-b64"]) == 0
    doc = json.loads((tmp_path / "benchmarks_fused.json").read_text())
    assert doc["copy_ceiling"] is None and {r["status"] for r in doc["rows"]} == {"ok"}  # (no copy reference)
    assert all(t["met"] is None for t in doc["targets"])  # nothing timed, nothing claimed
    with pytest.raises(SystemExit):
        fused.main(["--out", str(tmp_path), "--cases", "no-such-case"])


def test_a_spent_time_budget_marks_the_remaining_cases_not_run(tmp_path):
    case = fused_cases.tiny(CASES["decode-b64"])
    doc = fused.run([case], fused.impls("aot_eager"), FakeClock(), DEVICE, log=lambda line: None, budget_s=1e-9)
    assert {r["status"] for r in doc["rows"]} == {"not run"} and len(doc["rows"]) == len(fused.IMPL_NAMES)
    fused_report.publish(doc, tmp_path)
    assert "not run" in (tmp_path / "benchmarks_fused.md").read_text()


@gpu_only
@pytest.mark.parametrize("impl", ["ropekit-fused", "unfused (index_copy_)"])
def test_the_backward_case_at_full_size_is_checked_on_the_gpu(impl):
    """The full-size backward case's reference and its autograd calls on CUDA inputs (the reference's leaves are CPU
    copies: no operation mixes the inputs' device with the CPU's)."""
    build = fused.impls("aot_eager")[impl]
    result, _, _ = fused.checked_call(CASES["qknorm-backward-b4-s4096"], build, DEVICE, seed=0)
    assert result["ok"], result


def test_the_backward_reference_differentiates_cpu_copies(monkeypatch):
    """Whatever device the inputs are on, the float64 reference's autograd runs on CPU leaves."""
    seen = []
    grad = torch.autograd.grad

    def spy(outputs, inputs, *args, **kwargs):
        seen.extend(t.device.type for t in (*outputs, *inputs))
        return grad(outputs, inputs, *args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", spy)
    data = fused_cases.make_data(fused_cases.tiny(CASES["qknorm-backward-b4-s4096"]), DEVICE, seed=0)
    want = fused_cases.expected(data)
    assert seen and set(seen) == {"cpu"} and {t.device.type for t in want.values()} == {"cpu"}


@pytest.mark.parametrize("name", ["decode-b64-page-table", "prefill-b4-s4096-page-table"])
def test_the_page_table_cases_write_the_slot_cases_rows(name):
    """FlashInfer's page table names the rows the slot mapping names: the fused call through it passes the same
    check, and the unfused peers (which write by slot) stay the same pipelines."""
    case = fused_cases.tiny(CASES[name])
    data = fused_cases.make_data(case, DEVICE, seed=0)
    table = {n: t.cpu().long() for n, t in data.page_table.items()}
    block = fused_cases.BLOCK_SIZE
    page = table["kv_indices"][table["kv_indptr"][table["batch_indices"]] + table["cache_positions"] // block]
    assert torch.equal(page * block + table["cache_positions"] % block, data.slots.cpu())
    result, _, _ = fused.checked_call(case, fused.impls("aot_eager")["ropekit-fused"], DEVICE, seed=0)
    assert result["ok"], result


# --- quantise on write: a decode and a prefill case for every format ----------------------------------------------

NEW_FORMATS = ("e5m2", "int8-token-head", "fp8-token-head", "fp8-head", "fp8-q", "nvfp4")
FORMAT_CASES = [f"{shape}-{fmt}" for fmt in NEW_FORMATS for shape in ("decode-b64", "prefill-b4-s4096")]


def test_every_format_has_a_llama_decode_and_prefill_case():
    assert set(FORMAT_CASES) <= set(CASES)
    for name in FORMAT_CASES:
        case = CASES[name]
        assert (case.heads_q, case.heads_kv, case.head_dim, case.dtype) == (32, 8, 128, torch.bfloat16)
        assert (case.batch, case.seqlen) == ((64, 1) if name.startswith("decode") else (4, 4096))
        assert case.quantised and not case.qk_norm and not case.page_table
    formats = {CASES[f"decode-b64-{fmt}"].format for fmt in NEW_FORMATS}
    assert formats == {"float8 e5m2 cache per tensor", "int8 cache per (token, head)",
                       "float8 e4m3 cache per (token, head)", "float8 e4m3 cache per kv head",
                       "float8 e4m3 cache per tensor, float8 e4m3 q",
                       "NVFP4 cache (e2m1, an e4m3 scale per 16 channels, a global scale)"}
    assert CASES["decode-b64-int8-token-head"].kv_cache_dtype == "int8_per_token_head"  # vLLM's names
    assert CASES["decode-b64-fp8-token-head"].kv_cache_dtype == "fp8_per_token_head"
    assert CASES["decode-b64-nvfp4"].kv_cache_dtype == "nvfp4"


@pytest.mark.parametrize("fmt, q_bytes, cache_bytes, scale_bytes, static_bytes", [
    ("fp8", 2, 1, 0, 8),
    ("e5m2", 2, 1, 0, 8),
    ("int8-token-head", 2, 1, 2 * 4 * 8, 0),  # a float32 scale a token and kv head, for k and for v
    ("fp8-token-head", 2, 1, 2 * 4 * 8, 0),
    ("fp8-head", 2, 1, 0, 2 * 4 * 8),  # static: one float32 a kv head for each cache, read, not counted
    ("fp8-q", 1, 1, 0, 12),  # q written as one byte an element; q's scale read
    ("nvfp4", 2, 0.5, 2 * 8 * 128 // 16, 8),  # two e2m1 values a byte, an e4m3 byte a 16 channels; global scales read
], ids=lambda v: str(v))
def test_format_byte_floors_count_q_the_cache_and_the_scales_in_their_formats(fmt, q_bytes, cache_bytes,
                                                                               scale_bytes, static_bytes):
    """Per token of Llama-3-8B: read q, k, v (bf16); write q (bf16 or float8), k and v (one byte an element, NVFP4
    half a byte) and the scales computed on write (per (token, head), or NVFP4's per 16 channels)."""
    for shape, tokens in (("decode-b64", 64), ("prefill-b4-s4096", 4 * 4096)):
        case = CASES[f"{shape}-{fmt}"]
        per_token = (32 + 16) * 128 * 2 + 32 * 128 * q_bytes + 16 * 128 * cache_bytes + scale_bytes
        assert fused_cases.floor_bytes(case) == tokens * per_token
        assert fused_cases.scale_bytes(case) == tokens * scale_bytes
        assert fused_cases.static_scale_bytes(case) == static_bytes
    # the prefill int8 per-(token, head) floor: 370.1 MB, of it 1.05 MB of scales (a quarter of a percent)
    case = CASES["prefill-b4-s4096-int8-token-head"]
    assert fused_cases.floor_bytes(case) == 370_147_328 and fused_cases.scale_bytes(case) == 1_048_576
    # NVFP4 prefill: k and v as 64 bytes + 8 block-scale bytes a head vector, 16384 tokens x 8 kv heads each
    nvfp4 = CASES["prefill-b4-s4096-nvfp4"]
    assert fused_cases.floor_bytes(nvfp4) == 16384 * ((32 + 16) * 128 * 2 + 32 * 128 * 2) + 2 * 16384 * 8 * (64 + 8)
    assert fused_cases.scale_bytes(nvfp4) == 2_097_152


@pytest.mark.parametrize("name", FORMAT_CASES)
def test_dry_run_checks_every_implementation_of_a_format_case(name):
    """At tiny shapes, the fused call, both unfused pipelines (torch's quantise) and the compiled chain pass the
    reader's round trip; the fused call rounds the float32 value once (half a spacing of its format)."""
    case = fused_cases.tiny(CASES[name])
    rows = fused.run_case(case, fused.impls("aot_eager"), None, DEVICE, log=lambda line: None)
    assert [r["impl"] for r in rows] == list(fused.IMPL_NAMES)
    for row in rows:
        assert row["status"] == "ok" and row["ok"], row
        assert row["quant_ulps"] is not None and row["quant_ulps"] <= 1.0 and row["error_ratio"] <= 1.0
    assert rows[0]["quant_ulps"] <= 0.5 + 1e-3


@pytest.mark.parametrize("name", ["decode-b64-int8-token-head", "prefill-b4-s4096-fp8-token-head"])
def test_per_token_head_scales_are_checked_against_max_abs_over_the_format_max(name):
    """The scale caches hold max|x| / 127 (int8) or / 448 (e4m3) of each rotated head vector at the token's slot."""
    case = fused_cases.tiny(CASES[name])
    result, data, _ = fused.checked_call(case, fused.impls("aot_eager")["ropekit-fused"], DEVICE, seed=0)
    assert result["ok"], result
    want = fused_cases.expected(fused_cases.make_data(case, DEVICE, seed=0))
    got = fused_cases.actual(data, data.qkv.split([case.heads_q, case.heads_kv, case.heads_kv], dim=2)[0])
    fmt_max = 127.0 if "int8" in name else 448.0
    truth = want["k_cache"].abs().amax(-1) / fmt_max
    torch.testing.assert_close(got["k_scales"].double().cpu(), truth, rtol=1e-6, atol=0)
    assert got["k_cache"].values.dtype == case.cache_dtype


def _forgets_the_scale_caches(data):
    """A wrong pipeline: the rows quantised at their per-(token, head) scales, the scales never written."""
    scale_caches = data.scale_caches
    build = fused.impls("aot_eager")["unfused (index_copy_)"]
    data.scale_caches = tuple(torch.zeros_like(s) for s in scale_caches)  # written elsewhere, not where read
    fn = build(data)
    data.scale_caches = scale_caches
    return fn


def _one_scale_for_every_head(data):
    """A wrong pipeline: the per-head static scales read as one per tensor (head 0's)."""
    per_head = data.scales
    data.scales = tuple(s[:1].clone() for s in per_head)
    fn = fused.impls("aot_eager")["unfused (index_copy_)"](data)
    data.scales = per_head
    return fn


@pytest.mark.parametrize("name, wrong", [("decode-b64-fp8-token-head", _forgets_the_scale_caches),
                                         ("decode-b64-fp8-head", _one_scale_for_every_head)],
                         ids=["scales-not-written", "per-head-read-as-per-tensor"])
def test_a_wrong_quantisation_fails_the_round_trip(name, wrong):
    rows = fused.run_case(fused_cases.tiny(CASES[name]), {"wrong": wrong}, FakeClock(), DEVICE,
                          log=lambda line: None)
    assert rows[0]["status"] == "wrong result" and rows[0]["graph_us"] is None


def _format_doc(decode: bool, fused_us: float, unfused_us: float, floor_us: float = 1.0) -> dict:
    name = "d" if decode else "p"
    return {"cases": [{"name": name, "kind": "cache", "decode": decode, "fp8": True, "quantised": True,
                       "floor_us": floor_us}],
            "rows": [{"case": name, "impl": "ropekit-fused", "graph_us": fused_us, "quant_ulps": 0.5},
                     {"case": name, "impl": "unfused (index_copy_)", "graph_us": unfused_us},
                     {"case": name, "impl": fused.LAUNCH_FLOOR, "graph_us": 1.0}]}


@pytest.mark.parametrize("fused_us, floor_met, speedup_met", [(1.0 / 0.93, True, True), (1.0 / 0.92, False, True),
                                                              (1.0 / 0.95, True, False)],
                         ids=["93%-of-floor-1.6x", "92%-of-floor", "95%-of-floor-1.4x"])
def test_format_prefill_is_judged_at_93pct_of_the_floor_and_1_5x_the_best_unfused(fused_us, floor_met, speedup_met):
    unfused_us = 1.6 * fused_us if speedup_met else 1.4 * fused_us
    targets = {t["target"]: t for t in fused_report.evaluate_targets(_format_doc(False, fused_us, unfused_us))}
    assert targets["prefill >= 93% of the fused byte floor"]["met"] is floor_met
    assert targets[">= 1.5x faster than the best unfused pipeline"]["met"] is speedup_met
    rounding = next(t for t in targets.values() if "rounding" in t["target"])
    assert rounding["value"] == 0.5 and rounding["met"] is True


def test_format_decode_is_judged_against_the_launch_chain_floor_and_1_5x_the_best_unfused():
    targets = {t["target"]: t for t in fused_report.evaluate_targets(_format_doc(True, 1.25, 1.8))}
    assert targets["decode <= 1.3x the launch-chain floor"]["met"] is True
    assert targets[">= 1.5x faster than the best unfused pipeline"]["value"] == pytest.approx(1.8 / 1.25)
    assert targets[">= 1.5x faster than the best unfused pipeline"]["met"] is False
    plain = fused_report.evaluate_targets({"cases": [{"name": "d", "kind": "cache", "decode": False, "fp8": False,
                                                      "floor_us": 1.0}], "rows": []})
    assert {t["target"] for t in plain} == {"prefill >= 95% of the fused byte floor",
                                            ">= 1.3x faster than the best unfused pipeline"}


def test_the_page_states_each_format_case_s_scale_bytes(tmp_path):
    case = fused_cases.tiny(CASES["prefill-b4-s4096-int8-token-head"])
    doc = fused.run([case], fused.impls("aot_eager"), FakeClock(), DEVICE, log=lambda line: None)
    fused_report.publish(doc, tmp_path)
    page = (tmp_path / "benchmarks_fused.md").read_text()
    assert doc["cases"][0]["scale_bytes"] == 2 * 16 * 2 * 4  # 16 tokens, 2 kv heads, k and v
    assert "per-(token, head) scales written: 0.3 kB" in page
    assert "prefill >= 93% of the fused byte floor" in page


def test_a_nan_output_is_a_wrong_result():
    """NaN compares false with everything: the check counts it as an infinite error, not as no error."""
    case = fused_cases.tiny(CASES["decode-b64"])

    def writes_nan(data):
        fn = fused.impls("aot_eager")["ropekit-fused"](data)
        return lambda: fn().fill_(float("nan"))

    rows = fused.run_case(case, {"nan": writes_nan}, FakeClock(), DEVICE, log=lambda line: None)
    assert rows[0]["status"] == "wrong result" and rows[0]["error_ratio"] == float("inf")


# --- NVFP4: e2m1 values two a byte, an e4m3 block scale per 16 channels, a global scale ----------------------------

def test_nvfp4_inputs_are_byte_caches_with_block_scale_caches_and_global_scales():
    case = fused_cases.tiny(CASES["decode-b64-nvfp4"])
    data = fused_cases.make_data(case, DEVICE, seed=0)
    blocks = data.k_cache.shape[0]
    assert data.k_cache.shape == (blocks, fused_cases.BLOCK_SIZE, 2, 16) and data.k_cache.dtype == torch.uint8
    assert [s.shape for s in data.scale_caches] == [(blocks, fused_cases.BLOCK_SIZE, 2, 2)] * 2
    assert {s.dtype for s in data.scale_caches} == {torch.float8_e4m3fn}
    assert [s.tolist() for s in data.scales] == [[2.0**-8]] * 2


@pytest.mark.parametrize("name", ["decode-b64-nvfp4", "prefill-b4-s4096-nvfp4"])
def test_nvfp4_block_scales_are_checked_against_the_reference(name):
    """The block-scale caches hold e4m3(amax / (6 g)) of each 16 channels of the rotated k (and of v) at the token's
    slot: v's exactly (the same float32 quotient, rounded once), k's within one e4m3 step (its float32 rotation)."""
    case = fused_cases.tiny(CASES[name])
    result, data, fn = fused.checked_call(case, fused.impls("aot_eager")["ropekit-fused"], DEVICE, seed=0)
    assert result["ok"] and result["quant_ulps"] <= 0.5 + 1e-3, result
    want = fused_cases.expected(fused_cases.make_data(case, DEVICE, seed=0))
    got = fused_cases.actual(data, data.split()[0])
    assert isinstance(got["k_cache"], fused_cases.StoredNvfp4) and got["k_cache"].values.shape[-1] == 16
    assert torch.equal(got["v_block_scales"].double().cpu(), want["v_block_scales"])
    step = fused_cases.spacing(want["k_block_scales"], torch.float8_e4m3fn)
    assert bool(((got["k_block_scales"].double().cpu() - want["k_block_scales"]).abs() <= step).all())
    assert float(want["k_block_scales"].min()) >= 2.0**-6  # normal e4m3 numbers at the global scale chosen


def test_the_unfused_nvfp4_pipeline_stores_the_fused_kernel_s_bytes_for_v():
    """torch's float32 quantiser (amax per 16, e4m3 block scale, e2m1 rounding, two nibbles a byte) stores v, which
    passes through untouched, as the fused kernel does: the same bytes and block scales at every slot."""
    case = fused_cases.tiny(CASES["prefill-b4-s4096-nvfp4"])
    stored = {}
    for impl in ("ropekit-fused", "unfused (index_copy_)", "unfused (index_put_)", "torch.compile"):
        result, data, _ = fused.checked_call(case, fused.impls("aot_eager")[impl], DEVICE, seed=0)
        assert result["ok"], (impl, result)
        stored[impl] = (data.v_cache.cpu(), data.scale_caches[1].view(torch.uint8).cpu())
    fused_v = stored.pop("ropekit-fused")
    for impl, (v_cache, v_blocks) in stored.items():
        assert torch.equal(v_cache, fused_v[0]) and torch.equal(v_blocks, fused_v[1]), impl


E2M1_TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -2.5, -5.0, 0.0, -0.0, 0.2, 5.1]


def test_the_torch_nvfp4_quantiser_rounds_as_the_format_does():
    """The unfused pipelines' quantiser against the float64 reference's: ties to the even code, signed zeros, the
    block scale e4m3(amax / (6 g)); a random block (its quotients rounded in float32) and a block of zeros."""
    ties = torch.tensor(E2M1_TIES)
    rows = torch.stack([ties, torch.randn(16, generator=torch.Generator().manual_seed(0)) * 3, torch.zeros(16)])
    global_scale = torch.tensor([1.0])
    packed, block_scales = fused.torch_nvfp4(rows, global_scale)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 8) and block_scales.shape == (3, 1)
    values, want_blocks = fused_cases.reference.nvfp4_quantise(rows, 1.0)
    assert torch.equal(block_scales.view(torch.float8_e4m3fn).double(), want_blocks)
    read = fused_cases.reference.nvfp4_dequantise(packed, block_scales, 1.0)
    want = values * want_blocks.repeat_interleave(16, -1)
    assert torch.equal(read, want) and torch.equal(torch.signbit(read), torch.signbit(want))


def _corrupt(what):
    """A wrong pipeline: the fused call, then one byte at the first sampled token's slot changed."""
    def build(data):
        fn = fused.impls("aot_eager")["ropekit-fused"](data)
        cache = {"k-value": data.k_cache, "v-value": data.v_cache,
                 "k-block-scale": data.scale_caches[0].view(torch.uint8)}[what]

        def call():
            out = fn()
            row = cache.view(-1, *cache.shape[2:])[data.slots[0]]
            row[0, 0] ^= 0x42  # a nibble's magnitude bits (a value), or the block scale's exponent
            return out
        return call
    return build


@pytest.mark.parametrize("what", ["k-value", "v-value", "k-block-scale"])
def test_a_corrupted_nvfp4_byte_fails_the_check(what):
    rows = fused.run_case(fused_cases.tiny(CASES["decode-b64-nvfp4"]), {"wrong": _corrupt(what)}, FakeClock(),
                          DEVICE, log=lambda line: None)
    assert rows[0]["status"] == "wrong result" and rows[0]["graph_us"] is None, rows[0]


def test_block_scales_twice_too_coarse_fail_the_check_though_they_read_back_consistently(monkeypatch):
    """A quantiser that maps a block's amax to 3 instead of 6 is self-consistent (every value reads back within half
    a spacing of its own, too coarse, block scale: the round trip alone passes it); the block scales, one e4m3
    binade above the reference's, fail it."""
    monkeypatch.setattr(fused, "E2M1_MAX", 3.0)
    coarse = fused.impls("aot_eager")["unfused (index_copy_)"]
    rows = fused.run_case(fused_cases.tiny(CASES["decode-b64-nvfp4"]), {"coarse": coarse}, FakeClock(), DEVICE,
                          log=lambda line: None)
    assert rows[0]["quant_ulps"] <= 0.5 + 0.01  # (the bf16 rotation's own rounding)
    assert rows[0]["status"] == "wrong result" and rows[0]["error_ratio"] > 4, rows[0]


def test_the_nvfp4_cases_are_judged_by_the_formats_targets(tmp_path):
    cases = [fused_cases.tiny(CASES[n]) for n in ("decode-b64-nvfp4", "prefill-b4-s4096-nvfp4")]
    doc = fused.run(cases, fused.impls("aot_eager"), FakeClock(), DEVICE, log=lambda line: None)
    fused_report.publish(doc, tmp_path)
    assert all(r["status"] in ("ok", "reference") for r in doc["rows"]), doc["rows"]
    targets = {(t["case"].split("-")[0], t["target"]) for t in doc["targets"]}
    rounding = next(t for t in doc["targets"] if "rounding" in t["target"])["target"]
    assert {("decode", "decode <= 1.3x the launch-chain floor"), ("prefill", "prefill >= 93% of the fused byte floor"),
            ("decode", ">= 1.5x faster than the best unfused pipeline"), ("decode", rounding),
            ("prefill", ">= 1.5x faster than the best unfused pipeline"), ("prefill", rounding)} <= targets
    page = (tmp_path / "benchmarks_fused.md").read_text()
    assert "NVFP4's block scales written: 0.1 kB" in page  # 16 tokens, 2 kv heads, 2 blocks, k and v


TABLE_FREE = ("mla-decode-b64-no-table", "decode-b64-nope", "prefill-b4-s4096-nope")


@pytest.mark.parametrize("name", TABLE_FREE)
def test_cases_without_a_table_are_checked_far_out_against_their_own_angles(name):
    """MLA's angles from inv_freq and Llama 4's NoPE layer: every implementation (the fused call, the unfused chains,
    torch.compile of the chain) matches the float64 reference of the case's own angles at positions no table of the
    benchmark reaches, and the floor leaves out no cos/sin rows."""
    case = fused_cases.tiny(CASES[name])
    assert case.angles in ("inv_freq", "nope")
    data = fused_cases.make_data(case, DEVICE, seed=1)
    assert int(data.token_positions.min()) >= 0 and int(data.token_positions.max()) < fused_cases.FAR_POSITIONS
    assert fused_cases.meta_bytes(case) == case.tokens * 16
    for impl, build in fused.impls("aot_eager").items():
        result, _, _ = fused.checked_call(case, build, DEVICE, seed=1)
        assert result["ok"], (impl, result)


def test_a_nope_case_is_judged_by_its_temperature_not_a_rotation():
    """The check can fail: a NoPE case's q rotated by the table instead of scaled is refused."""
    case = fused_cases.tiny(CASES["decode-b64-nope"])
    data = fused_cases.make_data(case, DEVICE, seed=2)
    want = fused_cases.expected(data)
    q, k, v = data.split()
    ropekit.apply_rope(q, k, data.cos, data.sin, positions=data.offsets % fused_cases.TABLE_POSITIONS,
                       inplace=True)
    got = fused_cases.actual(data, q)
    got["k_cache"], got["v_cache"] = (want["k_cache"], want["v_cache"])
    assert not fused_cases.check(data, want, got)["ok"]


DS_MLA = ("mla-decode-b64-ds-mla", "mla-prefill-b4-s4096-ds-mla")


@pytest.mark.parametrize("name", DS_MLA)
def test_fp8_ds_mla_cases_are_checked_through_the_entry_reader(name):
    """DeepSeek's fp8_ds_mla entry: every implementation (the fused call, torch's writer after ropekit's rotation,
    torch.compile of the chain) is read back through the entry's reader within its format's rounding, and the floor
    counts the 656-byte entry."""
    case = CASES[name]
    assert case.ds_mla and case.entry_bytes == 656 and case.format.startswith("fp8_ds_mla")
    assert fused_cases.floor_bytes(case) == case.tokens * ((2 * 128 * 64 + 2 * 64 + 512) * 2 + 656)
    assert fused_cases.static_scale_bytes(case) == 0
    tiny = fused_cases.tiny(case)
    for impl, build in fused.impls("aot_eager").items():
        result, _, _ = fused.checked_call(tiny, build, DEVICE, seed=3)
        assert result["ok"] and result["quant_ulps"] is not None, (impl, result)
        if impl == "ropekit-fused":
            assert result["quant_ulps"] <= 0.5 + 1e-3


def test_fp8_ds_mla_check_fails_for_a_wrong_tile_scale():
    """The check can fail: an entry whose first tile's scale is doubled reads kv_c back a factor of two off."""
    case = fused_cases.tiny(CASES["mla-decode-b64-ds-mla"])
    data = fused_cases.make_data(case, DEVICE, seed=4)
    want = fused_cases.expected(data)
    result = fused.impls("aot_eager")["ropekit-fused"](data)()
    scales = data.k_cache.reshape(-1, case.entry_bytes)[:, 128:132].view(torch.float32)
    scales.mul_(2.0)
    assert not fused_cases.check(data, want, fused_cases.actual(data, result))["ok"]


def test_each_cases_compiled_chain_is_compiled_past_dynamos_recompile_limit():
    """torch.compile's row compiles every case's chain: twelve cache cases in a row (past dynamo's recompile limit of
    8, where a chain would run uncompiled under the row's name) each reach the compiler."""
    compiled = []

    def counting(gm, example_inputs):  # a backend that records each graph it is given and runs it as traced
        compiled.append(gm)
        return gm.forward

    build = fused.impls(counting)["torch.compile"]
    names = [c.name for c in fused_cases.CASES if c.kind == "cache"][:12]
    for i, name in enumerate(names):
        before = len(compiled)
        result, _, _ = fused.checked_call(fused_cases.tiny(CASES[name]), build, DEVICE, seed=0)
        assert result["ok"] and len(compiled) > before, (i, name)
