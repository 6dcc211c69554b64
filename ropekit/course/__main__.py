"""``python -m ropekit.course``: the exercises from a terminal, for a reader working in a file instead of a notebook.

    python -m ropekit.course list                              # every exercise and its title
    python -m ropekit.course task 02_row_kernel                # what to write
    python -m ropekit.course template 02_row_kernel > mine.py  # a file to start from
    python -m ropekit.course check 02_row_kernel mine.py       # the checker's verdict (exit code 0 when solved)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import ropekit  # noqa: F401  (first: the reader's file may import triton, which must see the interpreter switch)

from . import check, exercise, names, task, template_source


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
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in names():
                print(f"{name:28s} {exercise(name).title}")
        elif args.command == "task":
            print(task(args.name))
        elif args.command == "template":
            print(template_source(args.name), end="")
        else:
            result = check(args.name, _load(args.name, args.file))
            print(result)
            return 0 if result.ok else 1
    except KeyError as error:  # an unknown exercise: the message lists the known ones
        parser.error(error.args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
