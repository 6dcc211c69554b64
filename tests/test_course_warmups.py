"""ropekit.course.warmups: the warm-ups' cases cover tails and non-powers of two, and their messages teach.

(The solutions, templates and every wrong variant run through ``course.check`` in tests/test_course.py.)
"""

import pytest
import triton
import triton.language as tl

import ropekit
from ropekit import course
from ropekit.course import warmups

interpreter_only = pytest.mark.skipif(not ropekit.device.INTERPRET, reason="loads are recorded under the interpreter")

WARMUPS = ("02_warmup_copy", "02_warmup_rotate_half", "02_warmup_angles")


def test_the_warmups_are_exercises_of_notebook_02_with_their_own_check():
    for name in WARMUPS:
        ex = course.exercise(name)
        assert ex.language == "triton" and ex.check is not None and ex.check.args == (name,)


def test_a_block_length_that_is_not_constexpr_gets_the_fix_in_the_message():
    from ropekit.course.exercises import wrong_variants

    result = course.check("02_warmup_rotate_half", wrong_variants("02_warmup_rotate_half")["raised"])
    assert result.diagnosis == "raised" and "HALF: tl.constexpr = D // 2" in result.message


def test_a_broadcast_mistake_gets_a_broadcasting_hint():
    from ropekit.course.exercises import wrong_variants

    result = course.check("02_warmup_angles", wrong_variants("02_warmup_angles")["raised"])
    assert result.diagnosis == "raised" and "[:, None]" in result.message


@triton.jit
def _copies_only_whole_blocks(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < (n // BLOCK) * BLOCK  # drops the tail
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=inside), mask=inside)


def test_a_tail_left_out_is_found_on_the_case_that_has_one():
    result = course.check("02_warmup_copy", _copies_only_whole_blocks)
    assert result.diagnosis == "unwritten" and "n = 100" in result.message


def test_not_a_kernel_is_reported():
    result = course.check("02_warmup_copy", lambda *args: None)
    assert not result.ok and result.diagnosis == "raised" and "@triton.jit" in result.message


@triton.jit
def _copy_loading_unmasked(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(DST + offsets, tl.load(SRC + offsets), mask=offsets < n)  # the load reads past SRC's end in the tail


@triton.jit
def _angles_in_float16(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pairs = tl.arange(0, BLOCK_I)
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = positions[:, None] * inv_freq[None, :]  # no float32 conversion: float16 math for a float16 INV_FREQ
    inside = (positions[:, None] < n_positions) & (pairs[None, :] < n_pairs)
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)


@interpreter_only
def test_a_load_without_a_mask_fails_although_the_output_is_right():
    result = course.check("02_warmup_copy", _copy_loading_unmasked)
    assert not result.ok and result.diagnosis == "load_out_of_bounds", str(result)
    assert "SRC" in result.message and "mask" in result.message and "n = 100" in result.message


def test_a_missing_float32_conversion_fails_on_the_float16_frequencies():
    result = course.check("02_warmup_angles", _angles_in_float16)
    assert not result.ok and result.diagnosis == "half_precision_math", str(result)
    assert "float16" in result.message and "positions.to(tl.float32)" in result.message


def test_the_float16_case_separates_float32_math_from_float16_math():
    # the check can only catch the missing conversion if float16 rounding changes some angle of the case
    import torch
    generator = torch.Generator().manual_seed(0)
    *_, (label, (inv_freq,), expected, mistakes) = warmups.cases("02_warmup_angles", "cpu", generator)
    assert inv_freq.dtype == torch.float16 and "float16" in label
    differ = (mistakes["half_precision_math"] != expected).sum()
    assert int(differ) > expected.numel() // 4, int(differ)


@triton.jit
def _writes_nothing(SRC, DST, n, BLOCK: tl.constexpr):
    pass


@triton.jit
def _stores_one_block_too_far(SRC, DST, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(DST + offsets, tl.load(SRC + offsets, mask=offsets < n))  # no mask on the store


def test_messages_name_the_output_as_the_kernel_calls_it():
    """The copy warm-up's output is DST in its template: the checker says DST, not a name the learner never saw."""
    nothing = course.check("02_warmup_copy", _writes_nothing)
    assert nothing.diagnosis == "not_solved" and "DST still holds" in nothing.message
    too_far = course.check("02_warmup_copy", _stores_one_block_too_far)
    assert too_far.diagnosis == "out_of_bounds" and "past the end of DST" in too_far.message
