"""``python -m ropekit.course``: the exercises from a terminal, for a reader working in a file instead of a notebook.

    python -m ropekit.course list                              # every exercise and its title
    python -m ropekit.course task 02_row_kernel                # what to write
    python -m ropekit.course template 02_row_kernel > mine.py  # a file to start from
    python -m ropekit.course check 02_row_kernel mine.py       # the checker's verdict (exit code 0 when solved)
    python -m ropekit.course grade mine/                       # every exercise whose file is in mine/
    python -m ropekit.course grade --solutions                 # the course's own solutions: what this machine grades
    python -m ropekit.course grade mine/ --predict 05_qk_offsets=92   # and your prediction of its % of the floor

``grade`` looks for each exercise's file under the template's name (``ex02_row_kernel.py``, ``ex06_cuda_kernel.cu``),
checks each one found, and for the speed exercise prints the measured % of the byte floor (the copy ceiling measured
in the same run) and the stretch target. What needs a GPU says so on a machine without one. ``--predict NAME=PCT``
grades a prediction of the speed exercise's % of the copy ceiling: on a GPU against the kernel measured now, on a
CPU against the stored measurements of the same tile on each GPU (``speed.grade_prediction``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import ropekit  # noqa: F401  (first: the reader's file may import triton, which must see the interpreter switch)

from . import check, exercise, load_solution, names, task, template_source


def _load(name: str, path: Path):
    """The exercise's entry (function or kernel) from the reader's Python file; a CUDA exercise's source text."""
    ex = exercise(name)
    if ex.language == "cuda":
        return path.read_text()
    spec = importlib.util.spec_from_file_location(f"ropekit_exercise_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, ex.entry):
        raise SystemExit(f"{path} defines no {ex.entry!r}: exercise {name} checks the {ex.language} "
                         f"{'kernel' if ex.language == 'triton' else 'function'} named {ex.entry}")
    return getattr(module, ex.entry)


def _speed_lines(name: str, code, predicted: float | None = None) -> tuple[list[str], bool]:
    """The speed exercise's % of the byte floor and its stretch target (timed on a GPU; said why not elsewhere), and
    the grade of the reader's ``predicted`` % (on a CPU against the stored measurements); and whether the kernel
    was timed."""
    from . import speed

    lines = []
    if predicted is not None:
        lines = ["    prediction: " + line for line in str(speed.grade_prediction(name, code, predicted)).splitlines()
                 if line.strip()]
    stretch = speed.grade_stretch(name, code)
    if stretch.speed is not None:
        return [f"    % of the byte floor: {stretch.speed.pct_ceiling:.1f} % (copy ceiling "
                f"{stretch.speed.ceiling_gbps:.0f} GB/s, measured in this run); stretch target "
                f"{100 * speed.STRETCH:.0f} %: {'passed' if stretch.ok else 'not reached'}"] + lines, True
    if not stretch.graded and "once the values are right" in stretch.message:
        return lines, False
    graded_how = ("your prediction is graded below against stored measurements" if predicted is not None
                  else f"--predict {name}=PCT grades your prediction against stored measurements")
    return [f"    % of the byte floor: needs a GPU (this machine graded correctness; {graded_how})"] + lines, False


def _predictions(pairs: list[str]) -> dict[str, float]:
    """``--predict NAME=PCT`` pairs as {exercise: %}; an exercise that is not a speed exercise is refused."""
    predicted = {}
    for pair in pairs:
        name, _, pct = pair.partition("=")
        if not exercise(name).notes.get("speed_shape"):
            raise SystemExit(f"--predict {pair}: {name} is not a speed exercise (those with one: "
                             f"{', '.join(n for n in names() if exercise(n).notes.get('speed_shape'))})")
        try:
            predicted[name] = float(pct.rstrip("%"))
        except ValueError:
            raise SystemExit(f"--predict {pair}: the prediction is a % of the copy ceiling, e.g. {name}=92") from None
    return predicted


def grade_all(folder: Path | None, predicted: dict[str, float] | None = None) -> int:
    """Check every exercise (the reader's files in ``folder``, or the course's solutions); 0 when none failed."""
    rows, failed = [], 0
    for name in names():
        ex = exercise(name)
        if folder is None:
            code, where = load_solution(name), "solution"
        else:
            path = folder / (ex.module + ex.suffix)
            if not path.exists():
                rows.append((name, "no file", f"start one: python -m ropekit.course template {name} > {path}"))
                continue
            code, where = _load(name, path), str(path)
        result = check(name, code)
        print(f"--- {name} ({where})\n{result}")
        prediction = (predicted or {}).get(name)
        extra, timed = [], False
        if ex.notes.get("speed_shape") and (result.ok or result.diagnosis == "too_slow"):  # correct values
            extra, timed = _speed_lines(name, code, prediction)
        elif prediction is not None:
            extra = [f"    prediction: not graded: the kernel failed its check ({result.diagnosis}); a prediction "
                     "of its speed is graded once its values are right"]
        for line in extra:
            print(line)
        verdict = ("correct; speed not graded here (needs a GPU)" if result.ok and ex.notes.get("speed_shape")
                   and not timed else "PASSED" if result.ok else "needs a GPU" if result.diagnosis == "needs_gpu"
                   else "not yet solved" if result.diagnosis == "not_solved" else f"FAILED ({result.diagnosis})")
        failed += not result.ok and result.diagnosis != "needs_gpu"
        # the summary's note: the prediction's grade where one was given, else the speed line
        notes = [line.strip() for line in extra if line.strip().startswith("prediction:")] or [
            line.strip() for line in extra[:1]]
        rows.append((name, verdict, notes[0] if notes else ""))
    print("\n=== grades")
    for name, verdict, note in rows:
        print(f"{name:26s} {verdict:28s} {note}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.course", description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m ropekit.course check 02_row_kernel mine.py")
    commands = parser.add_subparsers(dest="command", metavar="command", required=True)
    commands.add_parser("list", help="every exercise and its title")
    for command, what in (("task", "what to write"), ("template", "the template's source, to start from")):
        commands.add_parser(command, help=what).add_argument("name", help="an exercise (see list)")
    checker = commands.add_parser("check", help="check your file (exit code 0 when the exercise is solved)")
    checker.add_argument("name", help="an exercise (see list)")
    checker.add_argument("file", type=Path, help="your .py file (.cu for a CUDA exercise)")
    grader = commands.add_parser("grade", help="check every exercise (exit code 0 when none failed)")
    grader.add_argument("folder", type=Path, nargs="?",
                        help="your files, named as the templates are (ex02_row_kernel.py, ex06_cuda_kernel.cu)")
    grader.add_argument("--solutions", action="store_true", help="grade the course's own solutions instead")
    grader.add_argument("--predict", action="append", default=[], metavar="NAME=PCT",
                        help="your prediction of a speed exercise's %% of the copy ceiling, graded beside it")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in names():
                print(f"{name:28s} {exercise(name).title}")
        elif args.command == "task":
            print(task(args.name))
        elif args.command == "template":
            print(template_source(args.name), end="")
        elif args.command == "grade":
            if (args.folder is None) == (not args.solutions):
                parser.error("grade takes a folder of your files, or --solutions")
            return grade_all(None if args.solutions else args.folder, _predictions(args.predict))
        else:
            result = check(args.name, _load(args.name, args.file))
            print(result)
            return 0 if result.ok else 1
    except KeyError as error:  # an unknown exercise: the message lists the known ones
        parser.error(error.args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
