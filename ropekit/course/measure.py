"""Timing for the course notebooks: one launch against the copy ceiling, and the kernel ladder's benchmark rows.

Two questions, one function each:

* :func:`time_launch` — how long does this launch take, how many GB/s is that, and what share of the device's copy
  ceiling (a large device-to-device copy measured in the same process)? Device time comes from
  :class:`ropekit.bench.timing.GpuTimer`: the calls are captured back to back in a CUDA graph and replayed, and the
  median over the replays is reported. The caller passes freshly allocated random inputs; tensors larger than the L2
  cache come from DRAM on every call.
* :func:`show_ladder` — the benchmark harness's fixed cases for some implementations: measured in this run on a GPU,
  read from the committed benchmark run (``docs/benchmarks.json``) on a CPU, where nothing is ever timed.

Both refuse to time the Triton interpreter: on a CPU :func:`time_launch` raises and :func:`show_ladder` shows the
published rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch

__all__ = ["Measurement", "copy_ceiling", "time_launch", "LADDER_CASES", "ladder_rows", "ladder_table",
           "plot_ladder", "show_ladder"]

# The benchmark's fixed cases the ladder notebooks show (ropekit.bench.cases holds what each one is).
LADDER_CASES = ("llama3-8b-prefill", "decode", "mha-fp16", "fp32")

_CEILING: dict = {}  # the copy ceiling of this process, measured once (key: the timer's settings)


@dataclass(frozen=True)
class Measurement:
    """One timed launch: median device time per call and what it means against the copy ceiling."""

    label: str
    time_us: float
    bytes_moved: int
    gbps: float
    ceiling_gbps: float
    pct_ceiling: float
    spread: float  # (80th - 20th percentile) / median of the replays
    predicted_pct: float | None = None  # the performance model's prediction, when the caller gave one

    @property
    def share(self) -> float:
        """Share of the copy ceiling (1.0: as fast as copying the same bytes)."""
        return self.pct_ceiling / 100.0

    def line(self) -> str:
        text = (f"{self.label:32s} {self.time_us:9.1f} µs  {self.gbps:6.0f} GB/s  {self.pct_ceiling:5.1f} % of copy "
                f"(± {100 * self.spread:.0f} %)")
        if self.predicted_pct is not None:
            text += f"  predicted {self.predicted_pct:5.1f} %"
        return text

    def to_json(self) -> dict:
        return asdict(self)


def _default_timer():
    from ropekit.bench.timing import QUICK, GpuTimer

    if not torch.cuda.is_available():
        raise RuntimeError("time_launch times CUDA devices only: the Triton interpreter on a CPU is never timed")
    return GpuTimer(QUICK)


def copy_ceiling(timer=None, *, fresh: bool = False) -> dict:
    """The copy ceiling ``{"gbps", "time_us", "method", ...}``, measured once per process and timer settings
    (``fresh``: measured again now, and kept for the launches timed after it)."""
    timer = timer or _default_timer()
    key = repr(getattr(timer, "settings", id(timer)))
    if fresh or key not in _CEILING:
        _CEILING[key] = timer.copy_ceiling()
    return _CEILING[key]


def time_launch(fn: Callable | Sequence[Callable], bytes_moved: int, *, label: str = "", timer=None,
                predicted_pct: float | None = None) -> Measurement:
    """Time ``fn()`` (or a list of calls, one per buffer set, replayed in turn) by CUDA-graph replay.

    ``bytes_moved``: what one call must read and write (the floor's numerator, e.g. ``2 * x.nbytes`` for an
    out-of-place elementwise kernel). ``timer``: anything with ``copy_ceiling()`` and ``graph_us(fns, estimate_us)``
    (default: ``GpuTimer(QUICK)``; the tests pass a fake one).
    """
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if bytes_moved <= 0:
        raise ValueError(f"bytes_moved must be positive, got {bytes_moved}")
    timer = timer or _default_timer()
    ceiling = copy_ceiling(timer)["gbps"]
    estimate_us = bytes_moved / (ceiling * 1e9) * 1e6  # what a call would take at the ceiling: sizes the graph
    time_us, spread, _calls = timer.graph_us(fns, estimate_us)
    gbps = bytes_moved / (time_us * 1e-6) / 1e9
    return Measurement(label, time_us, bytes_moved, gbps, ceiling, 100.0 * gbps / ceiling, spread, predicted_pct)


# --- the ladder: the benchmark harness's rows -----------------------------------------------------------------------

def ladder_rows(impls: Sequence[str], cases: Sequence[str] = LADDER_CASES) -> tuple[list[dict], str | None]:
    """(forward rows of ``cases`` x ``impls``, where they come from): this run on a GPU, else the published run."""
    from ropekit import bench

    if torch.cuda.is_available():
        selected = [c.scaled_down(backward=False) for c in bench.select_cases(("main",), list(cases))]
        rows = bench.run(selected, list(impls), progress=False)
        source = f"measured in this run on {torch.cuda.get_device_name()}"
    else:
        published = bench.load_published()
        if not published:
            return [], None
        rows = published["rows"]
        source = (f"published run on {published['environment'].get('gpu')} ({published['created']}; how it was "
                  "made: docs/benchmarks.md)")
    chosen = [r for r in rows if r["direction"] == "forward" and r["case"] in cases and r["impl"] in impls]
    chosen.sort(key=lambda r: (list(cases).index(r["case"]), list(impls).index(r["impl"]), r["residency"] or ""))
    return chosen, source


def ladder_table(rows: list[dict], predict: Callable[[dict], float | None] | None = None) -> str:
    """A markdown table of ladder rows; ``predict(row)`` adds the performance model's % of copy next to it."""
    head = "| case | implementation | inputs in | time (µs) | GB/s | % of copy |"
    rule = "|---|---|---|---:|---:|---:|"
    if predict:
        head, rule = head + " predicted % |", rule + "---:|"
    lines = [head, rule]
    for r in rows:
        if r["status"] == "ok":
            pct = f"{r['pct_ceiling']:.0f} %" if r.get("pct_ceiling") else "—"
            line = f"| {r['case']} | {r['impl']} | {r['residency']} | {r['time_us']:.1f} | {r['gbps']:.0f} | {pct} |"
            if predict:
                guess = predict(r)
                line += f" {guess:.0f} % |" if guess is not None else " — |"
        else:
            line = f"| {r['case']} | {r['impl']} | — | {r['status']}: {(r['reason'] or '')[:90]} | | |"
            if predict:
                line += " |"
        lines.append(line)
    return "\n".join(lines)


def plot_ladder(rows: list[dict], impls: Sequence[str], title: str, cases: Sequence[str] = LADDER_CASES):
    """Bars of DRAM GB/s per case and implementation, the copy ceiling as a line; returns the figure."""
    import matplotlib.pyplot as plt

    dram = [r for r in rows if r["status"] == "ok" and r["residency"] == "dram"]
    shown = [c for c in cases if any(r["case"] == c for r in dram)]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        points = [(j + i * width, r["gbps"]) for j, c in enumerate(shown) for r in dram
                  if r["case"] == c and r["impl"] == impl]
        if points:
            ax.bar([x for x, _ in points], [y for _, y in points], width=width, label=impl)
    ceilings = [r["ceiling_gbps"] for r in dram if r.get("ceiling_gbps")]
    if ceilings:
        ax.axhline(ceilings[0], color="k", ls="--", lw=1, label="copy ceiling")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shown))], shown)
    ax.set_ylabel("GB/s (DRAM)")
    ax.set_title(title, fontsize=10)
    # the legend sits below the axes, never on the bars
    ax.legend(fontsize=8, ncol=min(len(impls) + 1, 4), loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    return fig


def show_ladder(impls: Sequence[str], predict: Callable[[dict], float | None] | None = None,
                cases: Sequence[str] = LADDER_CASES) -> list[dict]:
    """Display the ladder's table and bar chart in a notebook (see :func:`ladder_rows`); return the rows."""
    from IPython.display import Markdown, display

    rows, source = ladder_rows(impls, cases)
    if not rows:
        print("no GPU here and no published benchmark run (docs/benchmarks.json); the interpreter is never timed")
        return rows
    display(Markdown(f"**{source}**\n\n" + ladder_table(rows, predict)))
    import matplotlib.pyplot as plt

    plot_ladder(rows, impls, source.split(" (")[0], cases)
    plt.show()
    return rows
