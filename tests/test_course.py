"""Spec of ropekit.course: the exercises, their checker, the touch pictures and the CUDA exercise.

* every solution passes its check, every untouched template reports "not yet solved" (and nothing raises);
* every deliberately wrong variant gets exactly the diagnosis it was written for, recognised from its output (or, for
  a kernel that does not compile, from the error, with a hint that names the fix);
* every RoPE-shaped exercise is checked on several shapes, with counts that are not powers of two;
* an exercise's ``grade`` hook (speed) runs only on correct code and decides the verdict;
* touch pictures come from a real run: every output element is stored once, by the program the launch grid implies;
* the CUDA exercise compiles with nvcc on a CPU machine; on a GPU its checker runs it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import ON_GPU

import ropekit
from ropekit import course
from ropekit.course import cuda as course_cuda
from ropekit.course import cuda_cpu
from ropekit.course import touch
from ropekit.course.cases import RopeCase
from ropekit.course.exercises import wrong_variants
from ropekit.course.wrong import standalone
from ropekit.positions import PositionSpec
from ropekit.triton.launch import rope_v4

ALL = course.names()
CUDA = [name for name in ALL if course.exercise(name).language == "cuda"]
WRONG = [(name, diagnosis) for name in ALL for diagnosis in wrong_variants(name)]

ROOT = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(course_cuda.find_nvcc() is None, reason="nvcc is not installed")
# The CUDA exercise runs on a GPU (built with nvcc), or on a CPU in the emulation (built with the host C++ compiler).
runs_cuda = pytest.mark.skipif(course_cuda.find_nvcc() is None if ON_GPU else cuda_cpu.find_cxx() is None,
                               reason="neither a GPU with nvcc nor a C++ compiler for the CPU emulation")
# Reuse of cos/sin, and loads past an input's end, are found by recording loads under the Triton interpreter: not on
# a GPU.
interpreter_only = pytest.mark.skipif(not ropekit.device.INTERPRET, reason="measured under the Triton interpreter")


def _on_device(name, *values):
    """A parameter that runs everywhere, except the CUDA exercise's (a GPU with nvcc, or a C++ compiler for the CPU
    emulation) and the reuse check (interpreter)."""
    marks = [runs_cuda] if name in CUDA else []
    if "cos_sin_reloaded" in values or "load_out_of_bounds" in values:
        marks.append(interpreter_only)
    return pytest.param(*values, marks=marks, id="-".join(map(str, values)))


RUN_ALL = [_on_device(name, name) for name in ALL]
RUN_WRONG = [_on_device(name, name, diagnosis) for name, diagnosis in WRONG]

# The mistakes the checker must recognise; each is proven by a wrong variant of at least one exercise (a
# broadcast along the wrong axis and partial-rotary pairing in a kernel are proven below, on exercises of their own).
REQUIRED_DIAGNOSES = {"wrong_direction", "other_pairing", "position_shift", "wrong_positions", "tail_touched",
                      "partial_pairing", "wrong_base", "half_precision_math", "unwritten", "out_of_bounds",
                      "stride_ignored", "compile_error"}


def _pair_id(pair):
    return f"{pair[0]}-{pair[1]}"


# --- the set of exercises --------------------------------------------------------------------------------------------

def test_every_notebook_from_01_to_06_has_an_exercise():
    assert {name[:2] for name in ALL} >= {"01", "02", "03", "04", "05", "06"}
    assert {course.exercise(n).language for n in ALL if n[:2] in ("02", "03", "04", "05")} == {"triton"}
    assert {course.exercise(n).language for n in ALL if n.startswith("01")} == {"pytorch"}
    assert CUDA and all(n.startswith("06") for n in CUDA)


@pytest.mark.parametrize("name", ALL)
def test_template_and_solution_define_the_same_entry_point(name):
    ex = course.exercise(name)
    assert ex.task and ex.title and ex.title in course.task(name)
    template, solution = course.template_source(name), course.solution_source(name)
    assert ex.entry in template and ex.entry in solution and template != solution
    if ex.language != "cuda":
        template_fn, solution_fn = course.load_template(name), course.load_solution(name)
        unwrap = lambda f: getattr(f, "fn", f)  # noqa: E731  (a @triton.jit kernel wraps its Python function)
        # the same parameters; their defaults may differ (exercise 05's tile is the reader's to choose)
        assert list(inspect.signature(unwrap(template_fn)).parameters) == \
            list(inspect.signature(unwrap(solution_fn)).parameters)


def test_the_tested_wrong_variants_cover_every_required_diagnosis():
    assert {diagnosis for _, diagnosis in WRONG} >= REQUIRED_DIAGNOSES


@pytest.mark.parametrize("pair", WRONG, ids=_pair_id)
def test_each_wrong_variant_targets_a_diagnosis_its_exercise_lists(pair):
    name, diagnosis = pair
    assert diagnosis in course.exercise(name).diagnoses
    assert diagnosis in course.DIAGNOSES


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="02_row_kernel"):
        course.exercise("02_row")


# --- the checker -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RUN_ALL)
def test_solution_passes_and_reports_its_max_error(name):
    result = course.check(name, course.load_solution(name))
    assert result.ok and bool(result) and result.diagnosis == "correct", str(result)
    assert result.max_error is not None and result.max_error < 1e-2
    assert "PASSED" in str(result) and "Correct" in str(result)


@pytest.mark.parametrize("name", RUN_ALL)
def test_untouched_template_reports_not_yet_solved(name):
    result = course.check(name, course.load_template(name))
    assert not result.ok and result.diagnosis == "not_solved", str(result)
    assert "not yet solved" in str(result).lower()


@pytest.mark.parametrize("name, diagnosis", RUN_WRONG)
def test_wrong_variant_gets_exactly_its_diagnosis(name, diagnosis):
    result = course.check(name, wrong_variants(name)[diagnosis])
    assert result.diagnosis == diagnosis, str(result)
    if diagnosis in course.PASSING_NOTES:  # right values at a small measured cost: passed, with the note
        assert result.ok and "PASSED" in str(result) and "note" in result.message
    else:
        assert not result.ok and "FAILED" in str(result) and result.message


def test_an_exception_in_the_readers_code_is_reported_not_raised():
    def rope_torch(x, positions, **kwargs):
        raise ValueError("shapes do not broadcast")

    result = course.check("01_rope_torch", rope_torch)
    assert result.diagnosis == "raised" and "shapes do not broadcast" in result.message


def test_wrong_base_explains_an_exponent_divided_by_head_dim():
    def rope_torch(x, positions, *, base=10000.0, rotary_dim=None, interleaved=False):
        rotary_dim = rotary_dim or x.shape[-1]
        inv_freq = ropekit.inverse_frequencies(x.shape[-1], base)[: rotary_dim // 2]  # over head_dim: the mistake
        return ropekit.reference.rope(x, positions, rotary_dim=rotary_dim, inv_freq=inv_freq,
                                      interleaved=interleaved).to(x.dtype)

    result = course.check("01_rope_torch", rope_torch)
    assert result.diagnosis == "wrong_base" and "not head_dim" in result.message, str(result)


@triton.jit
def _doubles_x_in_place(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    channels = tl.program_id(0) * HEAD_DIM + tl.arange(0, HEAD_DIM)
    tl.store(X + channels, tl.load(X + channels) * 2)  # stores into the input instead of OUT


def test_a_store_into_the_input_is_reported_as_out_of_bounds():
    result = course.check("02_row_kernel", _doubles_x_in_place)
    assert result.diagnosis == "out_of_bounds" and "input x" in result.message, str(result)


def test_a_python_function_given_for_a_kernel_exercise_is_reported():
    result = course.check("02_row_kernel", lambda *args: None)
    assert result.diagnosis == "raised" and "@triton.jit" in result.message


def test_show_solution_prints_the_solution_file(capsys):
    course.show_solution("02_row_kernel")
    printed = capsys.readouterr().out
    assert printed == course.solution_source("02_row_kernel") and "def rope_row_kernel" in printed


def test_every_rope_exercise_is_checked_on_several_shapes_with_odd_counts():
    def odd(n):
        return n > 2 and n & (n - 1) != 0

    for name in ALL:
        ex = course.exercise(name)
        if ex.check is not None:
            continue
        assert len(ex.cases) >= 2, name
        assert any(odd(c.seq) or odd(c.heads) or odd(c.batch) for c in ex.cases), name


# --- diagnoses proven on exercises of their own (registered for one test) ------------------------------------------

def _register(monkeypatch, name, **fields):
    base = dict(title=name, language="triton", entry="kernel", task="a test exercise", diagnoses=("wrong",))
    ex = course.Exercise(name=name, **{**base, **fields})
    monkeypatch.setitem(course.EXERCISES, name, ex)
    return ex


def test_a_cos_tile_broadcast_along_the_head_axis_is_diagnosed(monkeypatch):
    _register(monkeypatch, "99_tiles", run=standalone.run_tiles,
              cases=(RopeCase("seq 5, 3 heads, head_dim 8", 2, 5, 3, 8),))
    result = course.check("99_tiles", standalone.tile_without_head_axis)
    assert result.diagnosis == "broadcast" and "cos[:, None, :]" in result.message, str(result)
    assert "head 0 at position 0, head 1 at position 1" in result.message


def test_partial_rotary_paired_with_half_the_head_is_diagnosed_not_called_a_tight_mask(monkeypatch):
    _register(monkeypatch, "99_partial", run=standalone.run_partial,
              cases=(RopeCase("rotary_dim 8 of head_dim 16", 2, 3, 3, 16, rotary_dim=8),))
    result = course.check("99_partial", standalone.partner_half_the_head)
    assert result.diagnosis == "partial_pairing" and "i + 4" in result.message, str(result)
    assert "mask too tight" not in result.message


@pytest.mark.parametrize("source_line, words", [
    ("pairs = tl.arange(0, 12)", "next_power_of_2"),
    ("pairs = tl.arange(0, HEAD_DIM // 2) + tl.arange(0, HEAD_DIM)", "[:, None, :]"),
    ("pairs = tl.arange(0, HEAD_DIM // 2) + offset", "not defined"),
])
def test_a_kernel_that_does_not_compile_gets_a_hint(tmp_path, monkeypatch, source_line, words):
    source = course.solution_source("02_row_kernel").replace("pairs = tl.arange(0, HEAD_DIM // 2)", source_line, 1)
    assert source_line in source
    (tmp_path / "readers_kernel.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("readers_kernel", None)
    import readers_kernel
    result = course.check("02_row_kernel", readers_kernel.rope_row_kernel)
    assert result.diagnosis == "compile_error" and "Hint:" in result.message and words in result.message, str(result)


def test_the_constexpr_trap_names_the_fix():
    result = course.check("02_row_kernel", wrong_variants("02_row_kernel")["compile_error"])
    assert "H: tl.constexpr = HEAD_DIM // 2" in result.message and "arange" in result.message, str(result)


def test_a_missing_gpu_driver_is_explained_as_the_import_order():
    from ropekit.course.errors import explain
    finding = explain(RuntimeError("0 active drivers ([]). There should only be one."))
    assert finding.diagnosis == "import_order" and "import ropekit" in finding.message


@pytest.mark.skipif(ON_GPU, reason="on a GPU machine a kernel decorated before ropekit runs on the GPU")
def test_a_kernel_decorated_before_import_ropekit_is_diagnosed_as_the_import_order(tmp_path):
    script = tmp_path / "readers_notebook.py"  # @triton.jit needs its function's source in a file
    script.write_text("\n".join([
        "import os",
        "os.environ.pop('TRITON_INTERPRET', None)",
        "import triton",
        "import triton.language as tl",
        "",
        "@triton.jit",
        "def rope_row_kernel(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):",
        "    pass",
        "",
        "import ropekit",
        "from ropekit import course",
        "print(course.check('02_row_kernel', rope_row_kernel).diagnosis)",
    ]) + "\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip().splitlines()[-1:] == ["import_order"], done.stderr[-2000:]


def test_grade_runs_only_on_correct_code_and_decides(monkeypatch):
    from ropekit.course.diagnose import Finding
    ex = course.exercise("02_row_kernel")
    calls = []

    def grade(verdict):
        def hook(code):
            calls.append(code)
            return Finding(verdict, f"speed: {verdict}")
        return hook

    monkeypatch.setitem(course.EXERCISES, ex.name, dataclasses.replace(ex, grade=grade("too_slow")))
    slow = course.check(ex.name, course.load_solution(ex.name))
    assert not slow.ok and slow.diagnosis == "too_slow" and "Correct" in slow.message and "speed" in slow.message
    assert course.check(ex.name, course.load_template(ex.name)).diagnosis == "not_solved" and len(calls) == 1
    monkeypatch.setitem(course.EXERCISES, ex.name, dataclasses.replace(ex, grade=grade("correct")))
    fast = course.check(ex.name, course.load_solution(ex.name))
    assert fast.ok and "speed: correct" in str(fast)


# --- touch pictures --------------------------------------------------------------------------------------------------

def _v4_touches(q, table_len=32):
    cos, sin = ropekit.cos_sin_table(table_len, q.shape[-1])
    out = torch.empty_like(q)
    touches = touch.record(rope_v4, q, None, cos, sin, out_q=out, out_k=None, positions=PositionSpec(),
                           rotary_dim=q.shape[-1])
    return touches, out


def test_v4_touches_every_output_element_once_in_token_tiles():
    batch, seq, heads, head_dim = 1, 20, 2, 8
    q = torch.randn(batch, seq, heads, head_dim)
    touches, _ = _v4_touches(q)
    assert set(touches.tensors) == {"q", "cos", "sin", "out_q"}  # named after rope_v4's parameters
    assert (touches.count("out_q", "store") == 1).all() and (touches.count("q", "load") == 1).all()
    owner = touches.owner("out_q", "store")[0]  # (seq, heads, head_dim): the program that stored each element
    per_token = owner[:, 0, 0]
    assert (owner == per_token[:, None, None]).all()  # a program owns whole tokens: every head, every channel
    assert (np.diff(per_token) >= 0).all() and len(touches.programs()) == touches.grids[0][0] > 1  # tiles in order
    # cos/sin rows of the 20 tokens, each loaded once by the program of its token tile: reuse across heads
    cos_loads = touches.count("cos", "load")
    assert (cos_loads[:seq] == 1).all() and (cos_loads[seq:] == 0).all() and touches.reuse("cos") == 1.0


def test_recorded_offsets_map_back_to_the_elements_of_a_strided_view():
    storage = torch.randn(1, 2, 6, 8)  # (batch, heads, seq, head_dim) memory, read as a (batch, seq, heads, d) view
    q = storage.transpose(1, 2)
    touches, _ = _v4_touches(q)
    view_offsets = torch.as_strided(torch.arange(storage.numel()), q.shape, q.stride()).reshape(-1).numpy()
    for access in touches.select("q", "load"):
        assert (access.elements >= 0).all() and (view_offsets[access.elements] == access.offsets).all()


def test_the_exercise_solution_of_notebook_02_runs_one_program_per_row():
    if not ropekit.device.INTERPRET:
        pytest.skip("recording() hooks this process's interpreter; on a GPU record() uses a subprocess")
    from ropekit.course.exercises import launch_row
    x = torch.randn(2, 3, 2, 16)
    cos, sin = ropekit.cos_sin_table(8, 16)
    out = torch.empty_like(x)
    touches = touch.record(launch_row, course.load_solution("02_row_kernel"), x, cos, sin, out)
    owner = touches.owner("out", "store").reshape(-1, 16)
    assert (owner == np.arange(12)[:, None]).all()  # program r stores row r
    assert (touches.count("cos", "load")[:3] == 2 * 2).all()  # each cos row: once per head of each sequence


def test_memory_view_shows_a_transposed_layout_in_program_order():
    if not ropekit.device.INTERPRET:
        pytest.skip("records a kernel defined here, which a GPU machine's subprocess cannot import by name")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ropekit.course.exercises import launch_strided
    x = torch.randn(1, 2, 3, 8).transpose(1, 2)  # (batch, seq 3, heads 2, d) view of head-major memory
    cos, sin = ropekit.cos_sin_table(8, 8)
    kernel = course.load_solution("03_strided_kernel")
    touches = touch.record(launch_strided, kernel, x, cos, sin, torch.empty(1, 3, 2, 8))
    fig = touch.plot(touches, "x", "load", views=("grid", "memory"))
    memory = np.ma.getdata(fig.axes[1].images[-1].get_array())[:, 0]  # one memory row = one head vector
    assert list(memory) == [0, 2, 4, 1, 3, 5]  # programs run token-major; memory is head-major
    plt.close(fig)


def test_plot_shows_the_recorded_grid_and_one_programs_addresses():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    touches, _ = _v4_touches(torch.randn(1, 20, 2, 8))
    fig = touch.plot(touches, "out_q", "store")
    grid_axes, program_axes = fig.axes[:2]
    shown = np.ma.getdata(grid_axes.images[0].get_array())
    assert (shown == touches.owner("out_q", "store").reshape(-1, 8)).all()  # the picture is the recorded data
    assert "program (0, 0, 0)" in program_axes.get_title()
    plt.close(fig)
    fig = touch.plot(touches, "cos", "load", color="count")
    plt.close(fig)


def test_record_in_a_subprocess_returns_the_same_touches(monkeypatch):
    """What a GPU machine does: the launch runs under TRITON_INTERPRET=1 in a child process."""
    q = torch.randn(1, 20, 2, 8)
    cos, sin = ropekit.cos_sin_table(32, 8)
    out = torch.empty_like(q)
    kwargs = dict(out_q=out, out_k=None, positions=PositionSpec(), rotary_dim=8)
    here = touch.record(rope_v4, q, None, cos, sin, **kwargs) if ropekit.device.INTERPRET else None
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)  # as on a GPU machine: record() uses a child process
    child = touch.record(rope_v4, q, None, cos, sin, **kwargs)
    assert (child.count("out_q", "store") == 1).all()
    if here is not None:
        assert (child.owner("out_q") == here.owner("out_q")).all()
        assert (child.count("cos") == here.count("cos")).all()


def test_record_on_a_gpu_machine_refuses_a_launch_it_cannot_send_to_a_subprocess(monkeypatch):
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)  # as on a GPU machine
    with pytest.raises(ValueError, match="importable"):
        touch.record(lambda q: None, torch.zeros(1))


def test_recording_explains_when_the_interpreter_hook_is_missing(monkeypatch):
    if not ropekit.device.INTERPRET:
        pytest.skip("needs the interpreter in this process")
    from triton.runtime import interpreter
    monkeypatch.delattr(interpreter, "interpreter_builder")
    with pytest.raises(touch.TouchRecordingUnavailable, match="interpreter_builder"):
        with touch.recording():
            pass


# --- the CUDA exercise (06) ------------------------------------------------------------------------------------------

@needs_nvcc
def test_cuda_solution_compiles_for_sm_90():
    course_cuda.compile_only(course.load_solution("06_cuda_kernel"), arch="sm_90")


@needs_nvcc
@pytest.mark.skipif(ON_GPU, reason="on a GPU the check runs the kernel instead")
def test_without_a_gpu_or_a_cpp_compiler_the_cuda_check_compiles_and_says_what_running_needs(monkeypatch):
    monkeypatch.setattr(cuda_cpu, "find_cxx", lambda: None)
    result = course.check("06_cuda_kernel", course.load_template("06_cuda_kernel"))
    assert result.diagnosis == "needs_gpu" and "Compiles" in result.message and not result.ok
    assert "C++ compiler" in result.message


@needs_nvcc
def test_cuda_source_that_does_not_compile_is_reported():
    broken = course.load_template("06_cuda_kernel").replace("// Your code here.", "out[pair] = undefined_name;")
    with pytest.raises(course_cuda.CompileError, match="undefined_name"):
        course_cuda.compile_only(broken)
    assert course.check("06_cuda_kernel", broken).diagnosis == "compile_error"

