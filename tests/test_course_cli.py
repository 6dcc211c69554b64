"""``python -m ropekit.course``: list, task, template and check from a terminal (the installed wheel runs it too:
tools/check_wheel.sh)."""

import inspect

import pytest
from conftest import ON_GPU

from ropekit.course import cuda_cpu as course_cuda_cpu
from ropekit.course import names, solution_source
from ropekit.course.__main__ import main
from ropekit.course.exercises import wrong_variants


def test_list_names_every_exercise(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split("\n")[0].split()[0] == "01_rotate_pair"


@pytest.mark.parametrize("source, code, verdict", [
    ("template", 1, "not yet solved"),
    ("solution", 0, "PASSED"),
], ids=["template-is-not-solved", "solution-passes"])
def test_check_grades_the_readers_file(tmp_path, capsys, source, code, verdict):
    mine = tmp_path / "mine.py"
    if source == "template":
        assert main(["template", "01_rotate_pair"]) == 0
        mine.write_text(capsys.readouterr().out)
    else:
        mine.write_text(solution_source("01_rotate_pair"))
    assert main(["check", "01_rotate_pair", str(mine)]) == code
    assert verdict in capsys.readouterr().out


def test_a_file_without_the_entry_says_which_name_it_needs(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("def something_else(): pass\n")
    with pytest.raises(SystemExit, match="no 'rotate_pair'"):
        main(["check", "01_rotate_pair", str(mine)])


def test_an_unknown_exercise_is_a_usage_error_listing_the_exercises(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["task", "nope"])
    assert exit_.value.code == 2 and "01_rotate_pair" in capsys.readouterr().err


# --- grade: every exercise whose file is in the reader's folder -------------------------------------------------------

def test_grade_checks_each_file_found_and_says_how_to_start_the_others(tmp_path, capsys):
    (tmp_path / "ex01_rotate_pair.py").write_text(solution_source("01_rotate_pair"))
    neighbours = inspect.getsource(wrong_variants("01_pair_indices")["other_pairing"])  # GPT-J's map for both
    (tmp_path / "ex01_pair_indices.py").write_text(
        "import torch\n\n\n" + neighbours.replace("def pair_indices_always_neighbours", "def pair_indices"))
    assert main(["grade", str(tmp_path)]) == 1  # one failed
    summary = capsys.readouterr().out.split("=== grades")[1]
    lines = {line.split()[0]: line for line in summary.strip().splitlines()}
    assert "PASSED" in lines["01_rotate_pair"] and "FAILED (other_pairing)" in lines["01_pair_indices"]
    assert f"template 02_row_kernel > {tmp_path / 'ex02_row_kernel.py'}" in lines["02_row_kernel"]
    assert set(lines) == set(names())


@pytest.mark.skipif(ON_GPU, reason="on a GPU the speed exercise is timed")
@pytest.mark.parametrize("source", ["solution", "1x1"], ids=["tile-4x4", "tile-1x1-model-29pct"])
def test_grade_on_a_cpu_calls_a_correct_speed_exercise_correct_not_passed(tmp_path, capsys, source):
    """On a CPU nothing is timed: a correct kernel is correct, whether its tile would reach the target or not."""
    code = solution_source("05_qk_offsets")
    if source == "1x1":  # the solution's kernel at the template's 1 x 1 tile: correct, and slow on a GPU
        code = code.replace("BLOCK_S: tl.constexpr = 4, BLOCK_H: tl.constexpr = 4",
                            "BLOCK_S: tl.constexpr = 1, BLOCK_H: tl.constexpr = 1")
        assert code != solution_source("05_qk_offsets")
    (tmp_path / "ex05_qk_offsets.py").write_text(code)
    assert main(["grade", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "% of the byte floor: needs a GPU" in out
    summary = {line.split()[0]: line for line in out.split("=== grades")[1].strip().splitlines()}
    assert "correct; speed not graded here (needs a GPU)" in summary["05_qk_offsets"]
    assert "PASSED" not in summary["05_qk_offsets"]


def test_a_prediction_for_a_kernel_that_fails_its_check_says_it_was_not_graded(tmp_path, capsys):
    k_masked_with_qs_heads = solution_source("05_qk_offsets").replace(
        "(head_block - n_q_blocks) * BLOCK_H, n_heads_k,", "(head_block - n_q_blocks) * BLOCK_H, n_heads_q,")
    assert k_masked_with_qs_heads != solution_source("05_qk_offsets")
    (tmp_path / "ex05_qk_offsets.py").write_text(k_masked_with_qs_heads)
    assert main(["grade", str(tmp_path), "--predict", "05_qk_offsets=92"]) == 1
    prediction = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("prediction:")]
    assert prediction and "not graded: the kernel failed its check (out_of_bounds)" in prediction[0], prediction


@pytest.mark.skipif(course_cuda_cpu.find_cxx() is None and not ON_GPU, reason="no way to run the CUDA exercise")
def test_grade_runs_the_cuda_exercise_without_a_gpu_and_names_a_missing_bounds_guard(tmp_path, capsys):
    (tmp_path / "ex06_cuda_kernel.cu").write_text(wrong_variants("06_cuda_kernel")["out_of_bounds"])
    assert main(["grade", str(tmp_path)]) == 1
    assert "FAILED (out_of_bounds)" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["grade"], ["grade", "mine", "--solutions"]], ids=["neither", "both"])
def test_grade_takes_a_folder_or_the_solutions(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and "--solutions" in capsys.readouterr().err


@pytest.mark.skipif(ON_GPU, reason="on a GPU the prediction is graded against the kernel measured now")
def test_grade_takes_a_prediction_and_grades_it_against_the_stored_runs_on_a_cpu(tmp_path, capsys):
    (tmp_path / "ex05_qk_offsets.py").write_text(solution_source("05_qk_offsets"))
    assert main(["grade", str(tmp_path), "--predict", "05_qk_offsets=92"]) == 0
    out = capsys.readouterr().out
    prediction = [line for line in out.splitlines() if line.strip().startswith("prediction:")]
    assert prediction and "you predicted 92 %" in " ".join(prediction), prediction
    summary = out.split("=== grades")[1]
    row = next(line for line in summary.splitlines() if "05_qk_offsets" in line)
    assert "prediction: Right" in row or "prediction: Off" in row, row  # the prediction's grade in the summary
    assert "--predict" not in out  # no advice to give the prediction already given


@pytest.mark.parametrize("pair, words", [("02_row_kernel=90", "not a speed exercise"),
                                         ("05_qk_offsets=fast", "a % of the copy ceiling")],
                         ids=["not-a-speed-exercise", "not-a-number"])
def test_a_prediction_names_what_is_wrong_with_it(tmp_path, pair, words):
    with pytest.raises(SystemExit, match=words):
        main(["grade", str(tmp_path), "--predict", pair])


def test_list_and_grade_follow_the_notebooks(tmp_path, capsys):
    """01's exercises, then 02's warm-ups before 02's row kernel, then 03, 04, 05, 06, 09: the order a reader meets
    them."""
    assert main(["list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert main(["grade", str(tmp_path)]) == 0  # no files: every exercise listed, none checked
    graded = [line.split()[0] for line in capsys.readouterr().out.split("=== grades")[1].strip().splitlines()]
    for order in (listed, graded):
        notebooks = [name[:2] for name in order]
        assert notebooks == sorted(notebooks) and set(notebooks) >= {"01", "02", "03", "04", "05", "06", "09"}
        warmups = [order.index(name) for name in order if name.startswith("02_warmup")]
        assert warmups and max(warmups) < order.index("02_row_kernel")
