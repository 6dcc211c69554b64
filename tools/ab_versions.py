"""A/B: this tree's ropekit against an earlier commit's, in one process, one harness run (the GPU question "did this
change make the kernel faster?" answered without comparing numbers across runs, whose spread is ~1%).

Here (a machine with git), export the earlier version as a second package, ``ropekit_base``, into the ignored
``.ab/`` folder; carry ``.ab`` to the GPU and measure there:

    python tools/ab_versions.py --export bf977b1                 # writes .ab/ropekit_base (and .ab/REF)
    python tools/ab_versions.py --check                          # CPU: both versions build and agree on a tiny case
    python tools/ab_versions.py --cases small-prefill,decode --rounds 9 --out $OUT/ab      # on the GPU

The harness (``ropekit.bench``) runs every case with both versions' implementations (``base-`` prefixes the old
ones) and Liger-Kernel, graphs captured first and replayed in interleaved rounds, so a drift of the GPU's clocks
reaches both versions alike. Writes ``ab.json`` (the harness's rows and the ratios new / base) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
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
AB_DIR = ROOT / ".ab"
BASE_PACKAGE = "ropekit_base"
# the implementations measured from both versions (the ladder's v1-v3 do not change; ropekit's paths do)
COMPARED = ("triton-v4", "ropekit", "ropekit-inplace", "ropekit-rows")
DEFAULT_CASES = "small-prefill,decode,llama3-8b-prefill,mha-fp16,fp32"


def export(ref: str) -> None:
    """``git archive`` of ``ref``'s ropekit/ into .ab/ropekit_base, its custom ops renamed so both can register."""
    target = AB_DIR / BASE_PACKAGE
    if target.exists():
        shutil.rmtree(target)
    AB_DIR.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "ropekit"], check=True,
                             capture_output=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "base.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp)
        shutil.move(str(Path(tmp) / "ropekit"), target)
    api = target / "api.py"
    # torch.library op names are global: two packages cannot both register "ropekit::rope"
    api.write_text(api.read_text().replace('"ropekit::', f'"{BASE_PACKAGE}::'))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True,
                            text=True).stdout.strip()
    (AB_DIR / "REF").write_text(f"{ref} {commit}\n")
    print(f"exported {ref} ({commit[:10]}) to {target}")


def import_base():
    if not (AB_DIR / BASE_PACKAGE).is_dir():
        raise SystemExit(f"no {AB_DIR / BASE_PACKAGE}: run `python tools/ab_versions.py --export REF` first")
    sys.path.insert(0, str(AB_DIR))
    import ropekit_base.bench.impls as base_impls  # noqa: F401  (the package's own relative imports)

    return base_impls


def make_pairs(peers_dir):
    """(current impls, base impls renamed ``base-*``, Liger) for the COMPARED names."""
    from ropekit.bench.impls import make_impls

    base_impls = import_base()
    current = [impl for impl in make_impls(peers_dir) if impl.name in COMPARED or impl.name == "liger"]
    base = [impl for impl in base_impls.make_impls(peers_dir) if impl.name in COMPARED]
    for impl in base:
        impl.name = f"base-{impl.name}"
        impl.label = f"{impl.label} at {(AB_DIR / 'REF').read_text().split()[0]}"
    return current, base


def check() -> None:
    """CPU: both versions' implementations build and agree with each other on a tiny small-prefill case."""
    import torch

    from ropekit.bench.cases import select_cases
    from ropekit.bench.inputs import make_data, make_tables

    current, base = make_pairs(None)
    case = dataclasses.replace(select_cases(names=["small-prefill"])[0], batch=1, seqlen=8, heads_q=4, heads_k=2,
                               head_dim=16)
    tables = make_tables(case, "cpu")
    outputs = {}
    for impl in current + base:
        if impl.name == "liger" or impl.supports(case, "forward") is not None:
            continue
        data = make_data(case, "cpu", 7)
        prepared = impl.build(case, tables, data, "forward")
        q, _ = prepared.outputs(prepared.fn())
        outputs[impl.name] = q.float().clone()
    for name in COMPARED:
        if name in outputs and f"base-{name}" in outputs:
            assert torch.equal(outputs[name], outputs[f"base-{name}"]), name
            print(f"{name}: this tree and base agree")


def measure(args) -> None:
    import torch

    from ropekit import device as _device
    from ropekit.bench.cli import resolve_cases
    from ropekit.bench.report import environment
    from ropekit.bench.runner import Progress, Runner, derive_metrics, refusal_reason
    from ropekit.bench.timing import GpuTimer, Settings

    reason = refusal_reason()
    if reason:
        raise SystemExit(reason)
    current, base = make_pairs(args.peers)
    impls = []  # each implementation beside its base version, in make_impls' order (Liger, without one, after them)
    for impl in current:
        impls += [impl] + [old for old in base if old.name == f"base-{impl.name}"]
    settings = Settings(graph_rounds=args.rounds, graph_ms=args.graph_ms, time_budget_s=args.time_budget)
    timer = GpuTimer(settings)
    ceiling = timer.copy_ceiling()
    cases = resolve_cases(args.cases.split(","))
    directions = sum(2 if c.backward else 1 for c in cases)
    start = time.time()
    runner = Runner(cases, impls, settings=settings, timer=timer, device=_device.DEVICE,
                    progress=Progress(directions * len(impls)), ceiling_gbps=ceiling["gbps"])
    runner.run()
    rows = derive_metrics(runner.rows, ceiling["gbps"])
    ratios = compare(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(
        {"environment": environment(), "gpu": torch.cuda.get_device_name(), "ceiling": ceiling,
         "base": (AB_DIR / "REF").read_text().strip(), "argv": sys.argv, "seconds": time.time() - start,
         "rows": rows, "ratios": ratios}, indent=1, default=str))
    print(f"wrote {out / 'ab.json'}")


def compare(rows: list[dict]) -> list[dict]:
    """new / base per case, direction, residency, implementation and clock; prints them with new / Liger."""
    ratios = []
    by_key = {(r["case"], r["direction"], r.get("residency"), r["impl"]): r for r in rows}
    for (case, direction, residency, impl), row in by_key.items():
        old = by_key.get((case, direction, residency, f"base-{impl}"))
        if old is None:
            continue
        for clock in ("graph_us", "do_bench_us", "eager_us"):
            if row.get(clock) and old.get(clock):
                ratios.append(dict(case=case, direction=direction, residency=residency, impl=impl, clock=clock,
                                   new_us=row[clock], base_us=old[clock], new_over_base=row[clock] / old[clock]))
    liger = {(r["case"], r["direction"], r.get("residency")): r.get("graph_us") for r in rows if r["impl"] == "liger"}
    print(f"\n{'case':20s} {'dir':4s} {'res':5s} {'impl':16s} {'clock':11s} {'base':>9s} {'new':>9s} {'new/base':>9s}"
          f" {'new/liger':>9s}")
    for r in ratios:
        peer = liger.get((r["case"], r["direction"], r["residency"]))
        vs_liger = f"{r['new_us'] / peer:9.3f}" if (peer and r["clock"] == "graph_us") else ""
        print(f"{r['case']:20s} {r['direction'][:3]:4s} {str(r['residency']):5s} {r['impl']:16s} {r['clock']:11s} "
              f"{r['base_us']:9.2f} {r['new_us']:9.2f} {r['new_over_base']:9.3f} {vs_liger}")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", metavar="REF", help="export REF's ropekit/ to .ab/ropekit_base (needs git)")
    parser.add_argument("--check", action="store_true", help="CPU: both versions build and agree")
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved graph-replay rounds")
    parser.add_argument("--graph-ms", type=float, default=60.0, help="replay time per graph, over all rounds")
    parser.add_argument("--time-budget", type=float, default=400.0)
    parser.add_argument("--peers", default=str(ROOT / ".peers") if (ROOT / ".peers").is_dir() else None)
    parser.add_argument("--out", default=os.environ.get("OUT", "ab"))
    args = parser.parse_args()
    if args.export:
        export(args.export)
    elif args.check:
        check()
    else:
        measure(args)


if __name__ == "__main__":
    main()
