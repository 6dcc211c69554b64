"""ropekit.course.reading_time: the counting rules on a made-up notebook, and the README's course table agreeing
with what the stored notebooks display."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from ropekit.course import reading_time as rt
from ropekit.course.exercises import EXERCISES

ROOT = Path(__file__).resolve().parent.parent


def _readme_times() -> dict[str, str]:
    return {m["file"]: m["time"].strip() for line in (ROOT / "README.md").read_text().splitlines()
            if (m := rt.README_ROW.match(line))}


def test_counts_prose_code_outputs_figures_and_exercises(tmp_path):
    nb = new_notebook(cells=[
        new_markdown_cell("word " * 300 + "\n```python\nx = 1\ny = 2\n```"),  # 300 words, 2 code lines
        new_code_cell("a = 1\nb = 2\n\nc = 3", outputs=[
            new_output("stream", name="stdout", text="one\ntwo\n"),
            new_output("display_data", data={"image/png": "", "text/plain": "<Figure>"}),
            new_output("display_data", data={"text/markdown": "| t |\n|---|\n```python\nz = 0\n```",
                                             "text/plain": "<Markdown>"}),
        ]),
    ])
    path = tmp_path / "02_made_up.ipynb"  # number 02: notebook 02's exercises count
    nbformat.write(nb, path)
    t = rt.notebook_time(path)
    assert (t.prose_words, t.code_lines, t.output_lines, t.figures, t.table_rows) == (300, 6, 2, 1, 1)
    assert t.reading_min == pytest.approx(300 / 150 + 6 / 15 + 2 / 40 + 1 / 10 + 0.5)
    assert "02_row_kernel" in t.exercises and "02_warmup_copy" in t.exercises
    assert t.exercise_min == 30 + 3 * 10  # one Triton kernel, three warm-ups
    assert t.column() == f"{5 + 60} min (5 reading + 60 exercises)"


def test_a_table_of_results_is_read_row_by_row_slower_than_printed_lines(tmp_path):
    """A displayed table's rows (not its |---| rule) at 10 a minute; the same lines printed at 40 a minute."""
    table = "| tile | µs | model % |\n|---|---:|---:|\n" + "".join(f"| {n} × 4 | 19{n}.0 | 100 |\n" for n in range(8))
    path = tmp_path / "07_tables.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("show()", outputs=[
        new_output("display_data", data={"text/markdown": table, "text/plain": "<Markdown>"}),
        new_output("stream", name="stdout", text=table)])]), path)
    t = rt.notebook_time(path)
    assert (t.table_rows, t.output_lines) == (9, 10)
    assert t.reading_min == pytest.approx(1 / 15 + 9 / 10 + 10 / 40)


def test_an_exercise_with_a_speed_target_adds_its_prediction_and_tuning(tmp_path):
    speed = [name for name, ex in EXERCISES.items() if ex.notes.get("speed_shape")]
    assert speed == ["05_qk_offsets"]
    path = tmp_path / "05_made_up.ipynb"
    nbformat.write(new_notebook(cells=[]), path)
    assert rt.notebook_time(path).exercise_min == rt.EXERCISE_MIN["triton"] + rt.SPEED_MIN == 50


def test_no_exercises_means_reading_only(tmp_path):
    number = next(f"{n:02d}" for n in range(1, 100)  # a notebook number the course has no exercise for
                  if not any(name.startswith(f"{n:02d}_") for name in EXERCISES))
    path = tmp_path / f"{number}_none.ipynb"
    nbformat.write(new_notebook(cells=[new_markdown_cell("word " * 10)]), path)
    t = rt.notebook_time(path)
    assert t.exercises == () and t.column() == "5 min"


def test_readme_lists_every_notebook_with_its_computed_time():
    times = rt.course_times()
    listed = _readme_times()
    assert set(listed) == set(times), "the README's course table and notebooks/ disagree on the notebooks"
    stale = {name: (listed[name], t.column()) for name, t in times.items() if listed[name] != t.column()}
    assert not stale, ("README times differ from `python -m ropekit.course.reading_time --readme` "
                       f"(README, computed): {stale}")


def test_with_times_rewrites_only_the_time_column():
    times = rt.course_times()
    name, t = next(iter(times.items()))
    row = f"| [x](notebooks/{name}) | learn \\| more | 1 min |"
    text = "intro\n" + row + "\n| not | a row |"
    assert rt.with_times(text, times) == f"intro\n| [x](notebooks/{name}) | learn \\| more | {t.column()} |\n| not | a row |"


def test_without_a_clone_the_error_says_where_the_notebooks_live(tmp_path):
    with pytest.raises(FileNotFoundError, match="notebooks/ of a clone"):
        rt.course_times(tmp_path / "notebooks")
