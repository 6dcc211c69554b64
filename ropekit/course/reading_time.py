"""How long a notebook takes: reading what it displays, plus doing its exercises.

Reading counts what a reader sees in the stored notebook: the prose, the code cells, and the outputs (printed text,
tables, source listings the notebook renders, figures). Rates, chosen for technical material read with attention:

* prose: 150 words a minute;
* code, in cells or rendered as listings: 15 lines a minute;
* printed output: 40 lines a minute;
* a table of results (a markdown table a cell displays): 10 rows a minute. A row is a measurement beside its model
  and its neighbours, and the prose asks the reader to compare them: slower than a printed line;
* a figure: half a minute.

Exercises take longer than reading; the estimate per exercise is by kind: a Triton warm-up 10 minutes, a PyTorch
function 15, a Triton kernel 30, a CUDA kernel 45 (a first-timer's pace, debugging included). An exercise with a speed
target asks for more than a correct kernel, and adds 20 minutes: a prediction of the tile's speed from the model, its
grade, and on a GPU the tuning to the target.

    python -m ropekit.course.reading_time              # the time column, one line per notebook
    python -m ropekit.course.reading_time --readme     # write it into README.md's course table
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

__all__ = ["NotebookTime", "notebook_time", "course_times", "with_times", "README_ROW", "PROSE_WPM", "CODE_LPM",
           "OUTPUT_LPM", "TABLE_RPM", "FIGURE_MIN", "EXERCISE_MIN", "SPEED_MIN", "NOTEBOOKS"]

PROSE_WPM = 150
CODE_LPM = 15
OUTPUT_LPM = 40
TABLE_RPM = 10
FIGURE_MIN = 0.5
EXERCISE_MIN = {"warm-up": 10, "pytorch": 15, "triton": 30, "cuda": 45}
SPEED_MIN = 20  # added to an exercise with a speed target
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

_FENCE = re.compile(r"```.*?```", re.S)
_TABLE_RULE = re.compile(r"^\|[\s:|-]+\|$")  # a table's |---|---| line: no content
# A row of the README's course table: | [title](notebooks/FILE.ipynb) | what you learn | time |
README_ROW = re.compile(r"^(?P<head>\| \[[^\]]+\]\(notebooks/(?P<file>[^)]+\.ipynb)\) \|.*\|) (?P<time>[^|]+) \|$")


@dataclass(frozen=True)
class NotebookTime:
    name: str
    prose_words: int
    code_lines: int
    output_lines: int
    figures: int
    table_rows: int
    exercises: tuple[str, ...]
    reading_min: float
    exercise_min: float

    @property
    def total_min(self) -> float:
        return self.reading_min + self.exercise_min

    def column(self) -> str:
        """The README's time column: whole minutes, rounded up to 5."""
        reading, doing = _round5(self.reading_min), _round5(self.exercise_min)
        if not self.exercises:
            return f"{reading} min"
        return f"{reading + doing} min ({reading} reading + {doing} exercises)"


def _round5(minutes: float) -> int:
    return int(5 * math.ceil(minutes / 5 - 1e-9)) if minutes > 0 else 0


def _lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _words(text: str) -> int:
    return len(re.findall(r"\S+", text))


def _count_markdown(text: str) -> tuple[int, int]:
    """(prose words, code lines) of a markdown text: fenced blocks are code."""
    code = sum(_lines(block.strip("`").partition("\n")[2]) for block in _FENCE.findall(text))  # minus the info line
    return _words(_FENCE.sub(" ", text)), code


def _table_rows(text: str) -> tuple[int, int]:
    """(table rows with content, other non-blank lines) of a markdown text with its fenced blocks taken out."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rows = [line for line in lines if line.startswith("|") and line.endswith("|")]
    return sum(not _TABLE_RULE.match(row) for row in rows), len(lines) - len(rows)


def _exercise_kind(ex) -> str:
    return "warm-up" if ex.title.lower().startswith("warm-up") else ex.language


def notebook_time(path) -> NotebookTime:
    """Count what ``path`` (a stored notebook) displays and the exercises it holds."""
    from . import exercises

    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    words = code = output = figures = tables = 0
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            w, c = _count_markdown(cell.source)
            words, code = words + w, code + c
            continue
        if cell.cell_type != "code":
            continue
        code += _lines(cell.source)
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                output += _lines(out.text)
            elif out.output_type in ("display_data", "execute_result"):
                data = out.get("data", {})
                if "image/png" in data or "image/svg+xml" in data:
                    figures += 1
                elif "text/markdown" in data:
                    w, c = _count_markdown(data["text/markdown"])
                    rows, other = _table_rows(_FENCE.sub(" ", data["text/markdown"]))
                    code, tables, output = code + c, tables + rows, output + other
                elif "text/plain" in data:
                    output += _lines(data["text/plain"])
    number = path.name.split("_")[0]
    names = tuple(name for name in exercises.names() if name.split("_")[0] == number)
    doing = sum(EXERCISE_MIN[_exercise_kind(exercises.exercise(name))]
                + (SPEED_MIN if exercises.exercise(name).notes.get("speed_shape") else 0) for name in names)
    reading = (words / PROSE_WPM + code / CODE_LPM + output / OUTPUT_LPM + tables / TABLE_RPM
               + figures * FIGURE_MIN)
    return NotebookTime(path.stem, words, code, output, figures, tables, names, reading, float(doing))


def course_times(folder=NOTEBOOKS) -> dict[str, NotebookTime]:
    """Every notebook of the course, by file name (the notebooks of a clone: an installed wheel ships none)."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"no notebooks at {folder}: they are notebooks/ of a clone of ropekit's repository "
                                "(an installed wheel ships the package only)")
    return {path.name: notebook_time(path) for path in sorted(Path(folder).glob("*.ipynb"))}


def with_times(readme: str, times: dict[str, NotebookTime]) -> str:
    """``readme`` with the time column of every course-table row set from ``times``."""
    def row(line: str) -> str:
        match = README_ROW.match(line)
        if not match or match["file"] not in times:
            return line
        return f"{match['head']} {times[match['file']].column()} |"

    return "\n".join(row(line) for line in readme.split("\n"))


if __name__ == "__main__":
    import sys

    times = course_times()
    if "--readme" in sys.argv[1:]:
        readme = NOTEBOOKS.parent / "README.md"
        readme.write_text(with_times(readme.read_text(), times))
    for name, t in times.items():
        print(f"{name:34s} {t.column():40s} prose {t.prose_words} words, code {t.code_lines} lines, "
              f"output {t.output_lines} lines, {t.table_rows} table rows, {t.figures} figures, "
              f"{len(t.exercises)} exercises")
    total = sum(_round5(t.reading_min) + _round5(t.exercise_min) for t in times.values())
    print(f"course: {total} min ({total / 60:.1f} h)")
