"""A/B of the fused ops: this tree against exported versions, on the fused benchmark's graph clock or the eager
benchmark's host clock, every version in one process and one run.

The versions are packages in ``.ab/``: ``ropekit_base`` from ``tools/ab_versions.py --export REF``, and any other
package named with ``--also`` (a variant: a copy of ``ropekit/`` with a change, its ``"ropekit::`` op namespace
renamed to the package's name, as the export does). Each version is driven through its own public benchmark
entries: ``ropekit.bench.fused.impls()["ropekit-fused"]`` on the current tree's cases and inputs, and
``ropekit.bench.eager.OPS`` on its own eager cases.

    python tools/ab_versions.py --export 5d00068          # .ab/ropekit_base
    python tools/ab_fused.py --dry-run --out /tmp/ab      # anywhere: tiny cases, every call checked, no clock
    python tools/ab_fused.py --out $OUT/fused-ab          # GPU: the fused forward cases, graph replay
    python tools/ab_fused.py --eager --out $OUT/eager-ab  # GPU: the eager ops, back-to-back calls

Graph clock: every version's call is captured twice (rows ``base``, ``base#2``, ``new``, ``new#2``, ...) beside the
copy of the byte floor and, for decode cases, the launch-chain floor; the harness replays all of them in interleaved
rounds. A version's ratio is the sum of its two medians over the base's two; the two rows of one version show the
clock's spread. Eager clock: each run times ``--calls`` back-to-back calls of every op of every version, one op's
versions next to each other, the order reversed every other run; the ratio is the median over runs of each run's
ratio (``ropekit.bench.eager.ratio``).

Writes ``ab.json`` (every row, the ratios) and ``ab.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # "this tree" is the checkout this file sits in, whatever ropekit pip installed
BASE = "base"
NEW = "new"


def versions(ab_dir: Path, also: list[str]) -> dict:
    """label -> package: ``base`` (.ab/ropekit_base), ``new`` (this tree's ropekit), then each of ``also``."""
    if not (ab_dir / "ropekit_base").is_dir():
        raise SystemExit(f"no {ab_dir / 'ropekit_base'}: run `python tools/ab_versions.py --export REF` first")
    sys.path.insert(0, str(ab_dir))
    found = {BASE: importlib.import_module("ropekit_base"), NEW: importlib.import_module("ropekit")}
    for name in also:
        found[name] = importlib.import_module(name)
    return found


# --- the fused forward on the graph clock ----------------------------------------------------------------------------

def fused(found: dict, case_names, dry_run: bool, rounds: int, budget_s: float, log=print) -> dict:
    """Each case's rows from the current tree's harness (``run_case``), every version's fused call twice."""
    import torch

    from ropekit.bench import fused as bench
    from ropekit.bench.fused_cases import CASES, tiny
    from ropekit.bench.timing import GpuTimer, Settings

    cases = [c for c in CASES if (c.name in case_names if case_names else c.kind != "backward")]
    unknown = set(case_names or ()) - {c.name for c in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = None if dry_run else GpuTimer(Settings(graph_ms=20.0, graph_rounds=rounds))
    if dry_run:
        cases = [tiny(c) for c in cases]
    builders = {}
    for label, package in found.items():
        build = importlib.import_module(package.__name__ + ".bench.fused").impls()["ropekit-fused"]
        builders.update({label: build, f"{label}#2": build})
    # the fused benchmark's own run: the copy ceiling, then each case (its floors beside it), "not run" rows past
    # the budget
    doc = bench.run(cases, builders, timer, device, log=lambda *_: None, budget_s=budget_s)
    ratios = []
    for case in cases:
        case_rows = [r for r in doc["rows"] if r["case"] == case.name]
        timed = {r["impl"]: r["graph_us"] for r in case_rows if r["graph_us"]}
        failed = [f"{r['impl']}: {r['status']}" for r in case_rows if r["status"] not in ("ok", "reference")]
        line = f"{case.name:34s}" + "".join(f" {r['impl']} {r['status']}" for r in case_rows if r["impl"] in found)
        pairs = {label: (timed[label], timed[f"{label}#2"]) for label in found
                 if label in timed and f"{label}#2" in timed}
        if timer is not None and BASE in pairs:  # every version timed twice beside the base's two
            chain = timed.get(bench.LAUNCH_FLOOR)
            for label, us in pairs.items():
                ratios.append(dict(case=case.name, version=label, us=us, over_base=sum(us) / sum(pairs[BASE]),
                                   over_chain=sum(us) / 2 / chain if chain else None))
            line = f"{case.name:34s} copy {timed[bench.COPY_REFERENCE]:8.2f}" + "".join(
                f"  {r['version']} {r['us'][0]:.2f} {r['us'][1]:.2f} ({r['over_base']:.4f}"
                + (f", {r['over_chain']:.3f}x chain" if r["over_chain"] else "") + ")"
                for r in ratios if r["case"] == case.name)
        log(line + (f"  FAILED {failed}" if failed else ""))
    ceiling = doc["copy_ceiling"]["gbps"] if doc["copy_ceiling"] else None
    return dict(clock="graph_us", device=device, ceiling_gbps=ceiling, rows=doc["rows"], ratios=ratios)


# --- the eager ops on the host clock ---------------------------------------------------------------------------------

def eager(found: dict, op_names, dry_run: bool, repeats: int, calls: int, peers_dir, log=print) -> dict:
    """Each version's eager ops (their own checked calls), runs interleaved across versions and ops."""
    import torch

    from ropekit.bench.eager import ratio, time_interleaved

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dry_run:
        repeats, calls, warmup = min(repeats, 2), min(calls, 2), 1
    else:
        warmup = 50
    modules = {label: importlib.import_module(package.__name__ + ".bench.eager") for label, package in found.items()}
    rows, ratios = [], []
    for case in modules[NEW].CASES:
        timed = {}
        with torch.no_grad():
            for label, module in modules.items():
                version_case = next((c for c in module.CASES if c.name == case.name), None)
                if version_case is None:  # a version without this case
                    rows.append(dict(case=case.name, op=None, version=label, status="skipped", runs_us=[],
                                     reason="no such case in this version"))
                    continue
                version_case = module.tiny(version_case) if dry_run else version_case
                for op in module.OPS:
                    if (op_names and op.name not in op_names) or (op.kind == "peer" and label != NEW):
                        continue  # a peer is timed once, beside this tree's ops
                    row = dict(case=case.name, op=op.name, version=label, status="ok", runs_us=[])
                    rows.append(row)
                    try:
                        prepared = op.make(peers_dir)(version_case, device)
                    except module.Skip as reason:  # a peer not installed
                        row.update(status="skipped", reason=str(reason)[:200])
                        continue
                    except Exception as error:  # noqa: BLE001  (one call's failure must not end the run)
                        row.update(status="error", reason=f"{type(error).__name__}: {error}"[:200])
                        continue
                    if prepared.message:
                        row.update(status="wrong result", reason=prepared.message[:200])
                        continue
                    timed[(op.name, label)] = (row, prepared.fn)
        # one op's versions side by side, in the versions' order: each run times them next to each other, first one
        # way then (time_interleaved) the other, so the host's speed at that moment is the same for the pair
        ops = list(dict.fromkeys(op for op, _ in timed))
        timed = dict(sorted(timed.items(), key=lambda item: (ops.index(item[0][0]), list(found).index(item[0][1]))))
        time_interleaved(list(timed.values()), device, calls=calls, repeats=repeats, warmup=warmup)
        for (op, label), (row, _) in timed.items():
            base = timed.get((op, BASE))
            if base is not None and not dry_run:
                ratios.append(dict(case=case.name, op=op, version=label, us=row["us"],
                                   over_base=ratio(row, base[0])))
        over = {(r["op"], r["version"]): r["over_base"] for r in ratios if r["case"] == case.name}
        for (op, label), (row, _) in timed.items():
            log(f"{case.name:14s} {op:44s} {label:10s} {row['us']:8.2f} µs"
                + (f"  ÷ base {over[(op, label)]:.4f}" if (op, label) in over else ""))
    return dict(clock="eager_us", device=device, rows=rows, ratios=ratios)


def markdown(doc: dict) -> str:
    lines = [f"# Fused A/B ({doc['clock']}): {', '.join(doc['versions'])} on {doc['gpu']}", ""]
    if doc["dry_run"]:
        lines += ["**Dry run: every version's call ran at tiny sizes and was checked; its numbers measure nothing.**",
                  ""]
    failed = [r for r in doc["rows"] if r["status"] not in ("ok", "reference")]
    lines += [f"- {r['case']} {r.get('op', '')} {r.get('impl', r.get('version'))}: {r['status']} "
              f"{r.get('reason', '')}" for r in failed]
    if doc["ratios"]:
        what = "op" if doc["clock"] == "eager_us" else "case"
        lines += ["", f"| {what} | version | µs | ÷ base | ÷ launch-chain floor |", "|---|---|---|---:|---:|"]
        for r in doc["ratios"]:
            us = ", ".join(f"{t:.2f}" for t in (r["us"] if isinstance(r["us"], tuple) else (r["us"],)))
            label = f"{r['case']} {r['op']}" if what == "op" else r["case"]
            chain = f"{r['over_chain']:.3f}" if r.get("over_chain") else ""
            lines.append(f"| {label} | {r['version']} | {us} | "
                         f"{r['over_base']:.4f} | {chain} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eager", action="store_true", help="the eager ops' host clock (default: graph replay)")
    parser.add_argument("--dry-run", action="store_true", help="tiny cases, every call checked, no clock (any machine)")
    parser.add_argument("--cases", nargs="*", default=None, help="fused case names (default: every forward case)")
    parser.add_argument("--ops", nargs="*", default=None, help="eager op names (default: every op)")
    parser.add_argument("--also", default="", help="more packages in the .ab folder, comma-separated")
    parser.add_argument("--ab-dir", type=Path, default=ROOT / ".ab", help="where the exported versions are")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved graph-replay rounds")
    parser.add_argument("--repeats", type=int, default=9, help="eager runs of every call")
    parser.add_argument("--calls", type=int, default=1000, help="back-to-back calls an eager run")
    parser.add_argument("--time-budget", type=float, default=300.0, help="seconds after which no fused case starts")
    parser.add_argument("--peers", default=str(ROOT / ".peers") if (ROOT / ".peers").is_dir() else None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    found = versions(args.ab_dir, [name for name in args.also.split(",") if name])
    with contextlib.ExitStack() as kernels:
        if args.dry_run:  # every version's Triton kernels (on a CPU interpreted, not the native path)
            for package in found.values():
                kernels.enter_context(importlib.import_module(package.__name__ + ".device").set_backend("triton"))
        if args.eager:
            doc = eager(found, args.ops, args.dry_run, args.repeats, args.calls, args.peers)
        else:
            doc = fused(found, args.cases, args.dry_run, args.rounds, args.time_budget)
    import torch

    doc.update(versions=list(found), dry_run=args.dry_run, argv=sys.argv if argv is None else argv,
               gpu=torch.cuda.get_device_name() if doc["device"] == "cuda" else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab.json").write_text(json.dumps(doc, indent=1, default=str))
    (args.out / "ab.md").write_text(markdown(doc))
    # (a row of no version, a floor's or the copy's, is context: its failure does not fail the A/B)
    failed = [r for r in doc["rows"] if r["status"] not in ("ok", "reference", "skipped", "not run")
              and r.get("version", r.get("impl", "").split("#")[0]) in found]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
