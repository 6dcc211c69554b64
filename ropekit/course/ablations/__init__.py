"""Ablations: experiments that each change one thing about a kernel and measure what it costs.

    python -m ropekit.course.ablations --out DIR            # on a GPU: every experiment, DIR/ablations.json
    python -m ropekit.course.ablations --out DIR --only coalescing
    python -m ropekit.course.ablations --out DIR --cpu      # no GPU: the code path at toy sizes, marked as CPU data

Every run measures the copy ceiling first, then times each variant by CUDA-graph replay
(:class:`ropekit.bench.timing.GpuTimer`, medians over interleaved rounds, after a warm-up call), on fresh random inputs
sized far beyond the L2 cache. Each row carries the performance model's prediction (:mod:`ropekit.course.perf_model`)
next to the measurement. On a CPU nothing is timed that means anything: ``--cpu`` only proves the code path and
writes ``"on_gpu": false``; the notebooks say which device their numbers come from.

Adding an experiment: a new module in this package with a function decorated by
``@experiment(name, question)`` (see :mod:`.registry`). Modules are discovered and run in alphabetical order.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import torch

from .registry import EXPERIMENTS, Experiment, Lab, WallTimer, experiment

__all__ = ["EXPERIMENTS", "Experiment", "experiment", "Lab", "run", "load", "rows", "plot_rows", "main", "DATA_FILE"]

# Where the notebooks read the committed GPU run from.
DATA_FILE = Path(__file__).resolve().parents[3] / "notebooks" / "data" / "ablations.json"

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("registry", "kernels", "__main__"):
        importlib.import_module(f"{__name__}.{_module}")


def run(names=None, *, on_gpu: bool | None = None, timer=None, log=None) -> dict:
    """Run the named experiments (None: all) and return the document ``main`` writes; ``log(line)``, when given,
    hears of each experiment as it finishes (the command line prints them on stderr; a notebook stays quiet)."""
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    if timer is None:
        if on_gpu:
            from ropekit.bench.timing import QUICK, GpuTimer
            timer = GpuTimer(QUICK)
        else:
            timer = WallTimer()
    chosen = list(EXPERIMENTS) if not names else list(names)
    unknown = [n for n in chosen if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}")
    lab = Lab(on_gpu, timer)
    import triton

    doc = {
        "on_gpu": on_gpu,
        "device": lab.model.name if on_gpu else "cpu: Triton interpreter, timings meaningless (code path only)",
        "n_sms": lab.model.n_sms,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "triton": triton.__version__,
        "timer": str(getattr(timer, "settings", type(timer).__name__)),
        "copy_ceiling": lab.ceiling,
        "experiments": {},
    }
    for name in chosen:
        result = EXPERIMENTS[name].run(lab)
        doc["experiments"][name] = {"question": EXPERIMENTS[name].question, **result}
        if log is not None:
            log(f"[ablations] {name}: {len(result['rows'])} rows")
    doc["model"] = {"latency_ns": lab.model.latency_ns, "latency_source": lab.model.latency_source,
                    "needed_bytes_in_flight_per_sm": lab.model.needed_bytes_in_flight_per_sm}
    return doc


def load(path=None) -> dict | None:
    """The committed ablation run (``notebooks/data/ablations.json``), or None when there is none."""
    path = Path(path) if path else DATA_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def rows(doc: dict | None, name: str, case_prefix: str = "") -> list[dict]:
    """The rows of experiment ``name`` in ``doc`` (those whose ``case`` starts with ``case_prefix``); [] if absent."""
    found = (doc or {}).get("experiments", {}).get(name, {}).get("rows", [])
    return [r for r in found if str(r.get("case", "")).startswith(case_prefix)]


def plot_rows(rows_: list[dict], title: str):
    """Horizontal bars of % of the copy ceiling per variant, the model's prediction as a tick; returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows_) + 1.4))
    names = [r["variant"] for r in rows_]
    ax.barh(names, [r["pct_ceiling"] for r in rows_], color="tab:blue", label="measured")
    predicted = [(r["predicted_pct"], r["variant"]) for r in rows_ if r.get("predicted_pct") is not None]
    if predicted:
        ax.scatter(*zip(*predicted), marker="|", s=250, color="k", zorder=3, label="model")
    ax.invert_yaxis()
    ax.set(xlabel="% of the copy ceiling", xlim=(0, 110))
    ax.set_title(title, loc="left")
    fig.legend(loc="lower center", ncol=2, frameon=False)  # below the axes, never on the bars
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.course.ablations",
                                     description="Run the course's ablations; write DIR/ablations.json.")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--only", help="comma-separated experiment names (default: all): " + ", ".join(EXPERIMENTS))
    parser.add_argument("--cpu", action="store_true",
                        help="no GPU: run the code path at toy sizes under the interpreter (timings meaningless)")
    args = parser.parse_args(argv)
    if torch.cuda.is_available() == args.cpu:
        print("error: " + ("--cpu is for machines without a GPU" if args.cpu else
                           "no GPU: the interpreter is never timed; pass --cpu to check the code path"),
              file=sys.stderr)
        return 2
    doc = run(args.only.split(",") if args.only else None, on_gpu=not args.cpu,
              log=lambda line: print(line, file=sys.stderr))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "ablations.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)
    return 0
