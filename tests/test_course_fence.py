"""The checker's fence: under the Triton interpreter a load or store outside every tensor of the launch is stopped
before it touches memory (a far store would corrupt this process's heap) and diagnosed in the checker's words."""

import pytest
import torch
import triton
import triton.language as tl

import ropekit
from ropekit import course
from ropekit.course import fence

pytestmark = pytest.mark.skipif(not ropekit.device.INTERPRET, reason="the fence guards the Triton interpreter only")


@triton.jit
def _copy_rows(X, OUT, ROW_STEP, N: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, N)
    tl.store(OUT + row * ROW_STEP + lanes, tl.load(X + row * N + lanes))


@triton.jit
def _read_rows(X, OUT, ROW_STEP, N: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, N)
    tl.store(OUT + row * N + lanes, tl.load(X + row * ROW_STEP + lanes))


def test_a_store_far_outside_the_output_is_stopped_before_it_runs():
    x, out = torch.randn(4, 8), torch.zeros(4, 8)
    with fence.fenced(), pytest.raises(Exception) as raised:
        _copy_rows[(4,)](x, out, 1 << 24, N=8)
    found = fence.finding(raised.value)
    assert found is not None and found.diagnosis == "out_of_bounds", raised.value
    # past out's end, or, when the allocator put x (or another tensor) further up, before that one: either names it
    assert "8 store lane(s)" in found.message and \
        ("past the end of the nearest tensor" in found.message or "before the nearest tensor" in found.message)
    assert torch.equal(out[1:], torch.zeros(3, 8))  # row 0 is in bounds and was written; nothing after it ran


def test_a_load_outside_every_input_is_stopped_and_named():
    x, out = torch.randn(4, 8), torch.zeros(4, 8)
    with fence.fenced(), pytest.raises(Exception) as raised:
        _read_rows[(4,)](x, out, 64, N=8)
    found = fence.finding(raised.value)
    assert found is not None and found.diagnosis == "load_out_of_bounds"
    assert "8 load lane(s)" in found.message and "nearest tensor" in found.message


def test_in_bounds_launches_run_unchanged_and_the_hooks_leave():
    from triton.runtime import interpreter
    before = (interpreter.interpreter_builder.create_masked_store, interpreter.GridExecutor._init_args_hst)
    x, out = torch.randn(4, 8), torch.zeros(4, 8)
    with fence.fenced():
        _copy_rows[(4,)](x, out, 8, N=8)
    assert torch.equal(out, x)
    after = (interpreter.interpreter_builder.create_masked_store, interpreter.GridExecutor._init_args_hst)
    assert after == before
    assert fence.finding(ValueError("unrelated")) is None


@triton.jit
def _row_kernel_rows_of_the_wrong_size(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    HALF: tl.constexpr = HEAD_DIM // 2
    pos = (row // n_heads) % seq_len
    lanes = tl.arange(0, HALF)
    start = row * HEAD_DIM * n_heads  # the mistake: a row of a (rows, HEAD_DIM) tensor starts at row * HEAD_DIM
    a = tl.load(X + start + lanes)
    b = tl.load(X + start + HALF + lanes)
    cos = tl.load(COS + pos * HALF + lanes)
    sin = tl.load(SIN + pos * HALF + lanes)
    tl.store(OUT + start + lanes, a * cos - b * sin)
    tl.store(OUT + start + HALF + lanes, b * cos + a * sin)


def test_the_checker_reports_a_row_start_that_runs_off_the_tensors_instead_of_dying():
    result = course.check("02_row_kernel", _row_kernel_rows_of_the_wrong_size)
    assert not result.ok and result.diagnosis in ("load_out_of_bounds", "out_of_bounds"), str(result)
    assert "outside every tensor" in result.message and "row start" in result.message
