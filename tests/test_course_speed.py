"""Spec of ropekit.course.speed: the speed exercise's grading against the copy ceiling, with a fake timer.

The real timer runs on a GPU only; here a fake one returns chosen times, so the grading logic is exercised in CI:
the ceiling is measured in the same call as the kernel, 80 % of it passes, less fails with advice, and without a GPU
nothing is graded and the answer says so.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ON_GPU

from ropekit import course
from ropekit.course import measure, speed


class FakeTimer:
    """A timer for ``measure.time_launch``: a chosen copy ceiling and a chosen time per call; records the calls."""

    def __init__(self, ceiling_gbps: float, time_us: float):
        self.ceiling_gbps, self.time_us, self.calls = ceiling_gbps, time_us, []

    def copy_ceiling(self):
        self.calls.append("ceiling")
        return {"gbps": self.ceiling_gbps}

    def graph_us(self, fns, estimate_us):
        for fn in fns:
            fn()
        self.calls.append("kernel")
        return self.time_us, 0.0, len(fns)


def _measurement(share: float) -> measure.Measurement:
    return measure.Measurement("k", 100.0, 1, 1000.0 * share, 1000.0, 100.0 * share, 0.0)


@pytest.mark.parametrize("share, passes", [(0.95, True), (0.80, True), (0.7999, False), (0.3, False)])
def test_the_pass_mark_is_80_percent_of_the_copy_ceiling(share, passes):
    result = speed.grade(_measurement(share), shape_words="the stated shape")
    assert result.graded and result.ok is passes and bool(result) is passes
    assert ("Fast enough" if passes else "not yet fast enough") in result.message
    assert "the stated shape" in result.message and f"{100 * share:.1f} % of the copy ceiling" in result.message


def test_the_ceiling_is_measured_in_the_same_call_before_the_kernel():
    timer = FakeTimer(ceiling_gbps=1.0, time_us=1.0)
    speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"), timer=timer)
    speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"), timer=timer)
    assert timer.calls == ["ceiling", "kernel"] * 2  # measured again for every grade, not reused


@pytest.mark.skipif(ON_GPU, reason="on a GPU the exercise is graded for real")
def test_without_a_gpu_the_speed_exercise_says_it_checked_correctness_only():
    result = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"))
    assert not result.graded and not result.ok
    assert "GPU" in result.message and "correctness" in result.message


def test_grade_exercise_runs_the_readers_kernel_on_the_stated_shape_with_a_fake_timer():
    ex = course.exercise("05_qk_offsets")
    shape = ex.notes["speed_shape"]
    assert (shape.batch, shape.seq, shape.heads_q, shape.heads_k, shape.head_dim) == (4, 4096, 32, 8, 128)
    assert shape.dtype == torch.bfloat16 and "b4 s4096" in shape.words
    fast = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"),
                                timer=FakeTimer(ceiling_gbps=1.0, time_us=1.0))
    assert fast.graded and fast.ok and fast.speed.share >= speed.TARGET
    slow = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"),
                                timer=FakeTimer(ceiling_gbps=1e9, time_us=1.0))
    assert slow.graded and not slow.ok


def test_an_exercise_without_a_speed_target_is_refused():
    with pytest.raises(ValueError, match="no speed target"):
        speed.grade_exercise("04_tiled_kernel", course.load_solution("04_tiled_kernel"), timer=FakeTimer(1, 1))
