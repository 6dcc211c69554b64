"""The checker's words for three mistakes a reader makes: each mistake runs through the checker, the test reads the
diagnosis and the message.

* an output addressed with the wrong strides (x's, or a contiguous tensor's) is diagnosed as such, not as a mask too
  loose, although its stores land in the gaps around the output like a loose mask's would;
* in exercise 05 (q and k in one launch) a miss in k's head offset is reported as k's heads, numbered as k numbers
  them, in out_k: not as heads of the joint q+k output the checker reads back;
* an example is named once: the heads of one token share its position, so a wrong position is one example per token.
"""

from __future__ import annotations

import re

import pytest

import ropekit
from ropekit import course
from ropekit.course.addressing import Names
from ropekit.course.exercises import wrong_variants
from ropekit.course.wrong import ex03_strided_kernel, ex04_tiled_kernel, ex05_qk_offsets, ex09_rope_cache_kernel


def test_out_addressed_with_x_strides_is_a_stride_mistake_not_a_loose_mask():
    result = course.check("03_strided_kernel", wrong_variants("03_strided_kernel")["out_stride"])
    assert result.diagnosis == "out_stride", str(result)
    assert "x's strides" in result.message and "mask too loose" not in result.message
    assert "stride_ob" in result.message


def test_out_addressed_as_contiguous_is_a_stride_mistake_not_a_loose_mask():
    result = course.check("03_strided_kernel", ex03_strided_kernel.out_addressed_as_contiguous)
    assert result.diagnosis == "out_stride", str(result)
    assert "contiguous" in result.message and "mask too loose" not in result.message


def test_a_loose_mask_is_still_a_loose_mask():
    result = course.check("03_strided_kernel", wrong_variants("03_strided_kernel")["out_of_bounds"])
    assert result.diagnosis == "out_of_bounds" and "mask" in result.message, str(result)


def test_a_missed_k_head_offset_names_ks_own_heads():
    # case 1 has 4 q heads and 2 k heads: k's heads are 0-1 of out_k, not heads 4-5 of the joint output
    result = course.check("05_qk_offsets", ex05_qk_offsets.k_head_offset_missed)
    assert result.diagnosis == "unwritten", str(result)
    assert "k's heads 0-1 in out_k" in result.message, result.message
    assert "heads 4-5" not in result.message and "q's" not in result.message


def test_a_loose_k_mask_names_the_element_of_out_k():
    result = course.check("05_qk_offsets", wrong_variants("05_qk_offsets")["out_of_bounds"])
    assert result.diagnosis == "out_of_bounds", str(result)
    assert "out_k[1, 0, 0, 31]" in result.message and "out[" not in result.message


def test_names_split_q_and_k():
    names = Names(split=4)
    assert names.element((0, 1, 5, 3)) == "out_k[0, 1, 1, 3]" and names.element((0, 1, 3, 3)) == "out_q[0, 1, 3, 3]"
    assert names.heads([2, 3, 4]) == "q's heads 2-3 in out_q and k's heads 0 in out_k"
    assert Names().heads([0, 1]) == "heads 0-1" and Names().head(2) == "head 2"


def test_wrong_position_examples_are_not_repeated():
    result = course.check("05_qk_offsets", wrong_variants("05_qk_offsets")["wrong_positions"])
    assert result.diagnosis == "wrong_positions", str(result)
    examples = re.findall(r"sequence \d+ token \d+: position \d+ instead of \d+", result.message)
    assert len(examples) >= 2 and len(examples) == len(set(examples)), result.message


def test_a_check_that_needs_a_gpu_does_not_print_failed(monkeypatch):
    from ropekit.course import cuda_cpu
    from ropekit.course.checker import CheckResult
    text = str(CheckResult("06_cuda_kernel", False, "needs_gpu", "Compiles with nvcc; running it needs a CUDA GPU."))
    assert "FAILED" not in text and "needs a GPU, not a failure" in text
    if ropekit.device.DEVICE != "cuda":  # a CPU machine without a C++ compiler for the emulation says the same
        monkeypatch.setattr(cuda_cpu, "find_cxx", lambda: None)
        result = course.check("06_cuda_kernel", course.solution_source("06_cuda_kernel"))
        assert result.diagnosis == "needs_gpu" and "FAILED" not in str(result), str(result)


@pytest.mark.parametrize("exercise", ["04_tiled_kernel", "05_qk_offsets"])
def test_skipped_heads_point_at_the_head_loop_not_at_a_mask(exercise):
    """A tile that never reaches some heads (04: the head loop stops short; 05: k's heads never rotated) is told to
    look at the heads its programs cover, not at a mask."""
    from ropekit.course.exercises import wrong_variants

    result = course.check(exercise, wrong_variants(exercise)["unwritten"])
    assert result.diagnosis == "unwritten"
    assert "Whole heads were skipped" in result.message and "mask too tight" not in result.message


def test_stores_shifted_past_their_targets_are_called_an_offset_not_a_loose_mask():
    result = course.check("03_strided_kernel", ex03_strided_kernel.second_half_at_the_block_width)
    assert result.diagnosis == "out_of_bounds", str(result)
    assert "Stores landed beside their targets" in result.message and "never written" in result.message
    assert "mask too loose" not in result.message


def test_the_paged_exercise_checks_both_ends_of_the_cache_and_names_a_row_start_without_heads():
    from ropekit.course.fusion import paged_check
    slots = [case.slots for case in paged_check.CASES]
    n_slots = [case.num_blocks * case.block_size for case in paged_check.CASES]
    assert any(0 in s for s in slots) and any(n - 1 in s for s, n in zip(slots, n_slots))  # both ends of a cache
    result = course.check("09_rope_cache_kernel", wrong_variants("09_rope_cache_kernel")["stray_rows"])
    assert result.diagnosis == "stray_rows" and "slot * n_heads_kv * HEAD_DIM" in result.message, str(result)


def test_a_missing_batch_offset_is_located_in_plain_words():
    result = course.check("04_tiled_kernel", ex04_tiled_kernel.tile_without_the_batch_offset)
    assert result.diagnosis == "wrong", str(result)
    assert "Sequence 0 is right" in result.message and "batch offset" in result.message
    assert "broadcast" not in result.message and "cos_sin_reloaded" not in result.message  # no internal ids


def test_float_pair_indices_are_refused_with_the_int64_the_task_asks_for():
    result = course.check("01_pair_indices", wrong_variants("01_pair_indices")["wrong"])
    assert not result.ok and result.diagnosis == "wrong"
    assert "int64" in result.message and "float32" in result.message


def test_hints_use_the_words_of_what_the_reader_wrote():
    """A PyTorch function has no rows or tiles, and a one-row kernel no tiles: each hint speaks of what was written."""
    function = course.check("01_rope_torch", wrong_variants("01_rope_torch")["wrong_positions"])
    assert function.diagnosis == "wrong_positions"
    assert "positions[..., None]" in function.message and "row // n_heads" not in function.message
    row = course.check("02_row_kernel", wrong_variants("02_row_kernel")["broadcast"])
    assert row.diagnosis == "broadcast"
    assert "(row // n_heads) % seq_len" in row.message
    assert "BLOCK_S" not in row.message and "tile" not in row.message


def test_a_mask_from_the_loaded_slot_gets_a_way_forward_on_the_cpu():
    """The GPU compiles stores masked with `slot >= 0`; the interpreter refuses the mask. A CPU reader must learn how
    to write it so that both run it, not just that something raised."""
    result = course.check("09_rope_cache_kernel", ex09_rope_cache_kernel.cache_stores_masked_by_the_slot)
    if not ropekit.device.INTERPRET:
        assert result.ok
        return
    assert result.diagnosis == "raised" and "mask has unsupported dtype" in result.message
    assert "Hint:" in result.message and "if slot >= 0:" in result.message


def test_a_padding_token_that_writes_is_told_the_form_both_machines_run():
    """The padding message's advice is the scalar branch, not a mask built from the loaded slot (which the interpreter
    refuses: the test above)."""
    result = course.check("09_rope_cache_kernel", wrong_variants("09_rope_cache_kernel")["out_of_bounds"])
    assert result.diagnosis == "out_of_bounds" and "slot -1 is padding" in result.message
    assert "inside `if slot >= 0:`" in result.message and "mask the stores" not in result.message


def test_offsets_read_at_a_head_blocks_id_are_named_as_that_not_as_a_broadcast():
    result = course.check("05_qk_offsets", ex05_qk_offsets.offsets_read_at_the_head_block)
    assert result.diagnosis == "broadcast", str(result)
    assert "different sequences' offsets" in result.message and "tl.program_id(2)" in result.message, result.message
    assert "cos[:, None, :]" not in result.message


def test_a_shifted_position_in_the_torch_exercise_speaks_of_angles_not_table_rows():
    solution = course.load_solution("01_rope_torch")

    def counted_from_one(x, positions, **kwargs):
        return solution(x, positions + 1, **kwargs)

    result = course.check("01_rope_torch", counted_from_one)
    assert result.diagnosis == "position_shift", str(result)
    assert "positions + 1 in the angles" in result.message and "cos/sin row" not in result.message


@pytest.mark.parametrize("planted, turned", [
    (ex09_rope_cache_kernel.v_cache_holds_k, "unrotated"),
    (ex09_rope_cache_kernel.v_cache_holds_k_rotated, "rotated"),
], ids=["k-values", "k-rotated"])
def test_a_v_cache_written_from_k_is_named_as_k_in_the_v_cache(planted, turned):
    result = course.check("09_rope_cache_kernel", planted)
    assert result.diagnosis == "wrong", str(result)
    assert f"v_cache holds k ({turned})" in result.message and "differ from the reference" not in result.message
    assert "(case: " in result.message


def test_a_cache_row_as_long_as_qs_heads_says_how_long_a_slots_row_is():
    """The rows land in the guard the checker put after the cache, whatever the allocator placed beside it: one
    message on every run, not a store stopped beside whichever tensor happened to be nearest."""
    result = course.check("09_rope_cache_kernel", ex09_rope_cache_kernel.cache_row_of_qs_heads)
    assert result.diagnosis == "out_of_bounds", str(result)
    assert "a row past the end of the cache was written" in result.message, result.message
    assert "nearest tensor" not in result.message
    assert "a slot's row is n_heads_kv · HEAD_DIM elements" in result.message, result.message
    assert "(case: " in result.message


def test_a_sign_flipped_in_one_channel_only_is_not_a_turn_the_other_way():
    """b·cos - a·sin in the second channel (the first right) is one sin term's sign, not the rotation by -θ (both)."""
    result = course.check("02_row_kernel", wrong_variants("02_row_kernel")["sign_in_one_channel"])
    assert result.diagnosis == "sign_in_one_channel", str(result)
    assert "the second channel of each pair is wrong: the sign of the a·sin term" in result.message.lower()
    assert "matches none" not in result.message
    turned_back = course.check("02_row_kernel", wrong_variants("02_row_kernel")["wrong_direction"])
    assert turned_back.diagnosis == "wrong_direction", str(turned_back)


def test_k_masked_with_qs_head_count_is_told_k_has_fewer_heads():
    """Stores that land exactly where k's heads n_heads_k.. would be are k's lanes masked with q's head count (GQA),
    not a loose mask in general."""
    result = course.check("05_qk_offsets", ex05_qk_offsets.k_masked_with_qs_head_count)
    assert result.diagnosis == "out_of_bounds", str(result)
    assert "k has n_heads_k heads (GQA" in result.message
    assert "mask k's head lanes with n_heads_k, not n_heads_q" in result.message
    assert "mask too loose?" not in result.message


@pytest.mark.skipif(not ropekit.device.INTERPRET, reason="loads are recorded under the Triton interpreter")
def test_a_table_load_without_the_token_mask_is_caught_where_the_table_ends_with_the_positions():
    """A case's table has exactly the rows its positions reach, so the last tile's unmasked cos/sin load reads past
    it; the values still come out right (the stores are masked), so only the recorded loads show it."""
    assert any(case.table_len == case.seq for case in course.exercise("04_tiled_kernel").cases)
    result = course.check("04_tiled_kernel", wrong_variants("04_tiled_kernel")["load_out_of_bounds"])
    assert result.diagnosis == "load_out_of_bounds" and not result.ok, str(result)
    assert "outside the table" in result.message and "mask=inside[:, None]" in result.message
