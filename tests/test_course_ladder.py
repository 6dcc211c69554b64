"""Spec of ropekit.course.ladder: notebook 05's six steps from v3 to v4.

* each step is a complete kernel of at most 60 lines that matches the float64 reference on every shape, tile and
  feature it has (tails on the token and head axes, MQA/GQA, a head_dim that is not a power of two, every dtype);
* each step adds exactly one feature to the one before it, and the launcher refuses (naming the step that adds it) a
  feature the kernel does not have yet;
* the int64 switch is chosen from the views' spans.
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


@pytest.mark.parametrize("number", STEP_NUMBERS, ids=lambda n: ladder.STEPS[n - 1])
def test_each_step_matches_the_reference_on_every_shape_and_feature(number):
    module = ladder.step(number)
    configs = verify.CONFIGS if number == len(ladder.STEPS) else verify.CONFIGS[1:]  # the last step: every tile
    lines = verify.check_step(module, DEVICE, configs=configs)
    assert len(lines) >= len(verify.SHAPES)


@pytest.mark.parametrize("number", STEP_NUMBERS, ids=lambda n: ladder.STEPS[n - 1])
def test_each_step_is_at_most_60_lines_and_adds_one_feature(number):
    module = ladder.step(number)
    assert 0 < ladder.kernel_lines(module) <= 60
    assert "teaching copy" in module.__doc__
    if number > 1:
        before = ladder.step(number - 1)
        assert module.FEATURES[:-1] == before.FEATURES
        assert ladder.kernel_lines(module) > ladder.kernel_lines(before)


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
    """Every kernel takes 100 µs, the copy ceiling is 1000 GB/s."""

    def copy_ceiling(self):
        return {"gbps": 1000.0}

    def graph_us(self, fns, estimate_us):
        for fn in fns:
            fn()
        return 100.0, 0.0, len(fns)


def test_measure_steps_runs_every_step_and_reports_its_share_of_the_ceiling():
    shape = (1, 3, 2, 1, 16, torch.float32)
    rows = measure.measure_steps(shape, timer=FakeTimer(), device=DEVICE)
    assert [row["step"] for row in rows] == list(ladder.STEPS)
    moved = 2 * (1 * 3 * 2 * 16 + 1 * 3 * 1 * 16) * 4
    assert rows[0]["gbps"] == pytest.approx(moved / 100.0 / 1e3)
    assert rows[0]["share"] == pytest.approx(rows[0]["gbps"] / 1000.0)


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
