"""Spec of exercises 04 and 05 beyond what every exercise must do (tests/test_course.py runs each wrong variant):

* 04 needs the head loop: every case has more heads than the launch's BLOCK_H, the template has no loop and the
  solution has one, and a kernel without it fails as "unwritten";
* 05 is a q+k kernel at per-sequence offsets whose tile the reader chooses in the signature; a kernel that ignores
  the offsets fails;
* both are checked on several shapes, with token and head tails.
"""

from __future__ import annotations

import inspect
import re

import pytest
import triton
import triton.language as tl

import ropekit
from ropekit import course
from ropekit.course import exercises
from ropekit.course.exercises import wrong_variants


@pytest.mark.parametrize("name", ["04_tiled_kernel", "05_qk_offsets"])
def test_several_shapes_with_tails_on_the_token_and_head_axes(name):
    cases = course.exercise(name).cases
    assert len(cases) >= 3
    assert any(case.seq % 4 for case in cases) and any(case.heads % 2 for case in cases)
    assert len({case.shape for case in cases}) == len(cases)


def test_04_every_case_needs_more_than_one_head_step():
    block_h = inspect.signature(exercises.launch_tiled).parameters["block_h"].default
    assert all(case.heads > block_h for case in course.exercise("04_tiled_kernel").cases)
    template_code = [line.strip() for line in course.template_source("04_tiled_kernel").split('"""')[-1].splitlines()]
    assert not [line for line in template_code if line.startswith("for ")]  # the loop is the reader's to write
    assert "range(0, n_heads, BLOCK_H)" in course.solution_source("04_tiled_kernel")


def test_04_a_kernel_without_the_head_loop_fails():
    result = course.check("04_tiled_kernel", wrong_variants("04_tiled_kernel")["unwritten"])
    assert not result.ok and result.diagnosis == "unwritten" and "heads" in result.message


def test_04_reloading_cos_sin_in_the_head_loop_passes_with_a_note_on_its_measured_cost():
    result = course.check("04_tiled_kernel", wrong_variants("04_tiled_kernel")["cos_sin_reloaded"])
    assert result.ok and "PASSED" in str(result)
    if ropekit.device.INTERPRET:  # the loads are recorded: the note names the reloads and where their cost is measured
        assert result.diagnosis == "cos_sin_reloaded"
        assert "Passed, with a note" in result.message and "once per head step" in result.message
        assert "section 5" in result.message and "before the loop" in result.message
    else:  # compiled kernels cannot be recorded: the values are all a GPU check sees
        assert result.diagnosis == "correct"


def test_04_the_solution_gets_no_reload_note():
    result = course.check("04_tiled_kernel", course.load_solution("04_tiled_kernel"))
    assert result.diagnosis == "correct" and "note" not in result.message


def test_05_the_tile_comes_from_the_signatures_defaults():
    assert exercises.tile_of(course.load_solution("05_qk_offsets")) == (4, 4, 4)
    assert exercises.tile_of(course.load_template("05_qk_offsets")) == (1, 1, 4)  # correct once filled in, slow


def test_05_the_model_tells_the_templates_tile_from_the_solutions_before_any_timing():
    """On a CPU the speed check cannot time; it still says what the bytes-in-flight model predicts for the tile."""
    from ropekit.course import speed
    shape = exercises.exercise("05_qk_offsets").notes["speed_shape"]
    template = speed.model_words(course.load_template("05_qk_offsets"), shape)
    solution = speed.model_words(course.load_solution("05_qk_offsets"), shape)
    predicted = [float(re.search(r"predicts (\d+) %", words).group(1)) for words in (template, solution)]
    assert predicted[0] < 100 * speed.TARGET <= predicted[1], (template, solution)
    assert "1 token x 1 head a program" in template and "256 B in flight a program" in template
    assert "below the 80 % target" in template and "below the" not in solution


def test_05_the_speed_hint_never_suggests_fewer_warps():
    """Notebook 02's ablation measured fewer warps a program (more programs an SM at the same bytes each) giving no
    speed: a slow tile is told to move more bytes a program, whatever its warps, even where warps bound residency."""
    from ropekit.course import speed
    shape = exercises.exercise("05_qk_offsets").notes["speed_shape"]

    def kernel(Q, BLOCK_S=1, BLOCK_H=1, NUM_WARPS=32):  # a 256 B tile on 32 warps: two programs an SM by warps
        pass
    words = speed.model_words(kernel, shape)
    assert "below the 80 % target" in words and "more bytes a program" in words
    assert "NUM_WARPS" not in words and "fewer warps" not in words


@triton.jit
def _no_tile_defaults(Q, K, OUT_Q, OUT_K, COS, SIN, OFFSETS, seq_len, n_heads_q, n_heads_k,
                      stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                      stride_oqb, stride_oqs, stride_oqh, stride_okb, stride_oks, stride_okh,
                      HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                      NUM_WARPS: tl.constexpr):
    pass


def test_05_a_kernel_without_tile_defaults_is_told_where_to_put_them():
    result = course.check("05_qk_offsets", _no_tile_defaults)
    assert not result.ok and "default" in result.message and "BLOCK_S" in result.message


def test_05_a_kernel_that_ignores_the_offsets_fails():
    result = course.check("05_qk_offsets", wrong_variants("05_qk_offsets")["wrong_positions"])
    assert not result.ok and result.diagnosis == "wrong_positions"


def test_05_task_states_the_speed_target_and_its_shape():
    task = course.task("05_qk_offsets")
    assert "80 %" in task and "b4 s4096" in task and "OFFSETS[b] + s" in task


def test_05_the_checker_grades_speed_once_the_values_are_correct():
    result = course.check("05_qk_offsets", course.load_solution("05_qk_offsets"))
    assert result.diagnosis in ("correct", "too_slow")
    if not ropekit.device.DEVICE == "cuda":
        assert result.ok and "Speed is graded on a CUDA GPU only" in result.message
    else:
        assert "of the copy ceiling" in result.message
