"""``python -m ropekit bench``: measure on a GPU and write JSON, PNGs and the markdown page; or, on any machine,
list the cases, render a published JSON, or merge runs."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from .. import device as _device
from .cases import MAIN_CASES, SWEEP_BATCHES, SWEEP_SEQLENS, Case, all_cases, select_cases, sweep_cases
from .impls import Impl, make_impls
from .report import environment, load_document, make_document, merge_documents, write_json
from .runner import BenchRefused, Progress, Runner, derive_metrics, refusal_reason
from .timing import QUICK, GpuTimer, Settings

__all__ = ["main", "run", "resolve_cases", "resolve_impls", "QUICK_CASES", "JSON_NAME"]

JSON_NAME = "benchmarks.json"
MD_NAME = "benchmarks.md"
QUICK_CASES = ("llama3-8b-prefill", "small-prefill", "decode", "varlen")
QUICK_SWEEP = dict(seqlens=(256, 1024), batches=(1, 8))
_REPO = Path(__file__).resolve().parents[2]


def resolve_cases(cases) -> list[Case]:
    """Case objects from names (any case of ``all_cases()``) or Case objects."""
    known = {c.name: c for c in all_cases()}
    out = []
    for case in cases:
        if isinstance(case, Case):
            out.append(case)
        elif case in known:
            out.append(known[case])
        else:
            batches = ",".join(map(str, SWEEP_BATCHES))
            raise ValueError(f"unknown case {case!r}; main cases: {[c.name for c in MAIN_CASES]}, sweep: "
                             f"sweep-b{{{batches}}}-s{{{SWEEP_SEQLENS[0]}..{SWEEP_SEQLENS[-1]}}}")
    return out


def resolve_impls(impls=None, peers_dir=None, skip=()) -> list[Impl]:
    """Implementation objects from names (None: all), in table order, without those in ``skip``."""
    every = make_impls(peers_dir)
    by_name = {impl.name: impl for impl in every}
    names = [i.name if isinstance(i, Impl) else i for i in (impls if impls is not None else by_name)]
    unknown = [n for n in list(names) + list(skip) if n not in by_name]
    if unknown:
        raise ValueError(f"unknown implementation(s) {unknown}; known: {list(by_name)}")
    chosen = [impl for impl in every if impl.name in names and impl.name not in skip]
    return chosen


def run(cases, impls=None, *, settings: Settings | None = None, ceiling_gbps: float | None = None,
        peers_dir=None, progress: bool = True) -> list[dict]:
    """Measure ``cases`` x ``impls`` (names or objects; impls None: all) on the GPU and return the rows.

    The copy ceiling is measured first unless ``ceiling_gbps`` is given. Raises ``BenchRefused`` without a GPU.
    """
    reason = refusal_reason()
    if reason:
        raise BenchRefused(reason)
    settings = settings or Settings()
    timer = GpuTimer(settings)
    if ceiling_gbps is None:
        ceiling_gbps = timer.copy_ceiling()["gbps"]
    case_list = resolve_cases(cases)
    impl_list = resolve_impls(impls, peers_dir)
    directions = sum(2 if c.backward else 1 for c in case_list)
    runner = Runner(case_list, impl_list, settings=settings, timer=timer, device=_device.DEVICE,
                    progress=Progress(directions * len(impl_list), enabled=progress), ceiling_gbps=ceiling_gbps)
    runner.run()
    return derive_metrics(runner.rows, ceiling_gbps, runner.launch_floors)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ropekit bench",
        description="Time every RoPE implementation against the device's copy ceiling; write JSON, PNGs and "
                    "benchmarks.md. Without a GPU it refuses to time (exit code 2); --list, --render and --merge "
                    "work anywhere.",
        epilog="example: python -m ropekit bench --cases llama3-8b-prefill,decode --peers .peers --out /tmp/bench")
    p.add_argument("--groups", default="main", help="case groups: main, sweep or all (comma-separated; default main)")
    p.add_argument("--cases", help="only these cases (comma-separated names; 'sweep-b1-*' style prefixes allowed)")
    p.add_argument("--impls", help="only these implementations (comma-separated)")
    p.add_argument("--skip", default="", help="leave these implementations out (comma-separated)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {', '.join(QUICK_CASES)} and a 2x2 sweep, short timings (default out: "
                        "bench-quick)")
    p.add_argument("--out", help="output directory (default bench-results, bench-quick with --quick; with "
                                 "--render: the JSON's directory)")
    p.add_argument("--peers", help="directory tools/fetch_peers.sh filled (default .peers)")
    p.add_argument("--template", help="markdown template (default docs/benchmarks.md of this checkout)")
    p.add_argument("--warmup", type=float, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=float, help="do_bench repetition time, ms")
    p.add_argument("--time-budget", type=float,
                   help="stop starting new measurements after this many seconds; what ran is still written "
                        "(default 540, quick 300; 0: no limit)")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    p.add_argument("--list", action="store_true", help="list cases and implementations, then exit")
    p.add_argument("--render", metavar="JSON", help="write the PNGs and the markdown page from an existing JSON")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge runs into <out>/benchmarks.json, then render")
    p.add_argument("--side-by-side", nargs="+", metavar="JSON",
                   help="runs on different GPUs (one JSON each, in column order) for the page's GPUs-side-by-side "
                        "block; alone it fills only that block of <out>/benchmarks.md, with --render or --merge "
                        "the whole page")
    return p


def _split(text) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _template(args) -> Path | None:
    if args.template:
        return Path(args.template)
    default = _REPO / "docs" / MD_NAME
    return default if default.is_file() else None


def _page_template(out_dir: Path, template: Path | None) -> Path | None:
    """The template for <out_dir>/benchmarks.md: None when it is that page itself (filled where it stands)."""
    same = template is not None and template.resolve() == (out_dir / MD_NAME).resolve()
    return None if same else template


def _render(doc_path: Path, out_dir: Path, template: Path | None, plots: bool = True, side_by_side=None) -> None:
    from .markdown import write_markdown
    from .plots import write_plots

    doc = load_document(doc_path)
    if plots:
        for path in write_plots(doc, out_dir):
            print(f"wrote {path}")
    md_path = out_dir / MD_NAME
    write_markdown(doc_path, md_path, template=_page_template(out_dir, template), side_by_side=side_by_side)
    print(f"wrote {md_path}")


def _list(args) -> int:
    print("cases (group main):")
    for case in MAIN_CASES:
        print(f"  {case.name:24s} {case.title}  [{case.moved_bytes(bool(case.inplace)) / 1e6:.1f} MB moved]")
    print(f"cases (group sweep): sweep-b<B>-s<S>, B in {SWEEP_BATCHES}, S in {SWEEP_SEQLENS[0]}..{SWEEP_SEQLENS[-1]} "
          f"step 128 ({len(sweep_cases())} cases)")
    print("implementations:")
    for impl in make_impls(args.peers):
        note = impl.available() if impl.name != "ropekit-cuda" else "(probed when a run starts: it builds)"
        print(f"  {impl.name:17s} {impl.kind:8s} {impl.label}" + (f"  -- {note}" if note else ""))
    return 0


def _summary(doc) -> str:
    from .markdown import targets

    lines = [f"copy ceiling: {doc['copy_ceiling']['gbps']:.0f} GB/s  ({doc['environment'].get('gpu')})"]
    for name, floor in doc.get("launch_floors", {}).items():
        lines.append(f"launch-chain floor ({name}): " + (f"{floor['graph_us']:.2f} µs (graph)" if floor.get("graph_us")
                                                        else f"not measured: {floor.get('error', 'no graph')}"))
    for case in doc["cases"]:
        if case["group"] != "main":
            continue
        for direction in ("forward", "backward"):
            rows = [r for r in doc["rows"] if r["case"] == case["name"] and r["direction"] == direction
                    and r["status"] == "ok"]
            for residency in ("l2", "dram"):
                chosen = [r for r in rows if r["residency"] == residency]
                if not chosen:
                    continue
                cells = " ".join(f"{r['impl']}={r['time_us']:.1f}"
                                 + (f"({r['vs_launch_floor']:.2f}x floor)" if r.get("vs_launch_floor") else "")
                                 for r in sorted(chosen, key=lambda r: r["time_us"]))
                lines.append(f"{case['name']:22s} {direction[:3]} {residency:4s} µs ({chosen[0]['time_source']}): "
                             f"{cells}")
    failures = [r for r in doc["rows"] if r["status"] == "error"]
    for row in failures:
        lines.append(f"ERROR {row['case']} {row['impl']} {row['direction']}: {row['reason']}")
    lines.append("targets:")
    for check in targets(doc):
        value = "not measured" if check["value"] is None else f"{check['value']:.3f}{check['unit']}"
        verdict = {True: "met", False: "NOT MET", None: "-"}[check["met"]]
        lines.append(f"  {verdict:7s} {check['case']:18s} {check['target']}: {value} ({check['impl']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()  # the time budget covers start-up, the ceiling and the probes too
    args = _parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.list:
        return _list(args)
    if args.render:
        doc_path = Path(args.render)
        _render(doc_path, Path(args.out) if args.out else doc_path.parent, _template(args), not args.no_plots,
                args.side_by_side)
        return 0
    if args.merge:
        out_dir = Path(args.out or "bench-results")
        doc_path = write_json(merge_documents([load_document(p) for p in args.merge]), out_dir / JSON_NAME)
        print(f"wrote {doc_path}")
        _render(doc_path, out_dir, _template(args), not args.no_plots, args.side_by_side)
        return 0
    if args.side_by_side:
        from .markdown import write_side_by_side

        out_dir = Path(args.out) if args.out else _REPO / "docs"
        # the page's other blocks stay as they are: filled where it stands, from the template when it is not there
        in_place = (out_dir / MD_NAME).is_file() and not args.template
        write_side_by_side(args.side_by_side, out_dir / MD_NAME,
                           template=None if in_place else _page_template(out_dir, _template(args)))
        print(f"wrote {out_dir / MD_NAME} (the GPUs side by side)")
        return 0

    reason = refusal_reason()
    if reason:
        print(f"ropekit bench: refusing to time. {reason}", file=sys.stderr)
        return 2

    if os.environ.get("ROPEKIT_CHECK", "") not in ("", "0"):
        # check mode syncs the host on every call (CUDA graphs forbid that) and is not what users time
        print("ropekit bench: ignoring ROPEKIT_CHECK for this run (its host syncs are not part of a call)",
              file=sys.stderr)
        os.environ["ROPEKIT_CHECK"] = "0"
    settings = QUICK if args.quick else Settings()
    overrides = {k: v for k, v in (("warmup_ms", args.warmup), ("rep_ms", args.rep),
                                   ("time_budget_s", args.time_budget)) if v is not None}
    if overrides:
        from dataclasses import replace
        settings = replace(settings, **overrides)
    groups = ("main", "sweep") if "all" in _split(args.groups) else tuple(_split(args.groups))
    if args.cases:
        cases = select_cases(groups, _split(args.cases))
    elif args.quick:
        cases = resolve_cases(QUICK_CASES) + list(sweep_cases(**QUICK_SWEEP))
    else:
        cases = select_cases(groups)
    impls = resolve_impls(_split(args.impls) or None, args.peers, skip=_split(args.skip))
    out_dir = Path(args.out or ("bench-quick" if args.quick else "bench-results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    doc_path = out_dir / JSON_NAME
    command = "python -m ropekit bench" + (" " + shlex.join(argv) if argv else "")

    timer = GpuTimer(settings)
    directions = sum(2 if c.backward else 1 for c in cases)
    progress = Progress(directions * len(impls))
    env = environment()
    progress.note(f"{env.get('gpu')} | torch {env['torch']} | triton {env['triton']} | {len(cases)} cases x "
                  f"{len(impls)} implementations -> {out_dir}")
    ceiling = timer.copy_ceiling()
    progress.note(f"copy ceiling {ceiling['gbps']:.0f} GB/s ({ceiling['method']})")
    runner = Runner(cases, impls, settings=settings, timer=timer, device=_device.DEVICE, progress=progress,
                    started_at=started, ceiling_gbps=ceiling["gbps"])

    def document(complete: bool, aborted=None, ceiling_end=None) -> dict:
        duration = round(time.perf_counter() - started, 1)
        rows = derive_metrics([dict(r) for r in runner.rows], ceiling["gbps"], runner.launch_floors)
        impl_info = [{"name": i.name, "label": i.label, "kind": i.kind,
                      "unavailable": runner.unavailable.get(i.name), "info": _safe_info(i)} for i in impls]
        return make_document(command=command, settings=settings.to_json(), environment=env, copy_ceiling=ceiling,
                             copy_ceiling_end=ceiling_end, l2_bytes=runner.l2_bytes, cases=cases, impls=impl_info,
                             rows=rows, complete=complete, aborted=aborted, duration_s=duration,
                             copy_floors=runner.copy_floors, launch_floors=runner.launch_floors)

    runner.on_case_done = lambda rows: write_json(document(False), doc_path)
    try:  # a SIGTERM (e.g. from `timeout`) ends the run like Ctrl-C: what was measured is still written
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread
        previous = None
    interrupted = None
    try:
        runner.probe()
        runner.run()
    except KeyboardInterrupt:
        interrupted = "interrupted (SIGINT/SIGTERM); the rows measured so far are kept"
    except Exception as error:  # noqa: BLE001  (a harness bug must not lose the rows already measured)
        traceback.print_exc()
        interrupted = f"harness error: {type(error).__name__}: {error}"
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    aborted = runner.aborted or interrupted
    ceiling_end = None if aborted else timer.copy_ceiling()
    budget_hit = any(row["status"] == "not run" for row in runner.rows)
    doc = document(complete=not aborted and not budget_hit, aborted=aborted, ceiling_end=ceiling_end)
    write_json(doc, doc_path)
    progress.note(f"done in {time.perf_counter() - started:.0f} s; wrote {doc_path}")
    try:
        _render(doc_path, out_dir, _template(args), not args.no_plots)
    except Exception as error:  # noqa: BLE001  (the JSON is the result; a plotting failure must not lose it)
        print(f"ropekit bench: rendering failed ({type(error).__name__}: {error}); the JSON is complete",
              file=sys.stderr)
    print(_summary(doc))
    return 1 if aborted else 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _safe_info(impl: Impl) -> dict:
    try:
        return impl.info()
    except Exception as error:  # noqa: BLE001
        return {"error": str(error)}
