"""``python -m ropekit stress``: the reliability run: proof that a kernel imported into someone's training run is
never quietly wrong, on every backend, written to JSON and rendered into ``docs/reliability.md``.

Sections (each one function that returns a JSON-able dict; :func:`run_all` runs them in order):

1. ``property``      seeded random configurations (shapes, strides, views, dtypes, pairings, positions, GQA, in place,
                     backward) against the float64 reference (``ropekit.reliability.properties``). Compile-time values
                     come from a bounded set of *families*, each allowed a few Triton kernel variants
                     (``ropekit.reliability.generate``), so thousands of configurations cost a bounded number of
                     compiles.
2. ``te_matrix``     Transformer Engine's fused-rope test matrix against our reference (``te_matrix``).
3. sanitizer         ``tools/sanitize.sh`` runs ``python -m ropekit stress --sanitize-driver`` under compute-sanitizer
                     (``sanitize``).
4. ``large``         one tensor past 2**31 elements, spot-checked against the reference (``checks``).
5. ``determinism``   repeated runs and batch / prefill-decode / layout invariance, bit for bit (``checks``).
6. ``safety``        invalid inputs raise the documented error before any write; NaN/Inf stay inside their pair
                     (``safety``).
7. ``long_context``  positions up to 1e6: the float64-angle table vs the common float32-angle table (``checks``).
8. ``fuzz``          hostile-but-plausible calls (``ropekit.reliability.fuzz``; docs/fuzzing.md).

Commands::

    python -m ropekit stress --out docs/reliability.json          # the GPU run (~2,000 configurations)
    python -m ropekit stress --quick --out /tmp/rel.json          # a smoke run
    python -m ropekit stress --sanitize-driver                     # what tools/sanitize.sh runs under the sanitizer
    python -m ropekit stress --render docs/reliability.json docs/reliability.md [--sanitizer docs/sanitize.json]

The float64 reference (``ropekit.reference``) and the accuracy bound (``ropekit.testing``) are the only definitions of
"correct" used here. The generator is a seeded ``random.Random``, so a failing configuration is reproduced from its
printed seed and description.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from typing import Optional

import torch

from ropekit import device as _device  # first: the interpreter switch must precede any triton import
from ropekit.api import apply_rope
from ropekit.frequencies import cos_sin_table
from ropekit.progress import Progress

from .checks import run_determinism, run_large, run_long_context
from .common import available_backends
from .properties import run_property
from .report import SECTIONS, render, section_line
from .safety import run_safety
from .sanitize import sanitize_driver
from .te_matrix import run_te_matrix

__all__ = ["run_fuzz", "run_all", "main"]


def _environment(argv) -> dict:
    import triton

    backends, why = available_backends()
    return {"ropekit": __import__("ropekit").__version__, "device": _device.describe(),
            "gpu": torch.cuda.get_device_name() if _device.DEVICE == "cuda" else None,
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "cuda_runtime": torch.version.cuda, "backends": backends, "cuda_backend": why,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m ropekit stress " + " ".join(argv)}


def run_fuzz(cases: int, seed: int, *, workers: int = 1, budget_s: float | None = None) -> dict:
    """Section 8: the fuzzer of hostile-but-plausible calls (``ropekit.reliability.fuzz``; docs/fuzzing.md), as a
    section: ``checked`` cases, ``failed`` oracle violations."""
    from . import fuzz

    counts = fuzz.run(cases, seed, isolate=_device.DEVICE == "cuda", workers=workers, time_budget_s=budget_s)
    return {"fuzz_cases": counts["cases"], "checked": counts["cases"], "failed": counts["violations"],
            "matched": counts["matched"], "documented_errors": counts["documented_errors"],
            "by_target": counts.get("by_target", {}), "by_overlap_kind": counts.get("by_overlap_kind", {}),
            "failures": [{"backend": f.get("target", "apply_rope"), "case": f"seed {seed} case {f.get('case')}",
                          **({"overlap": f["overlap"]} if "overlap" in f else {}),
                          "messages": list(f.get("problems", []))} for f in counts.get("findings", [])[:20]],
            "seconds": counts.get("seconds")}


def run_all(args: argparse.Namespace, argv: list) -> dict:
    """Run the chosen sections (``args``: :func:`build_parser`'s options; ``argv`` is recorded as the command)."""
    backends, _ = available_backends()
    on_gpu = _device.DEVICE == "cuda"
    quick = args.quick
    workers = args.workers or (min(8, max(1, (os.cpu_count() or 2) // 2)) if on_gpu else 1)
    if "cuda" in backends:
        _warm_cuda_backend()  # build the extension once, before workers would each wait for it
    plans = {
        "property": lambda: run_property(args.configs or ((200 if quick else 2000) if on_gpu else 40),
                                         seed=args.seed, backends=backends, n_families=args.families,
                                         variant_quota=args.variant_quota, workers=workers,
                                         budget_s=args.budget_s),
        "te_matrix": lambda: run_te_matrix(full=on_gpu and not quick, backends=backends,
                                           seq_scale=1 if on_gpu else 32, heads=8 if on_gpu else 2,
                                           workers=workers, budget_s=args.budget_s),
        "large": lambda: (run_large(backends) if on_gpu and not quick else
                          {"skipped": "needs a GPU with ~14 GB of free memory; not part of --quick runs"}),
        "determinism": lambda: run_determinism(backends, **({} if on_gpu else dict(repeats=3, batch=8, seqlen=6,
                                                                                    heads=(2, 1), head_dim=32)),
                                               **({"repeats": 10} if quick and on_gpu else {})),
        "safety": lambda: run_safety(backends),
        "long_context": lambda: run_long_context(backends, **({} if on_gpu else dict(rotary_dim=16, heads=2))),
        "fuzz": lambda: run_fuzz((300 if quick else 3000) if on_gpu else 100, args.seed,
                                 workers=max(workers, 8) if on_gpu else 1, budget_s=args.budget_s),
    }
    chosen = args.sections.split(",") if args.sections else list(SECTIONS)
    result = {"environment": _environment(argv), "quick": quick, "seed": args.seed, "sections": {}}
    start = time.perf_counter()
    progress = Progress(len(chosen), "stress", stream=sys.stdout)  # a bar on a terminal; a line per section always
    for name in chosen:
        t0 = time.perf_counter()
        progress.step(f"{name} ...", n=0)
        try:
            section = plans[name]()
        except Exception as error:  # noqa: BLE001 - a crashed section is reported, the others still run
            section = {"checked": 0, "failed": 1, "crashed": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc()[-2000:]}
        section.setdefault("seconds", round(time.perf_counter() - t0, 1))
        result["sections"][name] = section
        progress.step()  # the label stays on this section until the next one starts
        progress.stage(f"[stress] {name}: {section_line(section)}")
    progress.close()
    result["total_failures"] = sum(s.get("failed", 0) for s in result["sections"].values())
    result["total_not_run"] = sum(s.get("not_run", 0) for s in result["sections"].values())
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def _warm_cuda_backend() -> None:
    q = torch.randn(1, 2, 1, 8, device=_device.DEVICE)
    cos, sin = cos_sin_table(4, 8, device=_device.DEVICE)
    try:
        apply_rope(q, None, cos, sin, backend="cuda")
    except Exception as error:  # noqa: BLE001 - the sections report per configuration
        print(f"[stress] cuda backend warm-up failed: {type(error).__name__}: {error}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m ropekit stress``."""
    parser = argparse.ArgumentParser(prog="python -m ropekit stress", description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m ropekit stress --quick --out /tmp/reliability.json")
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--quick", action="store_true", help="a smoke run (fewer configurations, no large tensor)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", type=int, default=0, help="property configurations (default: 2000 on a GPU)")
    parser.add_argument("--families", type=int, default=48, help="property families (compile-time value sets)")
    parser.add_argument("--variant-quota", type=int, default=4, help="Triton kernel variants allowed per family")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="seconds each of the property and TE sections may take before it stops starting jobs")
    parser.add_argument("--workers", type=int, default=0,
                        help="processes for the property and TE sections (default: CPU cores / 2 on a GPU, max 8)")
    parser.add_argument("--sanitize-driver", action="store_true", help="run every kernel once (for compute-sanitizer)")
    parser.add_argument("--render", nargs=2, metavar=("JSON", "MD"), help="render the markdown from a stress JSON")
    parser.add_argument("--sanitizer", help="with --render: the sanitizer JSON of tools/sanitize.sh")
    return parser


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.render:
        render(*args.render, sanitizer_path=args.sanitizer)
        print(f"wrote {args.render[1]}")
        return 0
    if args.sanitize_driver:
        return sanitize_driver()
    with _device.set_backend("triton"):  # the reliability of the kernels: the Triton ones (interpreted on a CPU)
        result = run_all(args, argv)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1, default=str)
    verdict = "FAIL" if result["total_failures"] else ("INCOMPLETE" if result["total_not_run"] else "PASS")
    print(f"[stress] {verdict}: {result['total_failures']} failures, {result['total_not_run']} jobs not run (time "
          f"budget), {result['seconds']} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 0 if verdict == "PASS" else 1
