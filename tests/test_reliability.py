"""Reliability (issue 7) as a specification: seeded property configurations, Transformer Engine's rope matrix, the
sanitizer driver, large-tensor spot checks, determinism, safe failure and long-context numerics — the CPU-sized parts
of ``python -m ropekit stress`` (the GPU run does the full sizes; see docs/reliability.md).

Every check lives in ``ropekit.stress``; these tests run it on small inputs and also show that each check can fail
(a sabotaged kernel call is caught)."""

import json

import pytest
import torch

from ropekit import reference as ref
from ropekit import stress
from conftest import DEVICE, ON_GPU

BACKENDS = stress.available_backends()[0]

# --- 1. property configurations --------------------------------------------------------------------------------------

# The interpreter runs ~120 configurations in ~15 s. On a GPU every new kernel variant is a compile and
# `python -m ropekit stress` runs 2,000 configurations, so pytest keeps a few there.
PROPERTY_CONFIGS, _ = stress.generate_configs(120, seed=7, scale=stress.CPU_SCALE, n_families=40)
RUN_CONFIGS = PROPERTY_CONFIGS[:8] if ON_GPU else PROPERTY_CONFIGS
covered_by_gpu_scripts = pytest.mark.skipif(ON_GPU, reason="on the GPU, `python -m ropekit stress` and "
                                            "tools/sanitize.sh run this at full size")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", RUN_CONFIGS, ids=[c.short_id() for c in RUN_CONFIGS])
def test_random_configuration_matches_reference(config, backend):
    try:
        failures = stress.run_config(config, backend)
    except stress.Unsupported as why:
        pytest.skip(f"{backend}: {why}")
    assert not failures, f"{config.describe()}: {failures}"


def test_generator_covers_every_dimension():
    coverage = stress.coverage(PROPERTY_CONFIGS)
    assert set(coverage["layout"]) == {"bshd", "sbhd", "bhsd", "thd"}
    assert set(coverage["view"]) == {"contiguous", "transposed", "sliced", "expanded", "misaligned", "packed"}
    assert set(coverage["dtype"]) == {"fp32", "bf16", "fp16", "fp64"}
    assert set(coverage["mode"]) == {"in-place", "out-of-place"}
    assert {"sum", "full"} <= set(coverage["backward"])
    assert set(coverage["seqlen"]) == {"0", "1", ">1"}
    assert len(coverage["positions"]) >= 8 and len(coverage["k heads"]) == 5


def test_variant_quota_bounds_the_compiles():
    # A dry run (nothing executes) with the GPU's launch configuration: each family stays within its quota of
    # Triton kernel variants (compiles), while most configurations are still fresh draws.
    configs, stats = stress.generate_configs(60, seed=3, scale=stress.GPU_SCALE, n_families=6, variant_quota=4,
                                             device="cpu", simulate_gpu=True)
    per_family = {}
    for cfg in configs:
        per_family.setdefault(cfg.family, set()).update(stress.kernel_variants(cfg, "cpu", simulate_gpu=True))
    assert all(len(keys) <= 4 for keys in per_family.values())
    assert stats["kernel_variants"] == len(set().union(*per_family.values())) <= 6 * 4
    assert stats["draws"]["fresh"] > 30 and len({(c.batch, c.seqlen, c.lengths) for c in configs}) > 30
    unbounded, _ = stress.generate_configs(60, seed=3, scale=stress.GPU_SCALE, n_families=6)
    free = set().union(*(stress.kernel_variants(c, "cpu", simulate_gpu=True) for c in unbounded))
    assert len(free) > stats["kernel_variants"]


def _config(**family):
    """A small explicit configuration (2 x 5 tokens, GQA 4/2 heads) of the given family."""
    return stress.Config(stress.Family(**family), seed=5, batch=2, seqlen=5, heads_q=4, heads_k=2, pad=8, span=20)


def _sabotage(monkeypatch, after):
    """Replace apply_rope (as the stress module calls it) by the real call followed by ``after(q, kwargs, result)``."""
    real = stress.apply_rope

    def sabotaged(q, k=None, cos=None, sin=None, **kwargs):
        return after(q, kwargs, real(q, k, cos, sin, **kwargs))

    monkeypatch.setattr(stress, "apply_rope", sabotaged)


def test_checks_pass_the_unsabotaged_configurations():
    for family in (dict(head_dim=40, rotary_dim=24), dict(backward="full"), dict(view="sliced", view_dim=-1,
                                                                                   inplace=True)):
        assert stress.run_config(_config(**family)) == []


def test_checks_catch_a_wrong_rotation(monkeypatch):
    _sabotage(monkeypatch, lambda q, kw, out: (out[0] * 1.001, out[1]))
    assert any(m.startswith("q:") for m in stress.run_config(_config()))


def test_checks_catch_a_wrong_gradient(monkeypatch):
    # forward values unchanged (q - q.detach() is 0), but q's gradient gets 1% of the incoming gradient added
    _sabotage(monkeypatch, lambda q, kw, out: (out[0] + 0.01 * (q - q.detach()), out[1]))
    assert any(m.startswith("q.grad:") for m in stress.run_config(_config(backward="full")))


def test_checks_catch_an_uncopied_tail(monkeypatch):
    def drop_tail(q, kw, out):
        out[0][..., 24:] = 0
        return out
    _sabotage(monkeypatch, drop_tail)
    assert any("tail" in m for m in stress.run_config(_config(head_dim=40, rotary_dim=24)))


def test_checks_catch_a_write_outside_the_view(monkeypatch):
    def spill(q, kw, out):  # one element past the view's last channel: the padding of the storage
        torch.as_strided(q, (1,), (1,), q.storage_offset() + q.shape[-1]).add_(1.0)
        return out
    _sabotage(monkeypatch, spill)
    messages = stress.run_config(_config(view="sliced", view_dim=-1, inplace=True))
    assert any("outside the views" in m for m in messages)


def test_checks_catch_a_modified_input(monkeypatch):
    def touch(q, kw, out):
        q.add_(1.0)
        return out
    _sabotage(monkeypatch, touch)
    assert any("modified its input" in m for m in stress.run_config(_config()))


def test_a_spent_time_budget_leaves_jobs_not_run():
    jobs = [("property", c, ("triton",), {}) for c in PROPERTY_CONFIGS[:3]]
    tally = stress._Tally()
    for outcome in stress.run_jobs(jobs, [0, 1, 2], workers=1, budget_s=0):
        tally.add_outcomes("job", outcome)
    assert tally.as_dict()["not_run"] == 3 and tally.checked == 0


@covered_by_gpu_scripts
def test_jobs_in_worker_processes_match_in_process():
    jobs = [("property", c, ("triton",), {}) for c in PROPERTY_CONFIGS[:2]]
    assert stress.run_jobs(jobs, [0, 1], workers=2) == stress.run_jobs(jobs, [0, 0], workers=1)


# --- 2. Transformer Engine's matrix ----------------------------------------------------------------------------------

def test_te_matrix_is_tes_parameter_grid():
    cases = stress.te_cases(full=True)
    fixed = [c for c in cases if c.tensor_format != "thd"]
    # 3 dtypes x 2 seqs x 2 hidden x 2 rotary x 2 margins x 2 formats x 3 transposes x 2 pairings x 2 starts,
    # minus TE's skip (start positions need a margin): 1152 - 288; thd: 3 x 2 x 2 x 2 x 2 x 2.
    assert len(fixed) == 864 and len(cases) - len(fixed) == 96
    assert not any(c.start_positions and c.margin == 0 for c in cases)
    assert {c.seq_length for c in fixed} == {2048, 4096} and {c.transpose for c in fixed} == {None, (0, 1), (2, 3)}
    assert {c.rotary_dim for c in cases} == {64, 128, 256}


TE_SLICE = stress.te_cases(full=False, seq_scale=64)  # sequences of 32 and 64 tokens under the interpreter
TE_SLICE = TE_SLICE[:6] if ON_GPU else TE_SLICE


@pytest.mark.parametrize("case", TE_SLICE, ids=[c.describe().replace(" ", "-") for c in TE_SLICE])
def test_te_matrix_slice_against_reference(case):
    # TE's dimensions (sequences divided by 64); forward, both loss shapes' gradients, contiguity
    outcome = stress.run_te_case(case, BACKENDS, heads=2)
    for backend, result in outcome.items():
        if isinstance(result, stress.Unsupported):
            continue
        assert not result, f"{backend}: {result}"


def test_reference_on_device_is_ref_rope_bit_for_bit():
    x = torch.randn(2, 7, 3, 40, dtype=torch.bfloat16)
    positions = ref.token_positions(2, 7, offsets=torch.tensor([3, 900]))
    for interleaved in (False, True):
        for conjugate in (False, True):
            want = ref.rope(x, positions, rotary_dim=24, interleaved=interleaved, conjugate=conjugate)
            got = stress.reference_on_device(x, positions, rotary_dim=24, interleaved=interleaved,
                                             conjugate=conjugate)
            assert torch.equal(got, want)


# --- 3. the sanitizer's driver ---------------------------------------------------------------------------------------

@covered_by_gpu_scripts
def test_sanitize_driver_runs_every_kernel_cleanly(capsys):
    assert stress.sanitize_driver(verbose=True) == 0
    lines = capsys.readouterr().out.splitlines()
    for kernel in ("triton v1", "triton v2", "triton v3", "out-of-table"):
        assert any(line.startswith("ok") and kernel in line for line in lines), kernel
    # every configuration once with v4's own tile and once with each launch of large prefills forced: the fused
    # tiles at 16 and 32 warps, and the flat path, q then k and paired (where a configuration allows it, else that
    # tile)
    n_configs = len(stress.sanitize_configs())
    n_tiles = len(stress._SANITIZE_V4_TILES)
    assert n_tiles == 5 and all(tile.flat for tile in stress._SANITIZE_V4_TILES[-2:])
    assert [tile.flat_paired for tile in stress._SANITIZE_V4_TILES[-2:]] == [False, True]
    assert sum(line.startswith("ok    triton ") and "seed=" in line for line in lines) == n_tiles * n_configs
    for tile in stress._SANITIZE_V4_TILES[1:]:
        assert tile.fused_qk and tile.num_warps in (16, 32)
        assert sum(line.startswith("ok    triton ") and f"tile={tuple(tile)}" in line for line in lines) == n_configs


# --- 4. large tensors (the real case, past 2**31 elements, runs in `python -m ropekit stress` on the GPU) ------------

def test_large_tensor_spot_checks():
    result = stress.run_large(BACKENDS, numel=6 * 2**12, heads=3, head_dim=16)
    assert result["failed"] == 0 and {s["spot"] for s in result["spots"]} >= {"first", "middle", "last"}


def test_large_tensor_spot_checks_catch_a_wrong_last_token(monkeypatch):
    def corrupt(q, kw, out):
        out[0][-1, -1] += 1.0
        return out
    _sabotage(monkeypatch, corrupt)
    result = stress.run_large(("triton",), numel=6 * 2**12, heads=3, head_dim=16)
    assert result["failed"] == 1 and any("last" in m for m in result["failures"][0]["messages"])


# --- 5. determinism and batch invariance -----------------------------------------------------------------------------

def test_bitwise_determinism_and_batch_invariance():
    result = stress.run_determinism(BACKENDS, repeats=3, batch=8, seqlen=6, heads=(2, 1), head_dim=32)
    checks = {row["check"] for row in result["rows"]}
    assert {"bshd vs sbhd", "bshd vs thd (packed)", "in place vs out of place"} <= checks
    assert any(c.startswith("batch of 1 vs batch of 8") for c in checks)
    assert any(c.startswith("prefill vs decode") for c in checks)
    assert result["failed"] == 0, result["failures"]


# --- 6. safe failure -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", stress.INVALID_INPUTS, ids=[c.name.replace(" ", "-") for c in stress.INVALID_INPUTS])
def test_invalid_input_raises_documented_error_before_any_write(case, inplace):
    assert stress.run_invalid_input(case, inplace=inplace, device=DEVICE) == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_nan_and_inf_stay_inside_their_rotation_pair(dtype, interleaved, backend):
    assert stress.nan_propagation(backend, dtype=dtype, interleaved=interleaved, device=DEVICE) == []


# --- 7. long context -------------------------------------------------------------------------------------------------

def test_long_context_float64_angles_vs_float32_angles():
    result = stress.run_long_context(BACKENDS, rotary_dim=16, heads=2)
    assert result["failed"] == 0, result["failures"]
    at_1e6 = [r for r in result["rows"] if r["position"] == 1_000_000]
    for row in at_1e6:
        # ropekit: fp32 rounding of cos/sin and of the products (|x| ~ 3 at most): well under 1e-6
        assert row["output_error_ropekit"] < 1e-6 and row["table_cos_error_float64_angles"] < 1e-7
        # a float32 angle at 1e6 is on a grid of 0.0625 rad: the rotation is off by ~1e-3 or more
        assert row["output_error_float32_angles"] > 1e-3 and row["table_cos_error_float32_angles"] > 1e-3


# --- the run and its report ------------------------------------------------------------------------------------------

def test_json_and_rendered_markdown(tmp_path):
    out = tmp_path / "reliability.json"
    status = stress.main(["--sections", "safety,long_context", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == (0 if result["total_failures"] == 0 else 1)
    assert result["environment"]["torch"] == torch.__version__ and result["environment"]["ropekit"]
    sanitizer = tmp_path / "sanitize.json"
    sanitizer.write_text(json.dumps({"gpu": "a GPU", "tools": {"memcheck": {"exit": 0, "errors": 0,
                                                                            "summary": "ERROR SUMMARY: 0 errors"}}}))
    markdown = tmp_path / "reliability.md"
    assert stress.main(["--render", str(out), str(markdown), "--sanitizer", str(sanitizer)]) == 0
    text = markdown.read_text()
    safety = result["sections"]["safety"]["invalid_inputs"]
    assert f"{safety['cases']} invalid inputs" in text and f"{safety['calls']} calls" in text
    assert "## 7. Numerics at long context" in text and "ERROR SUMMARY: 0 errors" in text
    assert text.count("\n| ") > len(stress.INVALID_INPUTS)  # the table of invalid inputs is rendered
