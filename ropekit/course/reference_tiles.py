"""``python -m ropekit.course.reference_tiles --out ropekit/course/data/reference_tiles.json`` (on a CUDA GPU).

Measures the speed exercise's solution kernel (``05_qk_offsets``) at every tile of ``speed.REFERENCE_TILES`` on the
exercise's stated shape, against a device-to-device copy measured in the same run: fresh random inputs far larger
than L2, CUDA-graph replay medians (``measure.time_launch``), the tiles timed in interleaved rounds and each tile's
median over the rounds kept. The run is stored under the GPU's name in ``--out`` (other GPUs' runs in the file are
kept), with the command, commit, versions and date, so that ``speed.grade_prediction`` and ``speed.grade_stretch`` can
grade a reader without a GPU. Run it once on each GPU of ``speed.GPUS``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

__all__ = ["measure_tiles", "commit", "main"]


def commit() -> str | None:
    """The checkout's commit, for a stored run's provenance (None outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def measure_tiles(rounds: int = 3, timer=None) -> dict:
    """One GPU's run: the copy ceiling, then every reference tile ``rounds`` times, interleaved."""
    import triton

    from ropekit.bench.timing import Settings, GpuTimer

    from . import measure, speed
    from .exercises import exercise, launch_qk, load_solution

    name = "05_qk_offsets"
    ex, kernel = exercise(name), load_solution(name)
    shape = ex.notes["speed_shape"]
    timer = timer or GpuTimer(Settings())
    inputs = shape.build("cuda")
    ceiling = measure.copy_ceiling(timer, fresh=True)
    times: dict[tuple, list] = {tile: [] for tile in speed.REFERENCE_TILES}
    spreads: dict[tuple, list] = {tile: [] for tile in speed.REFERENCE_TILES}
    for _ in range(rounds):
        for tile in speed.REFERENCE_TILES:
            def run(tile=tile):
                launch_qk(kernel, *inputs.arguments, tile=tile)
            result = measure.time_launch(run, inputs.bytes_moved, label=str(tile), timer=timer)
            times[tile].append(result.time_us)
            spreads[tile].append(result.spread)
    ceiling_after = timer.copy_ceiling()
    rows = []
    for tile in speed.REFERENCE_TILES:
        time_us = statistics.median(times[tile])
        gbps = inputs.bytes_moved / (time_us * 1e-6) / 1e9
        rows.append({"block_s": tile[0], "block_h": tile[1], "num_warps": tile[2], "time_us": time_us,
                     "round_times_us": times[tile], "spread": max(spreads[tile]), "gbps": gbps,
                     "pct_ceiling": 100.0 * gbps / ceiling["gbps"]})
    return {
        "device": torch.cuda.get_device_name(),
        "shape": shape.words,
        "bytes_moved": inputs.bytes_moved,
        "ceiling_gbps": ceiling["gbps"],
        "ceiling_gbps_after": ceiling_after["gbps"],
        "method": "CUDA-graph replay medians (ropekit.bench.timing.GpuTimer, default settings), tiles interleaved "
                  f"over {rounds} rounds, median of the rounds; % of the copy ceiling measured before the tiles",
        "command": "python -m " + " ".join(["ropekit.course.reference_tiles", *sys.argv[1:]]),
        "commit": commit(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "tiles": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.course.reference_tiles",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to add this GPU's run to")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the tiles (default 3)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("reference_tiles measures on a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    run = measure_tiles(args.rounds)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data.setdefault("runs", {})[run["device"]] = run
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{run['device']}: copy ceiling {run['ceiling_gbps']:.0f} GB/s (after: {run['ceiling_gbps_after']:.0f})")
    for row in run["tiles"]:
        print(f"  tile {row['block_s']:2d} x {row['block_h']} , {row['num_warps']} warps: {row['time_us']:7.1f} µs "
              f"{row['pct_ceiling']:5.1f} % of copy (rounds {', '.join(f'{t:.1f}' for t in row['round_times_us'])})")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
