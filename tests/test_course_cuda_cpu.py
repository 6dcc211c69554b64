"""The CUDA exercise (06) checked without a GPU: every thread of the launch emulated on the CPU.

Each planted mistake is named precisely: which thread, which tensor, which index, and the fix. A missing bounds guard,
a stride too small or too large and the wrong pair index are caught on a CPU; a kernel the emulation cannot run (shared
memory, barriers) is sent to a GPU instead of being passed.
"""

from __future__ import annotations

import pytest
from conftest import ON_GPU

from ropekit import course
from ropekit.course import cuda as course_cuda
from ropekit.course import cuda_cpu
from ropekit.course.exercises import wrong_variants

pytestmark = [
    pytest.mark.skipif(ON_GPU, reason="on a GPU the checker runs the kernel itself"),
    pytest.mark.skipif(cuda_cpu.find_cxx() is None, reason="no C++ compiler for the CPU emulation"),
]

SOLUTION = course.load_solution("06_cuda_kernel")


def _planted(old: str, new: str) -> str:
    assert old in SOLUTION
    return SOLUTION.replace(old, new)


def check(source: str):
    return course.check("06_cuda_kernel", source)


def test_the_solution_passes_on_the_cpu():
    result = check(SOLUTION)
    assert result.ok and result.diagnosis == "correct" and result.max_error < 1e-5, str(result)


def test_a_missing_bounds_guard_names_the_first_thread_past_the_last_pair_and_its_store():
    result = check(wrong_variants("06_cuda_kernel")["out_of_bounds"])
    assert result.diagnosis == "out_of_bounds" and not result.ok
    # case 1: 1 x 3 tokens x 2 heads x 12 pairs = 72 pairs in one block of 128 threads; thread 72 is the first without
    # a pair, and its row 6 starts at out[6 * 24] = out[144], one past out's 144 elements
    assert "threadIdx.x 72 of blockIdx.x 0 (pair 72) stored to out[144]" in result.message
    assert "out's 144 elements (out[0] … out[143])" in result.message
    assert "56 threads went outside" in result.message
    assert "if (pair >= n_pairs) return;" in result.message


def test_loads_before_the_guard_are_named_as_reads_past_x():
    result = check(wrong_variants("06_cuda_kernel")["load_out_of_bounds"])
    assert result.diagnosis == "load_out_of_bounds"
    assert "threadIdx.x 72 of blockIdx.x 0 (pair 72) read x[144]" in result.message


def test_a_row_stride_too_small_is_two_threads_storing_one_element():
    result = check(wrong_variants("06_cuda_kernel")["overlapping_stores"])
    assert result.diagnosis == "overlapping_stores"
    # rows head_dim / 2 = 12 apart: pair 12 (row 1, channel 0) lands where pair 0's second half (channel 12) did
    assert "(pair 0) and threadIdx.x 12 of blockIdx.x 0 (pair 12) both wrote out[12]" in result.message
    assert "race" in result.message and "row's stride" in result.message


def test_a_row_stride_too_large_is_a_real_pair_storing_past_out():
    source = _planted("out[row * head_dim + half + i]", "out[2 * row * head_dim + half + i]")
    result = check(source)
    assert result.diagnosis == "out_of_bounds"
    # row 3 (pair 36) is the first whose doubled start, 6 * 24 + 12 = 156, lies past out's 144 elements
    assert "(pair 36) stored to out[156]" in result.message and "is a real pair" in result.message


def test_the_wrong_pair_index_is_read_from_the_values():
    result = check(wrong_variants("06_cuda_kernel")["other_pairing"])
    assert result.diagnosis == "other_pairing" and "GPT-J" in result.message


def test_a_position_taken_from_the_row_index_is_explained_in_threads_not_programs():
    result = check(_planted("const int position = (row / n_heads) % seq_len;", "const int position = row % seq_len;"))
    assert result.diagnosis == "broadcast", str(result)
    assert "one thread a pair" in result.message and "(row / n_heads) % seq_len" in result.message
    assert "program" not in result.message


def test_a_kernel_using_shared_memory_compiles_with_nvcc_but_is_sent_to_a_gpu():
    if course_cuda.find_nvcc() is None:
        pytest.skip("nvcc is not installed")
    source = _planted("    const int half = head_dim / 2;",
                      "    __shared__ float staged[128];\n    staged[threadIdx.x] = 0.f;\n    __syncthreads();\n"
                      "    const int half = head_dim / 2;")
    result = check(source)
    assert result.diagnosis == "needs_gpu" and not result.ok
    assert "Compiles with nvcc" in result.message and "shared memory" in result.message


def test_without_nvcc_a_source_that_does_not_compile_is_reported_by_the_host_compiler(monkeypatch):
    monkeypatch.setattr(course_cuda, "find_nvcc", lambda: None)
    result = check(_planted("const float c =", "const float c = undefined_name +"))
    assert result.diagnosis == "compile_error" and "undefined_name" in result.message
    assert "host C++" in result.message
