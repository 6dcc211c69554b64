"""A/B: this tree's ``ropekit.apply_rope`` against an earlier commit's, in one process and one harness run.

"Is this change slower?" is answered by a ratio measured in one run (the run-to-run spread of a single number is
about 1%, the size of the effects that matter). Both versions are driven only through their public API
(``apply_rope``), so the earlier commit may have any internal layout.

Here (a machine with git), export the earlier commit as a second package, ``ropekit_base``, into the ignored ``.ab/``
folder, then check both on the CPU; carry ``.ab`` (and ``.peers``) to the GPU and measure there:

    python tools/ab_versions.py --export 4d3b442        # writes .ab/ropekit_base and .ab/REF
    python tools/ab_versions.py --check                 # CPU: both versions agree bit for bit on every case, tiny
    python tools/ab_versions.py --out $OUT/ab           # GPU: the nine published cases, interleaved graph rounds

On the GPU every published benchmark case (``ropekit.bench.MAIN_CASES``) runs with both versions' ``ropekit``,
``ropekit-inplace`` and ``ropekit-rows`` calls (``base-`` prefixes the earlier version's) and Liger-Kernel when
``.peers`` has it; the harness (``ropekit.bench``) captures every graph of a case first and replays them in
interleaved rounds, so a drift of the GPU's clocks reaches both versions alike. Writes ``ab.json`` (rows, ratios
new / base, the verdict) and ``ab.md`` (the same as a table) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # "this tree" is the checkout this file sits in, whatever ropekit pip installed
AB_DIR = ROOT / ".ab"
BASE_PACKAGE = "ropekit_base"
CALLS = ("ropekit", "ropekit-inplace", "ropekit-rows")  # the public calls timed from both versions
CLOCKS = ("graph_us", "do_bench_us", "eager_us")
TOLERANCE = 1.01  # the floor: no published case more than 1% slower on the graph clock


# --- the earlier version as a second package -------------------------------------------------------------------------

def export(ref: str) -> None:
    """``git archive`` of ``ref``'s ropekit/ into .ab/ropekit_base, as :func:`as_package` makes it."""
    AB_DIR.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "ropekit"], check=True,
                             capture_output=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "base.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp)
        as_package(Path(tmp) / "ropekit", AB_DIR / BASE_PACKAGE)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    (AB_DIR / "REF").write_text(f"{ref} {commit}\n")
    print(f"exported {ref} ({commit[:10]}) to {AB_DIR / BASE_PACKAGE}")


def as_package(source: Path, target: Path) -> None:
    """A copy of the package folder ``source`` as the package ``target.name`` (replacing ``target``), its
    torch.library namespace renamed to that name, so that both versions register their custom ops in one process
    (op names are global: "ropekit::rope" can be registered once). The core and the benchmarks import
    relatively, so each version runs its own code."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        if '"ropekit::' in text:
            path.write_text(text.replace('"ropekit::', f'"{target.name}::'))


def base_ref() -> str:
    return (AB_DIR / "REF").read_text().split()[0]


def versions():
    """{"": this tree's apply_rope, "base-": the exported commit's}."""
    import ropekit

    if not (AB_DIR / BASE_PACKAGE).is_dir():
        raise SystemExit(f"no {AB_DIR / BASE_PACKAGE}: run `python tools/ab_versions.py --export REF` first")
    sys.path.insert(0, str(AB_DIR))
    import ropekit_base

    return {"": ropekit.apply_rope, "base-": ropekit_base.apply_rope}


# --- one public call of one version, as a harness implementation ---------------------------------------------------

def api_impl(prefix: str, call: str, apply_rope):
    """The harness implementation ``prefix + call`` of one version's ``apply_rope``:

    * ``ropekit``: out of place with the half-width table and the case's positions (backward: autograd through it);
    * ``ropekit-inplace``: the same call with ``inplace=True``;
    * ``ropekit-rows``: in place with per-token cos/sin rows in q's dtype (the inputs Liger gets).
    """
    from ropekit.bench.impls import Impl, Prepared

    class ApiCall(Impl):
        name = prefix + call
        label = f"apply_rope ({call}) at {base_ref() if prefix else 'this tree'}"
        kind = "ropekit"
        directions = ("forward", "backward") if call == "ropekit" else ("forward",)

        def _supports(self, case, direction):
            inplace = call != "ropekit"
            if case.inplace is not None and case.inplace != inplace:
                return "in place only" if inplace else "out of place only"
            return None

        def build(self, case, tables, data, direction):
            common = dict(layout=case.layout, interleaved=case.interleaved, cu_seqlens=tables.cu_seqlens,
                          max_seqlen=tables.max_seqlen)
            if call == "ropekit-rows":
                fn = functools.partial(apply_rope, data.q, data.k, tables.cos_rows, tables.sin_rows, per_token=True,
                                       inplace=True, **common)
                return Prepared(fn, lambda r: (r[0], r[1]), inplace=True)
            kwargs = dict(common, positions=tables.offsets, rotary_dim=case.rotary)
            cos, sin = tables.cos_half, tables.sin_half
            if direction == "backward":
                return autograd_backward(lambda q, k: apply_rope(q, k, cos, sin, **kwargs), data)
            inplace = call == "ropekit-inplace"
            fn = functools.partial(apply_rope, data.q, data.k, cos, sin, inplace=inplace, **kwargs)
            return Prepared(fn, lambda r: (r[0], r[1]), inplace=inplace)

    return ApiCall()


def autograd_backward(forward, data):
    """``torch.autograd.grad`` through a graph recorded once (retained: every timed call replays the backward)."""
    import torch

    from ropekit.bench.impls import Prepared

    q_leaf, k_leaf = data.q.detach().requires_grad_(True), data.k.detach().requires_grad_(True)
    with torch.enable_grad():
        out_q, out_k = forward(q_leaf, k_leaf)
    fn = functools.partial(torch.autograd.grad, (out_q, out_k), (q_leaf, k_leaf), (data.grad_q, data.grad_k),
                           retain_graph=True)
    return Prepared(fn, lambda r: (r[0], r[1]))


def implementations(peers_dir):
    """Each call beside its base version, then Liger (when the peers folder has it) as the yardstick of both."""
    from ropekit.bench.impls import make_impls

    impls = []
    found = versions()
    for call in CALLS:
        impls += [api_impl(prefix, call, found[prefix]) for prefix in ("", "base-")]
    impls += [impl for impl in make_impls(peers_dir) if impl.name == "liger"]
    return impls


# --- the CPU check, the GPU run and its report ----------------------------------------------------------------------

def tiny(case):
    """The case at a size the interpreter runs in a moment (its layout, dtype, pairing, positions kept)."""
    fields = dict(batch=2, seqlen=8, heads_q=4, heads_k=2, head_dim=16)
    if case.rotary_dim is not None:
        fields["rotary_dim"] = 8
    if case.layout == "thd":
        fields.update(seq_lens=(3, 8), seqlen=8)
    return dataclasses.replace(case, **fields)


def check() -> list[str]:
    """CPU: on every published case, at a tiny size, both versions' calls give bit-identical outputs (forward and,
    where the case has one, backward). Returns what differs (nothing when both agree)."""
    import torch

    from ropekit import device
    from ropekit.bench import MAIN_CASES
    from ropekit.bench.inputs import make_data, make_tables

    impls = {impl.name: impl for impl in implementations(None) if impl.name != "liger"}
    problems = []
    for case in map(tiny, MAIN_CASES):
        tables = make_tables(case, device.DEVICE)
        for direction in ("forward", "backward") if case.backward else ("forward",):
            for call in CALLS:
                new, old = impls[call], impls[f"base-{call}"]
                if new.supports(case, direction) is not None:
                    continue
                outputs = []
                for impl in (new, old):
                    data = make_data(case, device.DEVICE, 7, backward=direction == "backward")
                    prepared = impl.build(case, tables, data, direction)
                    outputs.append([t.detach().clone() for t in prepared.outputs(prepared.fn())])
                same = all(torch.equal(a, b) for a, b in zip(*outputs))
                print(f"{case.name:24s} {direction:8s} {call:16s} {'same' if same else 'DIFFERENT'}")
                if not same:
                    problems.append(f"{case.name} {direction} {call}")
    return problems


def measure(cases, rounds: int, graph_ms: float, time_budget: float, peers_dir, out: Path, dry_run: bool) -> dict:
    """Both versions (and Liger) in one harness run; ``dry_run``: every call once, no clock (a CPU check of the
    path, which measures nothing)."""
    from ropekit import device
    from ropekit.bench.report import environment
    from ropekit.bench.runner import Progress, Runner, derive_metrics, refusal_reason
    from ropekit.bench.timing import DryRunTimer, GpuTimer, Settings

    if not dry_run and refusal_reason():
        raise SystemExit(refusal_reason())
    impls = implementations(peers_dir)
    settings = Settings(graph_rounds=rounds, graph_ms=graph_ms, time_budget_s=time_budget)
    timer = DryRunTimer() if dry_run else GpuTimer(settings)
    ceiling = timer.copy_ceiling()
    directions = sum(2 if c.backward else 1 for c in cases)
    start = time.time()
    runner = Runner(cases, impls, settings=settings, timer=timer, device=device.DEVICE,
                    progress=Progress(directions * len(impls)), ceiling_gbps=ceiling["gbps"])
    rows = derive_metrics(runner.run(), ceiling["gbps"])
    ratios = compare(rows)
    slower = [r for r in ratios if r["clock"] == "graph_us" and r["new_over_base"] > TOLERANCE]
    errors = [f"{r['case']} {r['direction']} {r['impl']}: {r['reason']}" for r in rows if r["status"] == "error"]
    doc = {"base": (AB_DIR / "REF").read_text().strip(), "head": _head_commit(), "sources": sources_digest(), "dry_run": dry_run,
           "environment": environment(), "ceiling": ceiling, "settings": settings.to_json(), "argv": sys.argv,
           "seconds": round(time.time() - start, 1), "rows": rows, "ratios": ratios, "errors": errors,
           "verdict": {"tolerance": TOLERANCE, "slower": slower, "pass": not slower and not errors}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "ab.md").write_text(markdown(doc))
    print(markdown(doc))
    print(f"wrote {out / 'ab.json'} and {out / 'ab.md'}")
    return doc


def sources_digest() -> str:
    """sha256 of this tree's ``ropekit/**/*.py`` (paths and contents): names the code measured even where the
    checkout's git HEAD is not the tree measured (a copied working tree)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "ropekit").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _head_commit() -> str | None:
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or None


def compare(rows: list[dict]) -> list[dict]:
    """new / base for every (case, direction, residency, call, clock) both versions measured."""
    by_key = {(r["case"], r["direction"], r.get("residency"), r["impl"]): r for r in rows if r["status"] == "ok"}
    liger = {key[:3]: row.get("graph_us") for key, row in by_key.items() if key[3] == "liger"}
    ratios = []
    for (case, direction, residency, impl), row in by_key.items():
        old = by_key.get((case, direction, residency, f"base-{impl}"))
        if old is None:
            continue
        for clock in CLOCKS:
            if row.get(clock) and old.get(clock):
                peer = liger.get((case, direction, residency)) if clock == "graph_us" else None
                ratios.append(dict(case=case, direction=direction, residency=residency, impl=impl, clock=clock,
                                   base_us=old[clock], new_us=row[clock], new_over_base=row[clock] / old[clock],
                                   new_over_liger=row[clock] / peer if peer else None))
    return ratios


def markdown(doc: dict) -> str:
    verdict = doc["verdict"]
    lines = [f"# A/B: this tree ({doc['head']}) against {doc['base']}", ""]
    if doc["dry_run"]:
        lines += ["**Dry run: every call ran once, nothing was timed; the numbers below are placeholders.**", ""]
    lines += [f"GPU: {doc['environment'].get('gpu', 'none')}; copy ceiling {doc['ceiling']['method']}; "
              f"{doc['settings']['graph_rounds']} interleaved graph rounds; {doc['seconds']} s.", "",
              f"Verdict (graph clock, every published case, new / base <= {verdict['tolerance']}): "
              f"**{'pass' if verdict['pass'] else 'FAIL'}**"
              + "".join(f"\n- slower: {r['case']} {r['direction']} {r['residency']} {r['impl']} "
                        f"{r['new_over_base']:.3f}" for r in verdict["slower"])
              + "".join(f"\n- error: {e}" for e in doc["errors"]), "",
              "| case | direction | residency | call | clock | base µs | new µs | new / base | new / Liger |",
              "|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in doc["ratios"]:
        liger = f"{r['new_over_liger']:.3f}" if r["new_over_liger"] else ""
        lines.append(f"| {r['case']} | {r['direction']} | {r['residency']} | {r['impl']} | {r['clock']} | "
                     f"{r['base_us']:.2f} | {r['new_us']:.2f} | {r['new_over_base']:.3f} | {liger} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", metavar="REF", help="export REF's ropekit/ to .ab/ropekit_base (needs git)")
    parser.add_argument("--check", action="store_true", help="CPU: both versions agree on every case, tiny")
    parser.add_argument("--dry-run", action="store_true", help="the GPU run's path with no clock (CPU, tiny cases)")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: every published case)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved graph-replay rounds")
    parser.add_argument("--graph-ms", type=float, default=60.0, help="replay time per graph, over all rounds")
    parser.add_argument("--time-budget", type=float, default=480.0, help="seconds; later measurements are skipped")
    parser.add_argument("--peers", default=str(ROOT / ".peers") if (ROOT / ".peers").is_dir() else None)
    parser.add_argument("--out", default=os.environ.get("OUT", "ab"))
    args = parser.parse_args(argv)
    if args.export:
        export(args.export)
        return 0
    if args.check:
        problems = check()
        print("both versions agree" if not problems else f"versions differ: {problems}")
        return 1 if problems else 0
    from ropekit.bench import MAIN_CASES
    from ropekit.bench.cli import resolve_cases

    cases = resolve_cases(args.cases.split(",")) if args.cases else list(MAIN_CASES)
    if args.dry_run:
        cases = [tiny(case) for case in cases]
    doc = measure(cases, args.rounds, args.graph_ms, args.time_budget, args.peers, Path(args.out), args.dry_run)
    return 0 if doc["verdict"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
