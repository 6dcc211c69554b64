"""What the bench package's study commands (``python -m ropekit.bench.angles``, ``python -m ropekit.bench.mrope``)
share: their two options, the timing that runs only on a CUDA GPU, and the JSON they leave in ``--out``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

__all__ = ["parser", "finish"]


def parser(module: str, doc: str, json_name: str, no_speed_help: str) -> argparse.ArgumentParser:
    """The command line of ``python -m ropekit.bench.<module>``: ``--out DIR`` (where ``json_name`` goes) and
    ``--no-speed``; the caller adds its own options."""
    cli = argparse.ArgumentParser(prog=f"python -m ropekit.bench.{module}", description=doc.split("\n\n")[0])
    cli.add_argument("--out", type=Path, required=True, help=f"directory for {json_name}")
    cli.add_argument("--no-speed", action="store_true", help=no_speed_help)
    return cli


def finish(args: argparse.Namespace, result: dict, device, json_name: str, speed: Callable, report: Callable) -> int:
    """Times ``speed(device)`` into ``result["speed"]`` and prints ``report`` of it, on a CUDA GPU unless
    ``--no-speed``; elsewhere says the timing is skipped. Then writes ``result`` to ``args.out / json_name``."""
    if not args.no_speed:
        if device != "cuda":
            print("speed: needs a CUDA GPU (skipped)")
        else:
            result["speed"] = speed(device)
            print(f"== speed on {result['device']} (CUDA-graph replay, µs per call)")
            print(report(result["speed"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / json_name).write_text(json.dumps(result, indent=1))
    return 0
