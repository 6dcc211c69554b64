"""Spec of the exercise sections of notebooks 01-06 and the touch pictures of 02-04.

Read from the notebooks' stored JSON, nothing executed here (nbval executes the notebooks):

* every exercise of ``ropekit.course`` numbered like a notebook has, in that notebook, a template cell holding the
  package's template verbatim (the reader edits it), then a check cell calling ``course.check`` on the template's
  entry point, whose stored output is an untouched template's "not yet solved";
* the stored outputs show what a failed check (a diagnosis) and a passed check look like;
* the solution is printed only on request (``SHOW_SOLUTION = False``) and never stored;
* notebook 06's CUDA exercise holds the template verbatim in a string the check cell passes to ``course.check``;
* notebooks 02-04 draw pictures from ``touch.record`` of the package's own kernel (v1, v2, v3), stored as images.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from ropekit import course

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NUMBERS = ("01", "02", "03", "04", "05")  # notebook 06 (CUDA: checked on a GPU only) has its own test below
EXERCISES = [name for name in course.names() if name[:2] in NUMBERS]
TOUCHED_KERNELS = {"02": "v1.rope_v1", "03": "v2.rope_v2", "04": "v3.rope_v3"}


def _notebook(number: str):
    (path,) = NOTEBOOKS.glob(f"{number}_*.ipynb")
    return nbformat.read(path, as_version=4)


def _code_cells(number: str):
    return [cell for cell in _notebook(number).cells if cell.cell_type == "code"]


def _output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.append("\n".join(output.traceback))
    return "".join(parts)


def _index(cells, predicate, what: str) -> int:
    found = [i for i, cell in enumerate(cells) if predicate(cell)]
    assert found, f"no cell {what}"
    return found[0]


def test_every_notebook_from_01_to_05_has_an_exercise():
    assert {name[:2] for name in EXERCISES} == set(NUMBERS)


@pytest.mark.parametrize("name", EXERCISES)
def test_template_cell_then_a_check_cell_that_stores_not_yet_solved(name):
    cells = _code_cells(name[:2])
    entry = course.exercise(name).entry
    template = course.template_source(name).strip()
    at_template = _index(cells, lambda c: template in c.source, f"holding the template of {name}")
    at_check = _index(cells, lambda c: f'course.check("{name}", {entry})' in c.source, f"checking {entry}")
    assert at_template < at_check
    assert f"[{name}] not yet solved" in _output_text(cells[at_check])


@pytest.mark.parametrize("name", EXERCISES)
def test_stored_outputs_show_a_failed_and_a_passed_check(name):
    outputs = "".join(_output_text(cell) for cell in _code_cells(name[:2]))
    assert f"[{name}] FAILED (" in outputs
    assert f"[{name}] PASSED (correct)" in outputs


@pytest.mark.parametrize("name", EXERCISES)
def test_solution_is_printed_only_on_request(name):
    cells = _code_cells(name[:2])
    at = _index(cells, lambda c: f'course.show_solution("{name}")' in c.source, f"showing the solution of {name}")
    assert "SHOW_SOLUTION = False" in cells[at].source and not cells[at].get("outputs")
    solution = course.solution_source(name).strip()
    assert not any(solution in cell.source or solution in _output_text(cell) for cell in cells)


@pytest.mark.parametrize("number, kernel", sorted(TOUCHED_KERNELS.items()), ids=lambda v: str(v))
def test_touch_pictures_are_recorded_from_the_package_kernel(number, kernel):
    cells = _code_cells(number)
    at = _index(cells, lambda c: f"touch.record({kernel}," in c.source, f"recording {kernel}")
    drawn = cells[at:]
    assert any("touch.plot(" in c.source or "touch.draw_" in c.source for c in drawn)
    assert any("image/png" in output.get("data", {}) for c in drawn for output in c.get("outputs", []))


def test_the_cuda_exercise_of_notebook_06_starts_from_the_template_and_hides_the_solution():
    cells = _code_cells("06")
    template = course.template_source("06_cuda_kernel").strip()
    at_template = _index(cells, lambda c: template in c.source, "holding the CUDA template")
    variable = cells[at_template].source.split("=", 1)[0].strip()
    at_check = _index(cells, lambda c: f'course.check("06_cuda_kernel", {variable})' in c.source,
                      f"checking {variable}")
    assert at_template < at_check
    at_solution = _index(cells, lambda c: 'course.show_solution("06_cuda_kernel")' in c.source, "showing it")
    assert "SHOW_SOLUTION = False" in cells[at_solution].source and not cells[at_solution].get("outputs")
    solution = course.solution_source("06_cuda_kernel").strip()
    assert not any(solution in cell.source or solution in _output_text(cell) for cell in cells)
