"""``python -m ropekit <command>``: check | info | bench | stress (the parser: :mod:`ropekit.cli`)."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time

from ropekit.cli import SELF_PARSING, build_parser


def _check(args) -> int:
    import ropekit
    from ropekit.checks import format_table, run_checks

    print(f"ropekit {ropekit.__version__}: calls run on {ropekit.device.describe()}")
    if ropekit.device.INTERPRET:
        kernels = ("the Triton kernels are skipped: " + ropekit.device.INTERPRETER_MISSING
                   if ropekit.device.INTERPRETER_MISSING else
                   "the Triton kernels are checked in Triton's interpreter (small sizes; correctness only)")
        print(f"No CUDA GPU here: calls compute in PyTorch ops (the native backend); {kernels}.")
    start = time.perf_counter()
    rows = run_checks()
    print(format_table(rows))
    failed = [r for r in rows if r.configs and not r.ok]
    print(f"{'FAILED' if failed else 'all available kernels match the float64 reference'} "
          f"({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


def _info(args) -> int:
    import torch

    import ropekit

    print(f"ropekit   {ropekit.__version__}  ({ropekit.__file__})")
    print(f"python    {platform.python_version()}")
    print(f"torch     {torch.__version__}")
    try:
        triton = importlib.import_module("triton")
        print(f"triton    {triton.__version__}")
    except ImportError as error:
        print(f"triton    missing ({error})")
    print(f"device    {ropekit.device.describe()}")
    print("backends:")
    if ropekit.device.INTERPRETER_MISSING:
        print(f"  triton  unavailable: {ropekit.device.INTERPRETER_MISSING}")
    else:
        print(f"  triton  works ({'interpreter' if ropekit.device.INTERPRET else 'compiled for the GPU'})")
    print("  native  works (PyTorch ops)")
    print(f"default   {ropekit.device.default_backend()} (ropekit.device.set_backend, ROPEKIT_BACKEND)")
    try:
        from ropekit.cuda import available

        ok, why = available()
    except ImportError as error:
        ok, why = False, str(error)
    print(f"  cuda    {'works' if ok else 'unavailable'}: {why}")
    for peer in ("liger_kernel", "transformers"):
        try:
            module = importlib.import_module(peer)
            print(f"peer      {peer} {getattr(module, '__version__', '')}")
        except ImportError:
            print(f"peer      {peer} not installed")
    return 0


def _bench(args) -> int:
    from ropekit import bench

    return bench.main(args.rest)


def _stress(args) -> int:
    from ropekit.reliability import cli

    return cli.main(args.rest)


def main(argv: list[str] | None = None) -> int:
    import ropekit

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SELF_PARSING:
        return (_bench if argv[0] == "bench" else _stress)(argparse.Namespace(rest=argv[1:]))
    args = build_parser(ropekit.__version__).parse_args(argv)
    return {"check": _check, "info": _info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
