"""The benchmark harness as a specification: the case table, byte counting, what each implementation adapter
computes, the loop and its rows, the JSON document, plots and the generated markdown — and that nothing is timed
without a GPU. No timing is asserted anywhere: on the CPU the clock is a fake that says so.
"""

import contextlib
import gc
import importlib
import json
import math
import time
import weakref
from pathlib import Path

import pytest
import torch
from conftest import ON_GPU, gpu_only

import ropekit
from ropekit import bench
from ropekit.bench import cases as bench_cases
from ropekit.bench.floor import dependent_launch_available
from ropekit.bench.impls import BACKWARD, FORWARD, make_impls
from ropekit.bench.inputs import check_outputs, expected_output, make_data, make_tables
from ropekit.bench.markdown import BLOCK_NAMES, targets, write_markdown
from ropekit.bench.report import make_document, validate_document, write_json
from ropekit.bench.runner import ROW_FIELDS, Runner, derive_metrics, dram_sets, residencies

MAIN = {c.name: c for c in bench.MAIN_CASES}
MiB = 2**20


# --------------------------------------------------------------------------------------------------------------------
# The case table is the one the peers were measured on (clarifications.md, "Measuring")
# --------------------------------------------------------------------------------------------------------------------

SPEC = {  # name: (layout, batch, seq, heads_q, heads_k, head_dim, dtype, rotary, interleaved, positions)
    "llama3-8b-prefill": ("bshd", 4, 4096, 32, 8, 128, torch.bfloat16, 128, False, "none"),
    "small-prefill": ("bshd", 1, 512, 32, 8, 128, torch.bfloat16, 128, False, "none"),
    "decode": ("bshd", 64, 1, 32, 8, 128, torch.bfloat16, 128, False, "offsets"),
    "mha-fp16": ("bshd", 8, 2048, 64, 64, 128, torch.float16, 128, False, "none"),
    "fp32": ("bshd", 2, 2048, 32, 32, 64, torch.float32, 64, False, "none"),
    "gptj-interleaved": ("bshd", 4, 4096, 32, 8, 128, torch.bfloat16, 128, True, "none"),
    "partial-rotary": ("bshd", 4, 4096, 32, 8, 128, torch.bfloat16, 64, False, "none"),
    "partial-rotary-inplace": ("bshd", 4, 4096, 32, 8, 128, torch.bfloat16, 64, False, "none"),
    "varlen": ("thd", 8, 4096, 32, 8, 128, torch.bfloat16, 128, False, "none"),
}


@pytest.mark.parametrize("name", list(SPEC))
def test_main_case_matches_the_specification(name):
    case = MAIN[name]
    got = (case.layout, case.batch, case.seqlen, case.heads_q, case.heads_k, case.head_dim, case.dtype, case.rotary,
           case.interleaved, case.positions)
    assert got == SPEC[name]


def test_main_cases_are_exactly_the_specified_ones_and_large_ones_time_the_backward():
    assert set(MAIN) == set(SPEC)
    assert {n for n, c in MAIN.items() if c.backward} == {"llama3-8b-prefill", "mha-fp16", "fp32"}
    assert bench_cases.TABLE_POSITIONS == 8192 and bench_cases.ROPE_BASE == 10000.0


def test_sweep_is_the_seed_grid_in_its_own_group():
    sweep = bench.sweep_cases()
    assert len(sweep) == 30 * 4
    assert sorted({c.seqlen for c in sweep}) == list(range(256, 3969, 128))
    assert sorted({c.batch for c in sweep}) == [1, 2, 4, 8]
    assert all((c.group, c.layout, c.heads_q, c.heads_k, c.head_dim, c.dtype) ==
               ("sweep", "sbhd", 64, 64, 128, torch.float16) for c in sweep)
    assert not any(c.group == "sweep" for c in bench.select_cases(("main",)))


@pytest.mark.parametrize("names, expected", [
    (["decode"], ["decode"]),
    (["sweep-b8-s256", "fp32"], ["fp32", "sweep-b8-s256"]),
    (["sweep-b1-*"], [f"sweep-b1-s{s}" for s in range(256, 3969, 128)]),
], ids=["one", "two", "prefix"])
def test_select_cases_by_name(names, expected):
    assert [c.name for c in bench.select_cases(("main",), names)] == expected


def test_select_unknown_case_names_it():
    with pytest.raises(ValueError, match="nope"):
        bench.select_cases(("main",), ["nope"])


# --------------------------------------------------------------------------------------------------------------------
# Bytes: q and k read once and written once; partial rotary in place counts only the rotary part
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, inplace, expected", [
    ("llama3-8b-prefill", False, 2 * 4 * 4096 * (32 + 8) * 128 * 2),
    ("llama3-8b-prefill", True, 2 * 4 * 4096 * (32 + 8) * 128 * 2),
    ("decode", False, 2 * 64 * 1 * (32 + 8) * 128 * 2),
    ("mha-fp16", False, 2 * 8 * 2048 * (64 + 64) * 128 * 2),
    ("fp32", False, 2 * 2 * 2048 * (32 + 32) * 64 * 4),
    ("partial-rotary", False, 2 * 4 * 4096 * (32 + 8) * 128 * 2),  # out of place: the tail is copied too
    ("partial-rotary-inplace", True, 2 * 4 * 4096 * (32 + 8) * 64 * 2),  # in place: only the rotary part moves
    ("varlen", False, 2 * 16384 * (32 + 8) * 128 * 2),
])
def test_moved_bytes(name, inplace, expected):
    assert MAIN[name].moved_bytes(inplace) == expected


def test_eager_formula_bytes_model():
    full, partial = MAIN["llama3-8b-prefill"], MAIN["partial-rotary"]
    assert full.eager_formula_bytes() == 10 * full.qk_bytes == 5 * full.moved_bytes()
    assert partial.eager_formula_bytes() == 10 * partial.qk_bytes // 2 + 2 * partial.qk_bytes


def test_small_cases_get_an_l2_and_a_dram_number_and_every_dram_row_enough_buffers_to_exceed_l2():
    l2 = 50 * MiB
    assert residencies(MAIN["small-prefill"], l2) == ("l2", "dram")
    assert residencies(MAIN["decode"], l2) == ("l2", "dram")
    assert residencies(MAIN["llama3-8b-prefill"], l2) == ("dram",)
    assert residencies(MAIN["fp32"], l2) == ("dram",)
    for name in ("small-prefill", "decode", "fp32", "llama3-8b-prefill"):
        # fp32 (67 MB of q and k) and Llama (167 MB) exceed L2 but not 4x L2: in place they would find part of the
        # previous call's lines in L2, so they rotate too
        case = MAIN[name]
        assert dram_sets(case, l2, 4.0) > 1 and dram_sets(case, l2, 4.0) * case.qk_bytes > 4 * l2
    assert dram_sets(MAIN["mha-fp16"], l2, 4.0) == 1  # 537 MB of q and k: one set is enough


# --------------------------------------------------------------------------------------------------------------------
# Without a GPU nothing is timed
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(ON_GPU, reason="the refusal is what a machine without a GPU does")
def test_refuses_to_time_without_a_gpu(capsys):
    assert bench.main(["--quick"]) == 2
    assert "not a benchmark" in capsys.readouterr().err
    with pytest.raises(bench.BenchRefused, match="interpreter"):
        bench.run(["decode"], ["ropekit"])


def test_list_works_anywhere(capsys):
    assert bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SPEC) and all(name in out for name in bench.IMPL_NAMES)


# --------------------------------------------------------------------------------------------------------------------
# Every adapter computes the rotation the case asks for (tiny shapes, Triton interpreter on the CPU)
# --------------------------------------------------------------------------------------------------------------------

def _tiny(case):
    """Same layout, positions, pairing and dtype at a size the interpreter runs in milliseconds."""
    rotary = None if case.rotary_dim is None else 16
    if case.layout == "thd":
        return case.scaled_down(batch=3, seqlen=7, seq_lens=(7, 3, 5), heads_q=4, heads_k=2, head_dim=32,
                                rotary_dim=rotary)
    batch, seqlen = (3, 1) if case.name == "decode" else (2, 8)
    head_dim = 16 if case.head_dim == 64 else 32
    return case.scaled_down(batch=batch, seqlen=seqlen, heads_q=4, heads_k=2 if case.heads_k < case.heads_q else 4,
                            head_dim=head_dim, rotary_dim=rotary)


TINY = [_tiny(c) for c in bench.MAIN_CASES] + [c.scaled_down(heads_q=4, heads_k=4, head_dim=32)
                                                for c in bench.sweep_cases((8,), (1, 2))]
IMPLS = {impl.name: impl for impl in make_impls()}
ADAPTER_ITEMS = [(case, name, direction) for case in TINY for name in IMPLS if name != "ropekit-cuda"
                 for direction in ((FORWARD, BACKWARD) if case.backward else (FORWARD,))
                 if direction in IMPLS[name].directions]


@pytest.fixture
def cpu_flash_attn(monkeypatch):
    """flash-attention's wrapper enters torch.cuda.device(x.device.index), which fails for CPU tensors."""
    if not ON_GPU:
        monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())


@pytest.mark.parametrize("case, impl_name, direction", ADAPTER_ITEMS,
                         ids=[f"{c.name}-{i}-{d}" for c, i, d in ADAPTER_ITEMS])
def test_adapter_computes_the_rotation(case, impl_name, direction, cpu_flash_attn):
    impl = IMPLS[impl_name]
    if impl_name == "torch-compile" and (not ON_GPU or case.name != "llama3-8b-prefill"):
        pytest.skip("a compile per case is too slow for the test budget; it compiles torch-eager's formula, tested "
                    "here (on the GPU: compiled once, for llama3-8b-prefill)")
    reason = impl.available() or impl.supports(case, direction)
    if reason:
        pytest.skip(reason)
    if impl_name == "liger" and case.dtype == torch.bfloat16 and not ON_GPU:
        # Liger computes in the dtype of cos/sin (bf16 here); the Triton interpreter's bf16 arithmetic yields NaNs.
        case = case.scaled_down(dtype=torch.float16)
    device = ropekit.device.DEVICE
    tables = make_tables(case, device)
    data = make_data(case, device, seed=7, backward=direction == BACKWARD)
    sources = (data.grad_q, data.grad_k) if direction == BACKWARD else (data.q, data.k)
    # float64 ropekit.reference agrees with the harness's own float32 expectation ...
    positions = tables.positions.cpu()
    for x in sources:
        ref64 = ropekit.reference.rope(x, positions, rotary_dim=case.rotary, interleaved=case.interleaved,
                                       conjugate=direction == BACKWARD)
        mine = expected_output(case, tables, x, conjugate=direction == BACKWARD)
        torch.testing.assert_close(mine.double().cpu(), ref64, rtol=1e-6, atol=1e-6)
    expected = [expected_output(case, tables, x, conjugate=direction == BACKWARD) for x in sources]
    context = torch.no_grad() if direction == FORWARD else contextlib.nullcontext()
    with context:
        prepared = impl.build(case, tables, data, direction)
        outputs = prepared.outputs(prepared.fn())
    error, message = check_outputs(case, outputs, expected)
    assert message is None, message
    # ... and the check itself fails on a wrong answer: a token rotated by a neighbour's angle.
    wrong = [o.clone() for o in outputs]
    wrong[0][(0,) * (wrong[0].ndim - 2)] = outputs[0][(-1,) * (wrong[0].ndim - 2)]
    if case.n_tokens > 1:
        assert check_outputs(case, wrong, expected)[1] is not None


def _torch_launcher(x, cos, sin, out):
    """A stand-in with the v1..v3 launcher signature (plain torch: positions 0..S-1, NeoX), to test the plumbing."""
    c, s = cos[: x.shape[1]][None, :, None, :], sin[: x.shape[1]][None, :, None, :]
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    out.copy_(torch.cat((a * c - b * s, b * c + a * s), dim=-1))
    return out


@pytest.mark.parametrize("case", [_tiny(MAIN["small-prefill"]), TINY[-2], TINY[-1]],
                         ids=lambda c: f"{c.layout}-b{c.batch}")
@pytest.mark.parametrize("version", [1, 2])
def test_ladder_adapter_plumbing(case, version, monkeypatch):
    case = case.scaled_down(dtype=torch.float32)  # v1 takes float32 only
    # the rung's launcher, as the adapter finds it by name, replaced by the stand-in
    monkeypatch.setattr(importlib.import_module(f"ropekit.triton.v{version}"), f"rope_v{version}", _torch_launcher)
    impl = bench.impls.TritonLadder(version)
    assert impl.available() is None
    reason = impl.supports(case, FORWARD)
    if version == 1 and case.layout == "sbhd" and case.batch > 1:
        assert reason == "contiguous (batch, seq, heads, head_dim) only"
        return
    assert reason is None
    tables = make_tables(case, "cpu")
    data = make_data(case, "cpu", seed=3)
    expected = [expected_output(case, tables, x) for x in (data.q, data.k)]
    prepared = impl.build(case, tables, data, FORWARD)
    assert check_outputs(case, prepared.outputs(prepared.fn()), expected)[1] is None


def test_inputs_are_fresh_random_and_never_zero():
    case = _tiny(MAIN["small-prefill"])
    first, second = make_data(case, "cpu", 1), make_data(case, "cpu", 2)
    assert bool((first.q != 0).any()) and not torch.equal(first.q, second.q)
    assert torch.equal(first.q, make_data(case, "cpu", 1).q)  # seeded: reruns compare the same numbers


def test_decode_offsets_stay_inside_the_table():
    tables = make_tables(MAIN["decode"], "cpu")
    assert tables.offsets.shape == (64,) and int(tables.offsets.max()) < 8192 and int(tables.offsets.min()) >= 0
    assert tables.cos_rows.shape == (64, 1, 128) and tables.cos_rows.dtype == torch.bfloat16


# --------------------------------------------------------------------------------------------------------------------
# The loop, its rows, the JSON, the plots and the page — with a fake clock on the CPU
# --------------------------------------------------------------------------------------------------------------------

class FakeClock:
    """Not a measurement: calls every function once (so every buffer set is built and run) and returns made-up
    times, different per implementation, so that the derived numbers can be checked."""

    def __init__(self, l2_bytes):
        self.l2 = l2_bytes
        self.calls = 0
        self.captured = 0
        self.replayed = []  # graphs per replay_rounds call (one call per case and direction)

    def l2_bytes(self):
        return self.l2, "fake"

    def copy_ceiling(self):
        return {"gbps": 1000.0, "time_us": 2.0, "bytes_read": 1000, "bytes_written": 1000, "method": "fake"}

    def _run(self, fns):
        for fn in fns:
            fn()
            self.calls += 1

    def do_bench_us(self, fn, warmup_ms, rep_ms):
        self._run([fn])
        return 10.0 + len(fn.__class__.__name__)

    def graph_us(self, fns, estimate_us):
        self._run(fns)
        return estimate_us * 0.9, 0.01, len(fns)

    def capture(self, fns, estimate_us):
        self._run(fns)
        self.captured += 1
        # a real graph replays these calls' kernels on their buffers later: they must outlive the capture
        return (estimate_us, len(fns), [weakref.ref(fn) for fn in fns])

    def replay_rounds(self, graphs):
        self.replayed.append(len(graphs))
        gc.collect()
        assert all(ref() is not None for _, _, refs in graphs for ref in refs), "a captured call was freed"
        return [(estimate_us * 0.9, 0.01, calls) for estimate_us, calls, _ in graphs]

    def eager_us(self, fns, estimate_us):
        self._run(fns)
        return estimate_us * 1.5, 0.02, len(fns)


@pytest.fixture(scope="module")
def fake_run():
    """One fake-clock run shared by the tests below (they copy the document before changing it)."""
    small = _tiny(MAIN["small-prefill"])
    large = _tiny(MAIN["llama3-8b-prefill"]).scaled_down(seqlen=16)  # twice the small one: does not fit the fake L2
    sweep = bench.sweep_cases((8,), (1,))[0].scaled_down(heads_q=4, heads_k=4, head_dim=32)
    cases = [small, large, sweep]
    impls = [IMPLS[n] for n in ("triton-v1", "triton-v4", "ropekit", "ropekit-inplace", "torch-eager")]
    clock = FakeClock(l2_bytes=small.working_set_bytes)  # small fits, large does not
    runner = Runner(cases, impls, settings=bench.QUICK, timer=clock, device=ropekit.device.DEVICE,
                    progress=bench.runner.Progress(1, enabled=False))
    rows = derive_metrics(runner.run(), 1000.0, runner.launch_floors)
    impl_info = [{"name": i.name, "label": i.label, "kind": i.kind, "unavailable": runner.unavailable[i.name],
                  "info": i.info()} for i in impls]
    doc = make_document(command="fake", settings=bench.QUICK.to_json(), environment={
        "python": "3", "torch": torch.__version__, "triton": "x", "ropekit": ropekit.__version__},
        copy_ceiling=clock.copy_ceiling(), l2_bytes=clock.l2, cases=cases, impls=impl_info, rows=rows, complete=True,
        copy_floors=runner.copy_floors, launch_floors=runner.launch_floors)
    return doc, runner, clock, cases


def _copy(doc):
    return json.loads(json.dumps(doc))


def test_runner_rows_follow_the_schema(fake_run):
    doc, runner, clock, (small, large, sweep) = fake_run
    rows = doc["rows"]
    assert all(set(r) == set(ROW_FIELDS) for r in rows)
    # one item per case x direction x implementation; small cases have an L2 and a DRAM row
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["case"], r["residency"]) for r in ok if r["impl"] == "ropekit"} == {
        (small.name, "l2"), (small.name, "dram"), (large.name, "dram"), (sweep.name, "dram")}
    dram_small = next(r for r in ok if r["impl"] == "ropekit" and r["case"] == small.name and r["residency"] == "dram")
    assert dram_small["n_buffer_sets"] == dram_sets(small, clock.l2, bench.QUICK.dram_factor) > 1
    assert dram_small["graph_calls"] == dram_small["n_buffer_sets"]  # every set was captured and run
    backward = [r for r in ok if r["direction"] == "backward"]
    assert {r["impl"] for r in backward} == {"triton-v4", "ropekit", "torch-eager"}
    # autograd's backward is captured too (on the runner's side stream): every backward row has the graph clock
    assert all(r["time_source"] == "graph" and r["graph_us"] is not None for r in backward)
    # the same-bytes copy floor: measured for the large (DRAM) main case only
    assert set(runner.copy_floors) == {large.name}
    floor = runner.copy_floors[large.name]
    assert floor["graph_us"] > 0 and floor["bytes"] == large.moved_bytes(inplace=False)
    # a case larger than L2 but not than dram_factor x L2 rotates buffer sets in its DRAM rows, the floor alike
    large_sets = dram_sets(large, clock.l2, bench.QUICK.dram_factor)
    assert large_sets > 1 and floor["n_buffer_sets"] == large_sets
    assert {r["n_buffer_sets"] for r in ok if r["case"] == large.name} == {large_sets}
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all(r["reason"] for r in skipped)
    # graphs are captured per row and timed together, one replay_rounds call per case and direction holding every
    # implementation's graphs (so that drift over the run reaches them alike)
    # (and the small case's forward rounds hold its launch-chain floor too, and on a GPU that launches grids
    # programmatically the same chain launched that way)
    graph_rows = [r for r in ok if r["graph_us"] is not None]
    floors = 1 + ("dependent" in runner.launch_floors[small.name])
    assert floors == 1 + dependent_launch_available(ropekit.device.DEVICE)
    assert clock.captured == sum(clock.replayed) == len(graph_rows) + floors
    groups = {(r["case"], r["direction"]) for r in graph_rows}
    assert sorted(clock.replayed) == sorted(sum(1 for r in graph_rows if (r["case"], r["direction"]) == g)
                                            + floors * (g == (small.name, "forward")) for g in groups)
    for row in ok:
        assert row["gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)
        assert row["pct_ceiling"] == pytest.approx(100 * row["gbps"] / 1000.0)
        assert row["fastest_peer"] == "torch-eager"  # the only peer here
        peer = next(r for r in ok if r["impl"] == "torch-eager" and r["case"] == row["case"]
                    and r["direction"] == row["direction"] and r["residency"] == row["residency"])
        assert row["vs_fastest_peer"] == pytest.approx(row["time_us"] / peer[f"{row['time_source']}_us"])
    validate_document(json.loads(json.dumps(doc)))


def test_the_small_cases_rows_are_divided_by_the_launch_chain_floor_of_their_own_rounds(fake_run):
    doc, runner, clock, (small, large, sweep) = fake_run
    assert set(doc["launch_floors"]) == {small.name}  # the large case and the sweep have none
    floor = doc["launch_floors"][small.name]
    assert floor["graph_us"] > 0 and floor["residency"] == "l2" and "64-program" in floor["method"]
    for row in doc["rows"]:
        if row["status"] == "ok" and row["case"] == small.name and row["graph_us"] is not None:
            assert row["vs_launch_floor"] == pytest.approx(row["graph_us"] / floor["graph_us"])
        else:
            assert row["vs_launch_floor"] is None


@pytest.mark.parametrize("seed", [0, 1])
def test_the_launch_chain_floor_copies_the_table_row_at_each_position(seed):
    from ropekit.bench import floor

    chain = floor.launch_chain(ropekit.device.DEVICE, seed)
    assert chain.positions.dtype == torch.int64 and chain.positions.shape == (floor.PROGRAMS,)
    assert int(chain.positions.max()) < floor.TABLE_ROWS and chain.positions.unique().numel() > floor.PROGRAMS // 2
    assert chain.table.shape == (floor.TABLE_ROWS, floor.ROW) and chain.table.dtype == torch.float32
    assert torch.equal(chain(), chain.table[chain.positions])
    chain.table.mul_(2)  # the chain reads the table on every call
    assert torch.equal(chain(), chain.table[chain.positions])


def test_a_floor_kernel_that_writes_the_wrong_row_is_refused(monkeypatch):
    from ropekit.bench import floor

    chain = floor.LaunchChain(ropekit.device.DEVICE)
    monkeypatch.setattr(floor.LaunchChain, "__call__", lambda self: self.table[: floor.PROGRAMS].clone())
    with pytest.raises(RuntimeError, match="wrong rows"):
        chain.check()


def test_a_document_from_before_the_launch_floor_still_validates(fake_run):
    doc = _copy(fake_run[0])
    for row in doc["rows"]:
        row.pop("vs_launch_floor")
    doc.pop("launch_floors")
    validate_document(doc)
    assert not [c for c in targets(doc) if "launch-chain" in c["target"] and c["met"] is not None]


@pytest.mark.parametrize("mutation, message", [
    (lambda d: d.pop("copy_ceiling"), "lacks"),
    (lambda d: d["rows"][0].pop("gbps"), "lacks"),
    (lambda d: d["rows"][0].update(status="fine"), "status"),
    (lambda d: next(r for r in d["rows"] if r["status"] == "ok").update(gbps=1.0), "gbps"),
    (lambda d: next(r for r in d["rows"] if r["status"] != "ok").update(reason=None), "say why"),
], ids=["no-ceiling", "row-field", "status", "gbps-inconsistent", "skip-without-reason"])
def test_validation_rejects_broken_documents(fake_run, mutation, message):
    doc = _copy(fake_run[0])
    mutation(doc)
    with pytest.raises(ValueError, match=message):
        validate_document(doc)


def test_json_plots_and_markdown_from_one_document(fake_run, tmp_path):
    doc = fake_run[0]
    json_path = write_json(doc, tmp_path / "benchmarks.json")
    assert bench.load_document(json_path) == json.loads(json_path.read_text())
    assert bench.main(["--render", str(json_path), "--out", str(tmp_path)]) == 0
    for name in ("benchmarks_forward.png", "benchmarks_small.png", "benchmarks_backward.png",
                 "benchmarks_sweep.png"):
        assert (tmp_path / name).stat().st_size > 1000
    page = (tmp_path / "benchmarks.md").read_text()
    assert all(f"<!-- bench:{n} -->" in page and f"<!-- /bench:{n} -->" in page for n in BLOCK_NAMES)
    row = next(r for r in doc["rows"] if r["status"] == "ok" and r["impl"] == "ropekit" and r["group"] == "main")
    assert f"{row['gbps']:.0f}" in page and f"{row['pct_ceiling']:.1f}%" in page  # numbers come from the JSON
    assert "![forward GB/s per case](benchmarks_forward.png)" in page
    # the small case's table divides by its launch-chain floor; the large case's table has no such column
    floored = next(r for r in doc["rows"] if r["case"] == "small-prefill" and r["vs_launch_floor"])
    assert f"{floored['vs_launch_floor']:.2f}x" in page and "The launch-chain floor (64 programs" in page
    large_table = page.split(f"### {fake_run[3][1].name}")[1].split("###")[0]
    assert "launch floor" not in large_table


def test_render_writes_every_file_to_out_and_none_next_to_the_json(fake_run, tmp_path):
    """Rendering the published JSON into a scratch directory leaves the committed figures beside it alone."""
    published, out = tmp_path / "published", tmp_path / "out"
    json_path = write_json(fake_run[0], published / "benchmarks.json")
    assert bench.main(["--render", str(json_path), "--out", str(out)]) == 0
    assert sorted(p.name for p in published.iterdir()) == ["benchmarks.json"]
    assert sorted(p.name for p in out.iterdir()) == ["benchmarks.md", "benchmarks_backward.png",
                                                     "benchmarks_forward.png", "benchmarks_small.png",
                                                     "benchmarks_sweep.png"]


def test_markdown_keeps_the_prose_and_is_idempotent(fake_run, tmp_path):
    doc = fake_run[0]
    json_path = write_json(doc, tmp_path / "data" / "benchmarks.json")
    md = tmp_path / "page.md"
    md.write_text("# Title\n\nHand-written prose.\n\n<!-- bench:targets -->\nstale\n<!-- /bench:targets -->\n\nEnd.\n")
    first = write_markdown(json_path, md)
    assert first.startswith("# Title\n\nHand-written prose.") and first.endswith("End.\n") and "stale" not in first
    assert write_markdown(json_path, md) == first


def test_targets_read_the_issue_thresholds():
    def row(impl, kind, case, direction, residency, time_us, pct, vs, eager=None, eager_vs=None):
        r = dict.fromkeys(ROW_FIELDS)
        r.update(impl=impl, kind=kind, case=case, direction=direction, residency=residency, status="ok",
                 time_us=time_us, graph_us=time_us, pct_ceiling=pct, vs_fastest_peer=vs, eager_us=eager,
                 eager_vs_fastest_peer=eager_vs)
        return r
    doc = {"rows": [
        row("ropekit", "ropekit", "llama3-8b-prefill", "forward", "dram", 115.0, 97.5, 1.005),
        row("ropekit", "ropekit", "mha-fp16", "forward", "dram", 380.0, 94.0, 1.05),
        row("ropekit", "ropekit", "decode", "forward", "l2", 1.5, None, None, eager=4.0, eager_vs=0.7),
        row("liger", "peer", "decode", "forward", "l2", 1.6, None, None, eager=5.7, eager_vs=1.0),
        row("ropekit-inplace", "ropekit", "decode", "forward", "l2", 1.4, None, None),
    ]}
    doc["rows"][2]["vs_launch_floor"], doc["rows"][4]["vs_launch_floor"] = 1.15, 1.08
    verdicts = {(c["case"], c["target"]): c["met"] for c in targets(doc)}
    assert verdicts[("llama3-8b-prefill", "forward >= 97% of the copy ceiling")] is True
    assert verdicts[("llama3-8b-prefill", "forward no slower than the fastest peer (±1%)")] is True
    assert verdicts[("mha-fp16", "forward >= 97% of the copy ceiling")] is False
    assert verdicts[("decode", "graph replay (L2-resident) no slower than Liger (±1%)")] is True
    assert verdicts[("decode", "eager call <= 0.9x the fastest peer's eager call (L2-resident)")] is True
    assert verdicts[("fp32", "forward >= 97% of the copy ceiling")] is None  # not measured is not a pass
    floor = next(c for c in targets(doc) if c["target"] == "graph replay (L2-resident) <= 1.10x the launch-chain floor")
    assert (floor["case"], floor["impl"], floor["value"], floor["met"]) == ("decode", "ropekit-inplace", 1.08, True)
    doc["rows"][4]["vs_launch_floor"] = 1.11  # the best ropekit path above 1.10x: not met
    assert next(c for c in targets(doc) if c["target"] == floor["target"])["met"] is False


def test_merge_keeps_both_runs_and_later_rows_win(fake_run):
    doc = fake_run[0]
    later = _copy(doc)
    later["created"] = "2098-01-01T00:00:00+00:00"
    target = next(r for r in later["rows"] if r["status"] == "ok")
    target["time_us"] = target[f"{target['time_source']}_us"] = target["time_us"] * 2
    target["gbps"] = target["bytes"] / (target["time_us"] * 1e-6) / 1e9
    merged = bench.merge_documents([doc, later])
    same = [r for r in merged["rows"] if (r["case"], r["impl"], r["direction"], r["residency"]) ==
            (target["case"], target["impl"], target["direction"], target["residency"])]
    assert len(same) == 1 and same[0]["time_us"] == target["time_us"] and len(merged["runs"]) == 2
    # merging a merge keeps every source run once
    third = _copy(doc)
    third["created"] = "2099-01-01T00:00:00+00:00"
    again = bench.merge_documents([merged, third])
    assert [run["created"] for run in again["runs"]] == sorted({doc["created"], later["created"], third["created"]})


def test_main_measures_writes_and_renders_with_a_fake_clock(monkeypatch, tmp_path, capsys):
    """main()'s GPU path end to end on the CPU: the clock, the GPU check and the case table are replaced."""
    small = _tiny(MAIN["small-prefill"])
    monkeypatch.setattr(bench.cli, "refusal_reason", lambda: None)
    monkeypatch.setattr(bench.cli, "GpuTimer", lambda settings: FakeClock(l2_bytes=small.working_set_bytes))
    monkeypatch.setattr(bench.cli, "environment", lambda: {"python": "3", "torch": "t", "triton": "x",
                                                           "ropekit": ropekit.__version__, "gpu": "fake"})
    monkeypatch.setattr(bench.cli, "select_cases", lambda groups, names=None: [small])
    code = bench.main(["--cases", "small-prefill", "--impls", "ropekit,torch-eager", "--out", str(tmp_path)])
    assert code == 0
    doc = bench.load_document(tmp_path / "benchmarks.json")
    assert doc["complete"] and doc["copy_ceiling_end"] is not None and doc["duration_s"] >= 0
    assert {(r["impl"], r["residency"]) for r in doc["rows"]} == {
        ("ropekit", "l2"), ("ropekit", "dram"), ("torch-eager", "l2"), ("torch-eager", "dram")}
    assert (tmp_path / "benchmarks.md").is_file() and (tmp_path / "benchmarks_small.png").is_file()
    floor = doc["launch_floors"]["small-prefill"]["graph_us"]  # timed in the run, its rows divided by it
    assert floor > 0 and all(r["vs_launch_floor"] == pytest.approx(r["graph_us"] / floor) for r in doc["rows"])
    out = capsys.readouterr().out
    assert "targets:" in out and f"launch-chain floor (small-prefill): {floor:.2f} µs" in out


class _FakeCuda:
    """Just enough of torch.cuda for the GPU clocks' control flow to run on the CPU (graphs do not replay here)."""

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = time.perf_counter()

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        replays = 0

        def replay(self):
            type(self).replays += 1

        def reset(self):
            pass


def test_replay_rounds_interleave_the_graphs(monkeypatch):
    """replay_rounds replays every graph in each of graph_rounds rounds (not one graph's replays all at once)."""
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order = []

    class Graph:
        def __init__(self, name):
            self.name, self.released = name, False

        def replay(self):
            order.append(self.name)

        def reset(self):
            self.released = True
    graphs = [bench.timing.CapturedGraph(Graph(name), calls=8, replay_us=1e3) for name in "ab"]
    settings = bench.QUICK
    results = bench.timing.GpuTimer(settings).replay_rounds(graphs)
    assert len(results) == 2 and all(calls == 8 and median >= 0 for median, _, calls in results)
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]  # a, b, a, b, ...
    assert runs == ["a", "b"] * settings.graph_rounds
    assert order.count("a") == order.count("b") >= 5 * settings.graph_rounds
    assert all(g.graph.released for g in graphs)


def test_gpu_clocks_control_flow_with_a_fake_cuda(monkeypatch):
    """The graph and eager clocks call every buffer set equally often and return (median, spread, calls)."""
    fake = _FakeCuda()
    for name in ("Event", "Stream", "CUDAGraph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    default, side = fake.Stream(), fake.Stream()
    current = [default]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda: default)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    capture_streams = []

    def graph(g, stream=None):
        capture_streams.append(stream)
        return contextlib.nullcontext()
    monkeypatch.setattr(torch.cuda, "graph", graph)
    counts = [0, 0, 0]

    def counter(i):
        def fn():
            counts[i] += 1
        return fn
    timer = bench.timing.GpuTimer(bench.QUICK)
    median, spread, calls = timer.graph_us([counter(i) for i in range(3)], estimate_us=1.0)
    assert calls % 3 == 0 and calls <= bench.QUICK.max_calls_per_graph and median >= 0 and spread >= 0
    assert counts == [calls // 3 + 1] * 3  # one side-stream warm-up call each, then the captured calls
    assert fake.CUDAGraph.replays >= 5 + 3
    # from the default stream the graph captures on its own stream; from a side stream (backward rows) on that one
    current[0] = side
    timer.graph_us([counter(0)], estimate_us=1.0)
    assert capture_streams == [None, side]
    counts[:] = [0, 0, 0]
    median, spread, n = timer.eager_us([counter(i) for i in range(3)], estimate_us=1.0)
    assert n % 3 == 0 and median > 0
    assert counts[0] - 1 - 7 == counts[1] - 1 - 7 == counts[2] - 1 - 6 == n * bench.QUICK.eager_rounds // 3


def test_a_captured_graph_keeps_its_callables_and_their_buffers_alive(monkeypatch):
    """A CUDA graph holds raw addresses, not tensors: the timer's captured graph must hold the callables (and so their
    buffers) until it is released, or a caller that captures several graphs from short-lived closures (the tune tool)
    replays into memory the next capture's empty_cache gave back to the driver."""
    import gc
    import weakref

    fake = _FakeCuda()
    for name in ("Event", "Stream", "CUDAGraph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g, stream=None: contextlib.nullcontext())
    default = fake.Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: default)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda: default)

    def closure():
        out = torch.empty(4)

        def fn():
            out.fill_(1.0)
        return fn, weakref.ref(out)
    fn, out_alive = closure()
    captured = bench.timing.GpuTimer(bench.QUICK).capture([fn], estimate_us=1.0)
    del fn
    gc.collect()
    assert out_alive() is not None
    del captured
    gc.collect()
    assert out_alive() is None


def test_the_copy_ceiling_is_one_function_at_the_timers_settings(monkeypatch):
    seen = []
    monkeypatch.setattr(bench.timing, "copy_ceiling", lambda nbytes, rep_ms: seen.append((nbytes, rep_ms)) or {})
    bench.timing.GpuTimer(bench.QUICK).copy_ceiling()
    assert seen == [(bench.QUICK.ceiling_bytes, bench.QUICK.ceiling_rep_ms)]


def test_a_dry_run_calls_everything_once_and_measures_nothing():
    case = _tiny(MAIN["small-prefill"])
    impls = [IMPLS[n] for n in ("triton-v4", "ropekit")]
    timer = bench.timing.DryRunTimer()
    runner = Runner([case], impls, settings=bench.QUICK, timer=timer, device=ropekit.device.DEVICE,
                    progress=bench.runner.Progress(1, enabled=False))
    rows = runner.run()
    assert {r["impl"] for r in rows} == {"triton-v4", "ropekit"}
    assert all(r["status"] == "ok" and r["residency"] == "dram" for r in rows)  # its L2 is 0 bytes: one buffer set
    assert all(r["graph_us"] == r["do_bench_us"] == 1.0 for r in rows)
    assert timer.copy_ceiling()["method"].startswith("dry run")


@gpu_only
def test_the_copy_ceiling_on_the_gpu():
    ceiling = bench.timing.copy_ceiling(1 << 26, rep_ms=20.0)
    assert ceiling["bytes_read"] == ceiling["bytes_written"] == 1 << 26 and ceiling["gbps"] > 0
    assert abs(ceiling["gbps"] - 2 * (1 << 26) / (ceiling["time_us"] * 1e-6) / 1e9) < 1e-6 * ceiling["gbps"]


def test_load_published_reads_the_committed_json_when_there_is_one():
    published = bench.load_published()
    path = bench.report.published_json_path()
    assert (published is None) == (not path.is_file())
    if published is not None:
        assert published["copy_ceiling"]["gbps"] > 0 and published["rows"]


def test_model_plot_needs_no_measurement():
    import matplotlib.pyplot as plt

    fig = bench.plot_model(bench.MAIN_CASES)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert len(heights) == 2 * len(bench.MAIN_CASES) and all(h > 0 for h in heights)
    plt.close(fig)


def test_missing_peers_say_how_to_get_them(tmp_path):
    from ropekit.bench.peers import load_flash_attn

    assert "fetch_peers" in load_flash_attn(tmp_path).reason


# --------------------------------------------------------------------------------------------------------------------
# On the GPU: a real (short) measurement
# --------------------------------------------------------------------------------------------------------------------

@gpu_only
def test_graphs_captured_from_dropped_closures_replay_safely():
    """The tune tool's crash: graphs captured one after another from closures that go out of scope, replayed at the
    end. Each capture empties torch's cache; a graph that did not keep its outputs alive wrote to freed memory."""
    timer = bench.timing.GpuTimer(bench.QUICK)
    source = torch.randn(1 << 20, device="cuda")
    graphs = []
    for i in range(4):
        out = torch.empty((1 << 20) + i * 4096, device="cuda")  # a different size each round: no block is reused

        def fn(out=out, i=i):
            out[: source.numel()].copy_(source * (i + 1))
        graphs.append(timer.capture([fn], estimate_us=5.0))
        del fn, out
    results = timer.replay_rounds(graphs)
    torch.cuda.synchronize()
    assert len(results) == 4 and all(median > 0 for median, _, _ in results)


@gpu_only
def test_a_short_real_run_on_the_gpu():
    rows = bench.run(["decode"], ["triton-v4", "ropekit", "torch-eager"], settings=bench.QUICK, progress=False)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["residency"] for r in ok} == {"l2", "dram"}
    assert all(r["time_us"] > 0 and math.isfinite(r["gbps"]) and r["eager_us"] > 0 for r in ok)


# --------------------------------------------------------------------------------------------------------------------
# Two GPUs side by side in one page (each GPU's columns from its own run)
# --------------------------------------------------------------------------------------------------------------------

def _on_gpu(doc, gpu, factor, created):
    """The fake run as if measured on ``gpu``, every time scaled by ``factor`` (its ratios re-derived in its run)."""
    doc = _copy(doc)
    doc["environment"]["gpu"], doc["created"] = gpu, created
    for row in doc["rows"]:
        for key in ("graph_us", "do_bench_us", "eager_us"):
            if row[key] is not None:
                row[key] *= factor
    for floor in doc["launch_floors"].values():
        floor["graph_us"] *= 0.5
    derive_metrics(doc["rows"], doc["copy_ceiling"]["gbps"], doc["launch_floors"])
    return doc


@pytest.mark.parametrize("gpus, labels", [
    (["NVIDIA H100 80GB HBM3", "NVIDIA H200"], ["H100", "H200"]),
    (["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], ["H100 #1", "H100 #2"]),
    (["NVIDIA A100-SXM4-80GB", "Some GPU"], ["A100", "Some GPU"]),
], ids=["h100-h200", "same-gpu-twice", "other-names"])
def test_gpu_labels_are_the_models(gpus, labels):
    assert bench.markdown.gpu_labels([{"environment": {"gpu": g}} for g in gpus]) == labels


def test_two_gpus_runs_side_by_side_each_with_its_own_ratios(fake_run, tmp_path):
    h100 = _on_gpu(fake_run[0], "NVIDIA H100 80GB HBM3", 1.0, "2098-01-01T00:00:00+00:00")
    h200 = _on_gpu(fake_run[0], "NVIDIA H200", 0.5, "2099-01-01T00:00:00+00:00")
    paths = [write_json(doc, tmp_path / f"{name}.json") for name, doc in (("h100", h100), ("h200", h200))]
    page = tmp_path / "benchmarks.md"
    page.write_text("# B\n\n<!-- bench:targets -->\nkept\n<!-- /bench:targets -->\n\n"
                    "<!-- bench:gpus -->\nold\n<!-- /bench:gpus -->\n")
    assert bench.main(["--side-by-side", *map(str, paths), "--out", str(tmp_path)]) == 0
    text = page.read_text()
    assert "kept" in text and "old" not in text  # only the gpus block is rendered
    assert "- **H100**: NVIDIA H100 80GB HBM3" in text and "- **H200**: NVIDIA H200" in text
    assert "[h100.json](h100.json)" in text and "| target | case | H100 | H200 |" in text
    small = text.split("#### small-prefill")[1].split("####")[0]
    assert "| H100 µs | H100 % ceiling | H100 ÷ launch floor | H100 ÷ fastest peer | H200 µs |" in small
    for doc in (h100, h200):  # every cell is the number of its own run
        row = next(r for r in doc["rows"] if r["case"] == "small-prefill" and r["impl"] == "ropekit"
                   and r["residency"] == "l2" and r["direction"] == "forward")
        assert f"{row['pct_ceiling']:.1f}%" in small and f"{row['vs_launch_floor']:.2f}x" in small
    large = text.split(f"#### {fake_run[3][1].name}")[1].split("####")[0]
    assert "launch floor" not in large
    # a later render of one run keeps the side-by-side block as it is
    write_markdown(paths[0], page)
    assert page.read_text().count("- **H200**: NVIDIA H200") == 1


def test_side_by_side_needs_two_runs_and_a_block_to_fill(fake_run, tmp_path):
    path = write_json(fake_run[0], tmp_path / "one.json")
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:gpus -->\n<!-- /bench:gpus -->\n")
    with pytest.raises(ValueError, match="two runs"):
        bench.write_side_by_side([path], page)
    page.write_text("<!-- bench:targets -->\n<!-- /bench:targets -->\n")
    with pytest.raises(ValueError, match="no <!-- bench:gpus -->"):
        bench.write_side_by_side([path, path], page)


def test_the_published_page_has_the_side_by_side_block():
    page = (Path(bench.report.published_json_path()).parent / "benchmarks.md").read_text()
    assert "<!-- bench:gpus -->" in page and "--side-by-side" in page
