"""ropekit.course.warmups: the warm-ups' cases cover tails and non-powers of two, and their messages teach.

(The solutions, templates and every wrong variant run through ``course.check`` in tests/test_course.py.)
"""

import triton
import triton.language as tl

from ropekit import course
from ropekit.course import warmups

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
