"""Figures from a benchmark document (matplotlib, imported lazily; files written with the Agg backend).

* ``plot_cases``: per case, GB/s of every implementation, with the copy ceiling drawn (forward or backward).
* ``plot_small``: the small cases' microseconds — graph replay L2-resident and DRAM, and the eager call.
* ``plot_sweep``: the seed sweep, GB/s vs sequence length, one panel per batch, every implementation.
* ``plot_model``: no measurement at all — the bytes each approach must move per call, the reason for the ceiling.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_cases", "plot_small", "plot_sweep", "plot_model", "write_plots", "PLOT_FILES"]

PLOT_FILES = {
    "forward": "benchmarks_forward.png",
    "small": "benchmarks_small.png",
    "backward": "benchmarks_backward.png",
    "sweep": "benchmarks_sweep.png",
}
_PALETTE = ["#9e9e9e", "#7f7f7f", "#5f5f5f", "#1f77b4", "#0b3d91", "#2ca02c", "#17becf", "#8c564b", "#d62728",
            "#ff7f0e", "#9467bd", "#e377c2"]


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("the benchmark's plots need matplotlib: pip install 'ropekit[bench]'") from error

    if matplotlib.get_backend().lower() not in ("agg",) and not _in_notebook():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _in_notebook() -> bool:
    import sys

    return "ipykernel" in sys.modules


def _colors(doc) -> dict:
    return {impl["name"]: _PALETTE[i % len(_PALETTE)] for i, impl in enumerate(doc["impls"])}


def _ok_rows(doc, **match) -> list[dict]:
    return [r for r in doc["rows"] if r["status"] == "ok" and all(r[k] == v for k, v in match.items())]


def _ceiling(doc) -> float | None:
    return doc["copy_ceiling"]["gbps"] if doc.get("copy_ceiling") else None


def _save(fig, path):
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def plot_cases(doc: dict, path=None, direction: str = "forward"):
    """One panel per main case: horizontal GB/s bars (DRAM; L2-resident as a lighter bar), ceiling as a line."""
    plt = _pyplot()
    cases = [c for c in doc["cases"] if c["group"] == "main" and _ok_rows(doc, case=c["name"], direction=direction)]
    if not cases:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.text(0.5, 0.5, f"no {direction} measurements in this document", ha="center", va="center")
        ax.axis("off")
        return _save(fig, path)
    colors, ceiling = _colors(doc), _ceiling(doc)
    order = [i["name"] for i in doc["impls"]]
    ncols = min(3, len(cases))
    nrows = -(-len(cases) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        rows = _ok_rows(doc, case=case["name"], direction=direction)
        names = [n for n in order if any(r["impl"] == n for r in rows)]
        for y, name in enumerate(names):
            for residency, height, alpha in (("dram", 0.8, 1.0), ("l2", 0.35, 0.45)):
                row = next((r for r in rows if r["impl"] == name and r["residency"] == residency), None)
                if row is None or row["gbps"] is None:
                    continue
                ax.barh(y, row["gbps"], height=height, color=colors[name], alpha=alpha)
                if residency == "dram":
                    ax.text(row["gbps"], y, f" {row['time_us']:.1f} µs ({row['time_source']})", va="center",
                            fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        if ceiling:
            ax.axvline(ceiling, color="k", linestyle="--", linewidth=1)
            ax.text(ceiling, len(names) - 0.45, "copy ceiling ", ha="right", va="bottom", fontsize=7)
        ax.set_xlabel("GB/s (q, k read + written once)")
        ax.set_title(case["name"], fontsize=9)
        ax.set_xlim(0, max([ceiling or 0] + [r["gbps"] for r in rows if r["gbps"]]) * 1.35)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    fig.suptitle(f"{direction}: GB/s per implementation (bars: DRAM; thin bars: L2-resident) - "
                 f"{doc['environment'].get('gpu', '?')}", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_small(doc: dict, path=None):
    """Small cases: µs per call, graph replay (L2-resident, DRAM) and eager call (L2-resident); the launch-chain
    floor, where the run measured it, as a dashed line."""
    plt = _pyplot()
    small = [c["name"] for c in doc["cases"] if _ok_rows(doc, case=c["name"], residency="l2")]
    fig, axes = plt.subplots(1, max(1, len(small)), figsize=(6.5 * max(1, len(small)), 3.6), squeeze=False)
    if not small:
        axes[0, 0].text(0.5, 0.5, "no L2-resident (small) cases in this document", ha="center", va="center")
        axes[0, 0].axis("off")
        return _save(fig, path)
    order = [i["name"] for i in doc["impls"]]
    series = (("graph L2", "l2", "graph_us"), ("graph DRAM", "dram", "graph_us"), ("eager L2", "l2", "eager_us"))
    for ax, name in zip(axes.flat, small):
        rows = _ok_rows(doc, case=name, direction="forward")
        names = [n for n in order if any(r["impl"] == n for r in rows)]
        width = 0.8 / len(series)
        for s, (label, residency, key) in enumerate(series):
            values = []
            for impl in names:
                row = next((r for r in rows if r["impl"] == impl and r["residency"] == residency), None)
                values.append(row[key] if row is not None and row[key] is not None else 0.0)
            ax.bar([i + s * width for i in range(len(names))], values, width=width, label=label)
        floor_us = (doc.get("launch_floors", {}).get(name) or {}).get("graph_us")
        if floor_us:
            ax.axhline(floor_us, color="black", lw=1, ls="--", label=f"launch-chain floor {floor_us:.2f} µs")
        ax.set_xticks([i + width for i in range(len(names))], names, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("µs per call")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_sweep(doc: dict, path=None):
    """The seed sweep: GB/s vs sequence length, one panel per batch size, every implementation, ceiling drawn."""
    plt = _pyplot()
    sweep = {c["name"]: c for c in doc["cases"] if c["group"] == "sweep"}
    rows = [r for r in _ok_rows(doc) if r["case"] in sweep]
    batches = sorted({sweep[r["case"]]["batch"] for r in rows})
    fig, axes = plt.subplots(1, max(1, len(batches)), figsize=(4.2 * max(1, len(batches)), 3.4), squeeze=False,
                             sharey=True)
    if not batches:
        axes[0, 0].text(0.5, 0.5, "no sweep in this document (run with --groups sweep)", ha="center", va="center")
        axes[0, 0].axis("off")
        return _save(fig, path)
    colors, ceiling = _colors(doc), _ceiling(doc)
    for ax, batch in zip(axes.flat, batches):
        for impl in [i["name"] for i in doc["impls"]]:
            points = sorted((sweep[r["case"]]["seqlen"], r["gbps"]) for r in rows
                            if r["impl"] == impl and sweep[r["case"]]["batch"] == batch and r["gbps"])
            if points:
                ax.plot(*zip(*points), marker=".", markersize=3, linewidth=1, label=impl, color=colors[impl])
        if ceiling:
            ax.axhline(ceiling, color="k", linestyle="--", linewidth=1, label="copy ceiling")
        ax.set_title(f"batch {batch}", fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylim(bottom=0)
    axes[0, 0].set_ylabel("GB/s (do_bench median)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.suptitle("seed sweep: sbhd, 64 heads x 128, fp16, q and k", fontsize=10)
    fig.tight_layout()
    fig.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, path)


def plot_model(cases, path=None):
    """Bytes per call that each approach must move (a model, nothing measured): the fused kernels read and write
    q and k once; transformers' eager formula runs five elementwise kernels per tensor
    (``Case.eager_formula_bytes``)."""
    plt = _pyplot()
    cases = [c for c in cases if getattr(c, "group", "main") == "main"]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    fused = [c.moved_bytes(inplace=bool(c.inplace)) / 1e6 for c in cases]
    eager = [c.eager_formula_bytes() / 1e6 for c in cases]
    xs = range(len(cases))
    ax.bar([x - 0.2 for x in xs], fused, width=0.4, label="one fused pass (read + write q, k once)")
    ax.bar([x + 0.2 for x in xs], eager, width=0.4, label="eager formula, 5 kernels per tensor")
    ax.set_xticks(list(xs), [c.name for c in cases], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("MB moved per call")
    ax.set_title("the floor: time >= bytes moved / copy ceiling (model, not a measurement)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def write_plots(doc: dict, out_dir) -> list[Path]:
    """Every figure of ``doc`` as PNG files in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    plt = _pyplot()
    written = []
    for key, draw in (("forward", lambda p: plot_cases(doc, p, "forward")),
                      ("small", lambda p: plot_small(doc, p)),
                      ("backward", lambda p: plot_cases(doc, p, "backward")),
                      ("sweep", lambda p: plot_sweep(doc, p))):
        path = out_dir / PLOT_FILES[key]
        fig = draw(path)
        plt.close(fig)
        written.append(path)
    return written
