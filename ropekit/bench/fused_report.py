"""The fused benchmark's outputs from its JSON document: the targets judged, the markdown page, the figure.

``evaluate_targets`` reads only the document, so that a published run can be re-judged and re-rendered anywhere
(``python -m ropekit.bench.fused_report docs/benchmarks_fused.json --out docs``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .floor import NAME as LAUNCH_FLOOR  # the row ropekit.bench.fused times beside a decode case's implementations
from .floor import NAME_DEPENDENT as LAUNCH_FLOOR_DEPENDENT  # and the same chain launched programmatically

__all__ = ["evaluate_targets", "write_outputs", "publish", "render_markdown", "write_plot", "best_unfused",
           "timed_rows"]

EQUAL_WITHIN = 0.01  # "no slower than": within the run-to-run spread (1%) counts as equal
DECODE_OVER_LAUNCH_FLOOR = 1.3  # fused decode at most this many times the launch-chain floor (graph replay)
# prefill: (fraction of the byte floor, speed-up over the best unfused pipeline) in the model's dtype, and for a
# quantised format (a quantised cache or a float8 q), whose unfused pipeline also computes the quantisation
PREFILL = {False: (0.95, 1.3), True: (0.93, 1.5)}
FORMAT_SPEEDUP = PREFILL[True][1]  # every format, decode and prefill: at least this much faster than unfused
FUSED, COMPILE = "ropekit-fused", "torch.compile"


def timed_rows(doc: dict, case: str) -> dict:
    """The rows of ``case`` that have a graph time, by implementation name (references included)."""
    return {r["impl"]: r for r in doc["rows"] if r["case"] == case and r.get("graph_us")}


def best_unfused(rows: dict):
    """The fastest unfused pipeline's row among ``rows`` (impl -> row), or None."""
    unfused = [r for name, r in rows.items() if name.startswith("unfused")]
    return min(unfused, key=lambda r: r["graph_us"]) if unfused else None


def _quantised(case: dict) -> bool:
    """A case with a quantised output (its cache or a float8 q)."""
    return bool(case.get("quantised", case["fp8"]))


def evaluate_targets(doc: dict) -> list[dict]:
    """Each target of the case it applies to: its value and whether it is met (None: not measured)."""
    targets = []

    def add(case, target, value, met):
        targets.append({"case": case["name"], "target": target, "value": value,
                        "met": None if value is None else bool(met)})

    for case in doc["cases"]:
        rows = timed_rows(doc, case["name"])
        fused, unfused, compiled = rows.get(FUSED), best_unfused(rows), rows.get(COMPILE)
        floor = case.get("floor_us")
        fraction = floor / fused["graph_us"] if fused and floor else None
        speedup = unfused["graph_us"] / fused["graph_us"] if fused and unfused else None
        quantised = _quantised(case)
        if case["kind"] == "backward":
            add(case, "backward >= 90% of its byte floor", fraction, fraction is not None and fraction >= 0.90)
        elif not case["decode"]:
            share, faster = PREFILL[quantised]
            add(case, f"prefill >= {share:.0%} of the fused byte floor", fraction,
                fraction is not None and fraction >= share)
            add(case, f">= {faster:g}x faster than the best unfused pipeline", speedup,
                speedup is not None and speedup >= faster)
        else:
            ratio = fused["graph_us"] / unfused["graph_us"] if fused and unfused else None
            add(case, "decode <= 0.5x the best unfused pipeline", ratio, ratio is not None and ratio <= 0.5)
            versus = fused["graph_us"] / compiled["graph_us"] if fused and compiled else None
            add(case, "decode no slower than torch.compile of the chain", versus,
                versus is not None and versus <= 1 + EQUAL_WITHIN)
            chain = rows.get(LAUNCH_FLOOR)
            over = fused["graph_us"] / chain["graph_us"] if fused and chain else None
            add(case, f"decode <= {DECODE_OVER_LAUNCH_FLOOR:g}x the launch-chain floor", over,
                over is not None and over <= DECODE_OVER_LAUNCH_FLOOR)
            if quantised:
                add(case, f">= {FORMAT_SPEEDUP:g}x faster than the best unfused pipeline", speedup,
                    speedup is not None and speedup >= FORMAT_SPEEDUP)
        if quantised:
            row = next((r for r in doc["rows"] if r["case"] == case["name"] and r["impl"] == FUSED), {})
            ulps = row.get("quant_ulps")
            add(case, "quantised outputs read back through their scales within the format's rounding of the float64 "
                "reference (<= 0.5 spacing)", ulps, ulps is not None and ulps <= 0.5 + 1e-3)
    return targets


def _fmt(value, spec=".2f") -> str:
    return "—" if value is None else format(value, spec)


def render_markdown(doc: dict) -> str:
    env, ceiling = doc["environment"], doc.get("copy_ceiling")
    lines = ["# Fused pre-processing: benchmarks", "",
             "RoPE with its neighbours (QK-norm, paged KV-cache write, quantise on write: float8 e4m3/e5m2 and int8 "
             "caches at static or per-(token, head) scales, NVFP4 caches and a float8 q; MLA's latent cache) in one "
             "launch against the unfused pipeline built from the single-op pieces and torch.compile of the whole "
             "chain. Graph replay, medians of interleaved rounds, fresh random inputs, every implementation checked "
             "against the float64 reference before it is timed (a quantised output by its reader's round trip: the "
             "stored values times their scales, in units of the format's spacing at its scale). The byte floor counts "
             "each activation and cache tensor read once and written once, in its format, and the scales written (per "
             "(token, head), or NVFP4's per 16 channels), at the copy ceiling measured in the same run. The row \"copy "
             "of the floor's bytes\" is no implementation: a plain device copy that moves the floor, timed in the same "
             "rounds, so it shows what moving the floor costs on this clock, its start and end included. Neither is "
             "the row \"launch-chain floor\" of the decode cases: 64 programs that load a position, then the table row "
             "at it, and store the row, timed in the same rounds; a decode call is bound by that chain more than by "
             "its bytes. FlashInfer's fused op is not in the comparison: it was not installed on the benchmark "
             "machine.",
             "",
             *([f"Command: `{doc['command']}`  "] if doc.get("command") else []),
             f"Device: {env.get('gpu', env['device'])}, torch {env['torch']}, triton {env['triton']}  ",
             f"Copy ceiling: {_fmt(ceiling and ceiling['gbps'], '.0f')} GB/s" if ceiling else
             "Copy ceiling: not measured (dry run: checked, not timed)", "", "## Cases", ""]
    for case in doc["cases"]:
        rows = [r for r in doc["rows"] if r["case"] == case["name"]]
        timed = timed_rows(doc, case["name"])
        fused, chain = timed.get(FUSED), timed.get(LAUNCH_FLOOR)
        chain_text = (f" Launch-chain floor {_fmt(chain['graph_us'])} µs"
                      + (f"; {FUSED} at {fused['graph_us'] / chain['graph_us']:.2f}x it." if fused else ".")
                      if chain else "")
        dependent = timed.get(LAUNCH_FLOOR_DEPENDENT)
        if chain and dependent:
            chain_text += (f" The same chain launched programmatically, as ropekit's small grids are: "
                           f"{_fmt(dependent['graph_us'])} µs"
                           + (f"; {FUSED} at {fused['graph_us'] / dependent['graph_us']:.2f}x it." if fused else "."))
        which = "NVFP4's block scales" if case.get("kv_cache_dtype") == "nvfp4" else "per-(token, head) scales"
        scales = (f" Of the floor, {which} written: {case['scale_bytes'] / 1e3:.1f} kB."
                  if case.get("scale_bytes") else "")
        if case.get("static_scale_bytes"):
            scales += f" Static scales read, not counted: {case['static_scale_bytes']} B."
        lines += [f"### {case['title']}", "",
                  f"Byte floor {case['floor_bytes'] / 1e6:.2f} MB ({_fmt(case.get('floor_us'))} µs); per-token "
                  f"metadata not counted: {case['meta_bytes'] / 1e3:.1f} kB.{scales}{chain_text}", "",
                  "| implementation | graph µs | % of floor | time / fused | check |", "|---|---|---|---|---|"]
        for r in rows:
            us = r.get("graph_us")
            pct = 100 * case["floor_us"] / us if us and case.get("floor_us") else None
            rel = us / fused["graph_us"] if us and fused else None
            status = r["status"] if r["status"] != "ok" else (
                f"ok ({'%.2f ulp' % r['quant_ulps'] if r.get('quant_ulps') is not None else 'tol'})")
            lines.append(f"| {r['impl']} | {_fmt(us)} | {_fmt(pct, '.1f')} | {_fmt(rel)} | {status} |")
        lines.append("")
    lines += ["## Targets", "", "| case | target | value | met |", "|---|---|---|---|"]
    for t in doc.get("targets", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['case']} | {t['target']} | {_fmt(t['value'], '.3f')} | {met} |")
    return "\n".join(lines) + "\n"


def write_plot(doc: dict, path: Path) -> Path:
    """Time per case relative to the byte floor (1 = at the floor), one bar per implementation, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = list(dict.fromkeys(r["impl"] for r in doc["rows"]))
    cases = doc["cases"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        values = []
        for case in cases:
            row = timed_rows(doc, case["name"]).get(impl)
            values.append(row["graph_us"] / case["floor_us"] if row and case.get("floor_us") else 0)
        ax.bar([i + j * width for i in range(len(cases))], values, width, label=impl)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="byte floor")
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], [c["name"] for c in cases], rotation=20,
                  ha="right")
    ax.set_ylabel("time / byte floor (log)")
    ax.set_title("Fused pre-processing vs the unfused pipeline and torch.compile (graph replay, lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(doc: dict, out: Path) -> list[Path]:
    """benchmarks_fused.json, .md and .png in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "benchmarks_fused.json", out / "benchmarks_fused.md", out / "benchmarks_fused.png"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(render_markdown(doc))
    write_plot(doc, paths[2])
    return paths


def publish(doc: dict, out: Path) -> list[Path]:
    """Judge the targets into ``doc`` and write its three files (their paths printed)."""
    doc["targets"] = evaluate_targets(doc)
    paths = write_outputs(doc, out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.bench.fused_report",
                                     description="re-render the fused benchmark's page and figure from its JSON")
    parser.add_argument("json", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    publish(json.loads(args.json.read_text()), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
