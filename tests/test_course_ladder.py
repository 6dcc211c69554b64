"""Spec of ropekit.course.ladder: notebook 05's eight steps from v3 to the production kernels.

* each step is a complete kernel that matches the float64 reference on every shape, tile and feature it has (tails
  on the token and head axes, MQA/GQA, a head_dim that is not a power of two, every dtype);
* steps 1-6 (at most 60 lines) each add exactly one feature to the one before it, and the launcher refuses (naming
  the step that adds it) a feature the kernel does not have yet;
* steps 7 and 8 (at most about 40 lines) each add one speed idea to step 1: the fused q+k tile, the flat path; the
  flat path refuses every call but contiguous NeoX over the whole head, out of place, naming what it lacks;
* the int64 switch is chosen from the views' spans;
* the waterfall times v3, every step and the production kernel in one run.
"""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only

import ropekit
from ropekit.course import ladder
from ropekit.course.ladder import measure, verify
from ropekit.device import DEVICE

STEP_NUMBERS = range(1, len(ladder.STEPS) + 1)


FEATURE_NUMBERS = range(1, len(ladder.FEATURE_STEPS) + 1)
SPEED_NUMBERS = range(len(ladder.FEATURE_STEPS) + 1, len(ladder.STEPS) + 1)


@pytest.mark.parametrize("number", STEP_NUMBERS, ids=lambda n: ladder.STEPS[n - 1])
def test_each_step_matches_the_reference_on_every_shape_and_feature(number):
    module = ladder.step(number)
    configs = verify.configs_for(module)
    if number < len(ladder.FEATURE_STEPS):  # the last feature step and the speed steps: every tile or block
        configs = configs[1:]
    lines = verify.check_step(module, DEVICE, configs=configs)
    assert len(lines) >= len(verify.SHAPES)


@pytest.mark.parametrize("number", FEATURE_NUMBERS, ids=lambda n: ladder.STEPS[n - 1])
def test_each_feature_step_is_at_most_60_lines_and_adds_one_feature(number):
    module = ladder.step(number)
    assert 0 < ladder.kernel_lines(module) <= 60
    assert "teaching copy" in module.__doc__
    if number > 1:
        before = ladder.base(module)
        assert before is ladder.step(number - 1)
        assert module.FEATURES[:-1] == before.FEATURES
        assert ladder.kernel_lines(module) > ladder.kernel_lines(before)


@pytest.mark.parametrize("number", SPEED_NUMBERS, ids=lambda n: ladder.STEPS[n - 1])
def test_each_speed_step_is_about_40_lines_and_a_copy_of_step_1(number):
    module = ladder.step(number)
    assert 0 < ladder.kernel_lines(module) <= 42
    assert "teaching copy of step 1" in module.__doc__
    assert ladder.base(module) is ladder.step(1)
    assert module.FEATURES == ladder.step(1).FEATURES  # speed, no feature


FLAT_REFUSES = [
    ("gptj", {"interleaved": True}, "flat path"),
    ("positions", {"positions": 3}, "flat path"),
    ("partial", {"rotary_dim": 8}, "flat path"),
    ("conjugate", {"conjugate": True}, "flat path"),
    ("int64", {"force_int64": True}, "flat path"),
    ("inplace", {"inplace": True}, "^inplace: the flat path"),
    ("strided-q", {"q": lambda q: q.transpose(1, 2).contiguous().transpose(1, 2)}, "^q must be contiguous"),
    ("strided-out_k", {"out_k": lambda k: torch.empty(1, 3, 2, 16)[:, :, :1]}, "^out_k must be contiguous"),
]


@pytest.mark.parametrize("change, match", [c[1:] for c in FLAT_REFUSES], ids=[c[0] for c in FLAT_REFUSES])
def test_the_flat_step_refuses_every_call_but_contiguous_neox_over_the_whole_head(change, match):
    q, k = torch.randn(1, 3, 2, 16), torch.randn(1, 3, 1, 16)
    cos, sin = ropekit.cos_sin_table(8, change.get("rotary_dim", 16))
    kwargs = {key: value for key, value in change.items() if key not in ("q", "out_k")}
    if "q" in change:
        q = change["q"](q)
    if "out_k" in change:
        kwargs["out_k"] = change["out_k"](k)
    with pytest.raises(ValueError, match=match):
        ladder.rope_ladder(ladder.step(8).KERNEL, q, k, cos, sin, **kwargs)


@pytest.mark.parametrize("kwargs, step_named", [
    ({"positions": 3}, "step 2"), ({"interleaved": True}, "step 3"), ({"rotary_dim": 8}, "step 4"),
    ({"conjugate": True}, "step 5")])
def test_a_feature_the_step_lacks_is_refused_naming_the_step_that_adds_it(kwargs, step_named):
    q, k = torch.randn(1, 3, 2, 16), torch.randn(1, 3, 1, 16)
    rotary = kwargs.get("rotary_dim", 16)
    cos, sin = ropekit.cos_sin_table(8, rotary)
    with pytest.raises(ValueError, match=step_named):
        ladder.rope_ladder(ladder.step(1).KERNEL, q, k, cos, sin, **kwargs)


def test_arguments_are_checked_before_anything_is_written_and_errors_name_them():
    q, k = torch.randn(1, 3, 2, 16), torch.randn(1, 3, 1, 16)
    cos, sin = ropekit.cos_sin_table(8, 16)
    kernel = ladder.step(6).KERNEL
    with pytest.raises(ValueError, match="^k "):
        ladder.rope_ladder(kernel, q, k.double(), cos, sin)
    with pytest.raises(ValueError, match="^cos "):
        ladder.rope_ladder(kernel, q, k, cos[:, :4].contiguous(), sin)
    with pytest.raises(ValueError, match="rotary_dim"):
        ladder.rope_ladder(kernel, q, k, cos, sin, rotary_dim=5)
    with pytest.raises(ValueError, match="^q "):
        ladder.rope_ladder(kernel, q.transpose(2, 3), k, cos, sin)


def test_int64_offsets_are_chosen_from_the_span_of_the_views():
    small = torch.empty(2, 3, 4, 8)
    assert not ladder.needs_int64(small)
    huge = torch.empty(2**31 + 8, device="meta").as_strided((2, 1, 1, 8), (2**31, 8, 8, 1))  # spans 2**31 + 8
    assert ladder.needs_int64(huge)
    assert ladder.bytes_moved(small, small[:, :, :1]) == 2 * (small.numel() + small.numel() // 4) * 4


class FakeTimer:
    """No clock: the copy ceiling is 1000 GB/s, and the i-th graph captured takes 100 + i µs. It records what was
    captured and how the replays were asked for."""

    def __init__(self):
        self.captured, self.rounds = [], []

    def copy_ceiling(self):
        return {"gbps": 1000.0}

    def capture(self, fns, estimate_us):
        for fn in fns:
            fn()
        self.captured.append(fns)
        return len(self.captured) - 1

    def replay_rounds(self, graphs):
        self.rounds.append(list(graphs))
        return [(100.0 + graph, 0.0, 1) for graph in graphs]


def test_measure_steps_times_v3_every_step_and_the_production_kernel_in_one_interleaved_run():
    shape = (1, 3, 2, 1, 16, torch.float32)
    timer = FakeTimer()
    rows = measure.measure_steps(shape, timer=timer, device=DEVICE)
    assert [row["step"] for row in rows] == ["v3", *ladder.STEPS, "ropekit.apply_rope"]
    assert timer.rounds == [list(range(len(rows)))]  # one replay_rounds call over every graph: one run
    moved = 2 * (1 * 3 * 2 * 16 + 1 * 3 * 1 * 16) * 4
    for i, row in enumerate(rows):
        assert row["time_us"] == 100.0 + i
        assert row["gbps"] == pytest.approx(moved / row["time_us"] / 1e3)
        assert row["share"] == pytest.approx(row["gbps"] / 1000.0) and row["ceiling_gbps"] == 1000.0


def test_the_waterfall_is_read_step_against_step_in_points_of_the_ceiling():
    shares = {"v3": 0.90, "step1_qk": 0.95, "step2_positions": 0.951, "step3_gptj": 0.949, "step4_partial": 0.95,
              "step5_conjugate": 0.95, "step6_int64": 0.952, "step7_fused_qk": 0.972, "step8_flat": 0.961,
              "ropekit.apply_rope": 0.964}
    lines = measure.read_waterfall([{"step": name, "share": share} for name, share in shares.items()])
    assert lines[0].endswith("+5.0 points") and "-0.1 to +0.2 points" in lines[1]
    assert "step7_fused_qk against step 1: +2.2 points" in lines and "step8_flat against step 1: +1.1 points" in lines
    assert lines[-1].startswith("ropekit.apply_rope against step7_fused_qk") and "-0.8 points (96.4 %" in lines[-1]


def test_the_stored_waterfall_has_every_row_of_a_run():
    stored = measure.load_stored()
    assert stored["gpu"].startswith("NVIDIA H")
    assert [row["step"] for row in stored["rows"]] == ["v3", *ladder.STEPS, "ropekit.apply_rope"]
    assert all(0.5 < row["share"] < 1.05 and row["time_us"] > 0 for row in stored["rows"])


def test_the_speed_steps_are_timed_at_the_launch_the_library_model_picks():
    from ropekit.triton.model import DeviceFacts

    h100 = DeviceFacts("H100 SXM", 132, 3350.0, 600.0, "assumed")
    configs = measure.step_configs(measure.LLAMA3_8B_PREFILL, h100)
    assert set(configs) == {"step7_fused_qk", "step8_flat"}
    assert configs["step7_fused_qk"].block_h >= 32  # every q head
    assert isinstance(configs["step8_flat"], ladder.FlatBlock)


@gpu_only
def test_step6_rotates_a_tensor_past_2_31_elements():
    seq = 2**31 // (8 * 128) + 64
    q = torch.randn(1, seq, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = q[:, :, :1]
    cos, sin = ropekit.cos_sin_table(8192, 128, device="cuda")
    ids = (torch.arange(seq, device="cuda") % 8192)[None, :]
    out_q, _ = ladder.rope_ladder(ladder.step(6).KERNEL, q, k, cos, sin, positions=ids)
    for part in (slice(0, 64), slice(seq - 64, seq)):
        ropekit.testing.assert_close_to_reference(out_q[:, part], ropekit.reference.rope(q[:, part], ids[:, part].cpu()))


def test_newest_only_checks_what_the_step_adds():
    lines = verify.check_step(ladder.step(3), DEVICE, shapes=verify.SHAPES[:1], configs=verify.CONFIGS[1:],
                              newest_only=True)
    assert any("GPT-J" in line for line in lines) and not any("offset" in line for line in lines)


def test_step6_int64_path_runs_on_a_small_tensor_when_forced():
    """What a CPU can check of step 6: the int64 offsets' code path, forced on a tensor far below 2**31 elements."""
    from ropekit import reference
    from ropekit.frequencies import cos_sin_table
    from ropekit.testing import assert_close_to_reference

    lines = verify.check_step(ladder.step(6), DEVICE, shapes=verify.SHAPES[:1], configs=verify.CONFIGS[1:],
                              newest_only=True)
    assert any("int64 offsets (forced)" in line for line in lines)
    q, k = torch.randn(1, 3, 2, 8, device=DEVICE), torch.randn(1, 3, 1, 8, device=DEVICE)
    cos, sin = cos_sin_table(8, 8, device=DEVICE)
    with pytest.raises(ValueError, match="step 6"):
        ladder.rope_ladder(ladder.step(5).KERNEL, q, k, cos, sin, force_int64=True)
    got_q, _ = ladder.rope_ladder(ladder.step(6).KERNEL, q, k, cos, sin, force_int64=True)
    assert_close_to_reference(got_q, reference.rope(q, reference.token_positions(1, 3)))
