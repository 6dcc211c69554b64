"""The command line's parser, in the standard library only: ``ropekit/__init__.py`` runs it before torch loads.

``python -m ropekit`` imports the package before it runs ``__main__``, and the package imports torch. So the package
parses its own command line first (:func:`answer_early`): ``--help``, ``--version`` and usage errors are answered
there, in a fraction of a second; a command that does work goes on into the full import and ``__main__.main``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SELF_PARSING = ("bench", "stress")  # commands that parse their own options (argparse REMAINDER would not pass --help)


def build_parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ropekit", description="RoPE kernels: check, inspect, measure.",
                                     epilog="example: python -m ropekit check   (python -m ropekit bench --help / "
                                            "stress --help list their options)")
    parser.add_argument("--version", action="version", version=f"ropekit {version}")
    commands = parser.add_subparsers(dest="command", metavar="command", required=True)
    commands.add_parser("check", help="check every available kernel against the float64 reference (table)",
                        epilog="example: python -m ropekit check   (on a CPU it uses the Triton interpreter)")
    commands.add_parser("info", help="versions, device, and which backends work here (and why not)",
                        epilog="example: python -m ropekit info")
    commands.add_parser("bench", help="benchmark all implementations on the GPU (JSON + PNG)", add_help=False)
    commands.add_parser("stress", help="GPU reliability run: property tests, large tensors, determinism",
                        add_help=False)
    return parser


def command_line() -> list[str] | None:
    """This process's arguments when it is ropekit's command line (``python -m ropekit ...`` while Python is still
    importing the package to find ``__main__``, or the ``ropekit`` script), else None."""
    if sys.argv[:1] == ["-m"]:  # Python sets argv[0] to "-m" while it imports the packages above the -m module
        args = sys.orig_argv
        named = [args[i + 1] for i in range(len(args) - 1) if args[i] == "-m"]
        return sys.argv[1:] if named[:1] == ["ropekit"] else None
    return sys.argv[1:] if sys.argv and Path(sys.argv[0]).name == "ropekit" else None


def answer_early(version: str) -> None:
    """Answer ``--help``, ``--version`` and usage errors of ropekit's command line (argparse exits); otherwise return."""
    argv = command_line()
    if argv is not None and not (argv and argv[0] in SELF_PARSING):
        build_parser(version).parse_args(argv)
