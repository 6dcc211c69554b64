"""Eager host cost: what a call costs when nothing hides the host's work, on the decode and small-prefill cases.

    python -m ropekit.bench.eager --out DIR            # on a GPU, real sizes: JSON + markdown
    python -m ropekit.bench.eager --out DIR --dry-run  # anywhere: tiny shapes, a few calls, every call checked

A CUDA graph hides the host: its replays launch without Python. Eager calls are what HF generation and a training
step pay, so this clock runs every call from Python. For each call: a warm-up (plans built, kernels compiled), then
``--repeats`` runs of ``--calls`` back-to-back calls with one synchronisation at the end (the clarifications' eager
time, :func:`ropekit.bench.timing.back_to_back_us`), the runs of every call interleaved (every other run in reverse
order) so that a drift of the host reaches them alike; the median of the runs is reported with their range. Calls
run under ``torch.no_grad()``, as generation does. Every call is checked against a reference before it is timed (a
wrong call is reported, never timed).

The calls, on each case (decode b64 and small prefill b1 s512, Llama-3-8B heads; MLA with DeepSeek's):

* ``apply_rope`` out of place (the default) and in place, and Liger's rope when it can be loaded (as the main benchmark
  loads it, :mod:`ropekit.bench.peers`), on the main benchmark's inputs (:mod:`ropekit.bench.impls`);
* every fused op, and beside it the unfused chain a user would write instead, on the fused benchmark's inputs
  (:mod:`ropekit.bench.fused`: a packed qkv projection, a shuffled paged cache).

The targets (``evaluate_targets``): every fused op at most 1.5x ``apply_rope`` alone and at most 0.5x its unfused
chain; ``apply_rope`` at most 0.6x Liger's rope. ``apply_rope`` has two modes; each target that names it is judged
against both, one row each.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import reference
from ..api import apply_rope
from ..fused import qk_norm_rope
from . import fused, fused_cases
from .cases import MAIN_CASES, Case
from .fused_cases import EPS, FusedCase
from .impls import FORWARD, make_impls
from .inputs import check_outputs, expected_output, make_data, make_tables, seed_for
from .timing import back_to_back_us

__all__ = ["EagerCase", "CASES", "OPS", "Op", "CheckedCall", "Skip", "tiny", "run_case", "run", "evaluate_targets",
           "render_markdown", "publish", "main", "time_interleaved", "TARGETS", "SCHEMA", "APPLY_ROPE",
           "APPLY_ROPE_INPLACE", "LIGER"]

SCHEMA = "ropekit-bench-eager/1"
APPLY_ROPE, APPLY_ROPE_INPLACE, LIGER = "apply_rope", "apply_rope (in place)", "Liger rope"
TARGETS = {"fused over apply_rope": 1.5, "fused over its chain": 0.5, "apply_rope over Liger": 0.6}


@dataclass(frozen=True)
class EagerCase:
    """One of the two cases: the main benchmark's case for the single-op calls, the fused benchmark's for the rest."""

    name: str
    title: str
    rope: Case  # apply_rope and Liger (separate q and k)
    cache: FusedCase  # rope_and_cache, paged bf16 (its q, k and v are slices of a packed qkv)
    qknorm: FusedCase  # rope_and_cache + QK-norm; qk_norm_rope
    fp8: FusedCase  # rope_and_cache into a float8 e4m3 cache
    mla: FusedCase  # mla_rope_and_cache


_MAIN = {c.name: c for c in MAIN_CASES}
_FUSED = {c.name: c for c in fused_cases.CASES}


def _prefill(case: FusedCase, name: str, title: str) -> FusedCase:
    return dataclasses.replace(case, name=name, title=title, batch=1, seqlen=512)


CASES = (
    EagerCase("decode", "decode b64 (Llama-3-8B heads; MLA: DeepSeek's 128 heads, rope 64, latent 512)",
              _MAIN["decode"], _FUSED["decode-b64"], _FUSED["decode-b64-qknorm"], _FUSED["decode-b64-fp8"],
              _FUSED["mla-decode-b64"]),
    EagerCase("small-prefill", "small prefill b1 s512 (Llama-3-8B heads; MLA: DeepSeek's)", _MAIN["small-prefill"],
              _prefill(_FUSED["decode-b64"], "prefill-b1-s512", "Llama-3-8B prefill b1 s512, paged bf16"),
              _prefill(_FUSED["decode-b64-qknorm"], "prefill-b1-s512-qknorm", "Qwen3-8B prefill b1 s512 + QK-norm"),
              _prefill(_FUSED["decode-b64-fp8"], "prefill-b1-s512-fp8", "Llama-3-8B prefill b1 s512, float8 cache"),
              _prefill(_FUSED["mla-decode-b64"], "mla-prefill-b1-s512", "DeepSeek MLA prefill b1 s512")),
)


def tiny(case: EagerCase) -> EagerCase:
    """The same case at interpreter sizes (dry runs and tests)."""
    decode = case.rope.seqlen == 1
    rope = case.rope.scaled_down(batch=3 if decode else 2, seqlen=1 if decode else 8, heads_q=4, heads_k=2,
                                 head_dim=32)
    return dataclasses.replace(case, title=case.title + " (tiny shapes)", rope=rope,
                               **{f: fused_cases.tiny(getattr(case, f)) for f in ("cache", "qknorm", "fp8", "mla")})


# --- the calls: each prepares, from a case, a checked zero-argument call (or says why it cannot) ---------------------

class Skip(Exception):
    """The call cannot run here (a peer not installed): a row marked "skipped" with the reason."""


@dataclass
class CheckedCall:
    fn: Callable[[], object]
    check_error: float  # worst error as a multiple of the allowance (<= 1 passes)
    message: Optional[str] = None  # why the check failed


def _single_op(impl_name: str, peers_dir) -> Callable:
    """A main-benchmark adapter (``ropekit``, ``ropekit-inplace``, ``liger``) on the case's single-op inputs."""
    def prepare(case: EagerCase, device) -> CheckedCall:
        impl = next(i for i in make_impls(peers_dir) if i.name == impl_name)
        reason = impl.available() or impl.supports(case.rope, FORWARD)
        if reason:
            raise Skip(reason)
        tables = make_tables(case.rope, device)
        data = make_data(case.rope, device, seed_for(case.rope.name, impl_name, "eager"))
        prepared = impl.build(case.rope, tables, data, FORWARD)
        expected = [expected_output(case.rope, tables, x) for x in (data.q, data.k)]  # before any in-place call
        result = prepared.fn()
        error, message = check_outputs(case.rope, prepared.outputs(result), expected)
        return CheckedCall(prepared.fn, error, message)
    return prepare


def _fused_benchmark(kind: str, impl_name: str) -> Callable:
    """The fused benchmark's call ``impl_name`` (the fused op or its unfused chain) on the case's ``kind`` inputs."""
    def prepare(case: EagerCase, device) -> CheckedCall:
        fused_case = getattr(case, kind)
        build = fused.impls()[impl_name]
        result, _, fn = fused.checked_call(fused_case, build, device, seed_for(fused_case.name, impl_name, "eager"))
        return CheckedCall(fn, max(result["error_ratio"], result["quant_ulps"] or 0.0),
                        None if result["ok"] else f"wrong result: {result}")
    return prepare


def _norm_rope(fused_op: bool) -> Callable:
    """``qk_norm_rope`` in place on the packed projection's q and k, or its chain: ``F.rms_norm`` x2, then
    ``apply_rope`` in place on the normalised tensors (checked against the float64 norm and rotation)."""
    def prepare(case: EagerCase, device) -> CheckedCall:
        c = case.qknorm
        data = fused_cases.make_data(c, device, seed_for(c.name, "qk_norm_rope", str(fused_op), "eager"))
        q, k, _ = data.split()
        (w_q, w_k), cos, sin, offsets = data.weights, data.cos, data.sin, data.offsets
        positions = data.token_positions
        want = {name: reference.rope_table(reference.rms_norm(x.reshape(c.tokens, -1, c.head_dim), w, eps=EPS),
                                           cos, sin, positions)
                for name, x, w in (("q", q, w_q), ("k", k, w_k))}
        if fused_op:
            def fn():
                return qk_norm_rope(q, k, cos, sin, w_q, w_k, eps=EPS, positions=offsets, inplace=True)
        else:
            def fn():
                q_ = F.rms_norm(q, (c.head_dim,), w_q, EPS)
                k_ = F.rms_norm(k, (c.head_dim,), w_k, EPS)
                return apply_rope(q_, k_, cos, sin, positions=offsets, inplace=True)
        q_out, k_out = fn()
        got = {"q": q_out.reshape(c.tokens, -1, c.head_dim), "k": k_out.reshape(c.tokens, -1, c.head_dim)}
        result = fused_cases.check(data, want, got)
        return CheckedCall(fn, result["error_ratio"], None if result["ok"] else f"wrong result: {result}")
    return prepare


@dataclass(frozen=True)
class Op:
    """A timed call: ``kind`` "rope" (apply_rope), "peer", "fused" (its ``chain`` names its unfused chain) or
    "chain"; ``make(peers_dir)`` gives ``prepare(case, device)``, which returns a :class:`CheckedCall` or raises
    :class:`Skip`."""

    name: str
    kind: str
    make: Callable  # (peers_dir) -> prepare(case, device)
    chain: Optional[str] = None


def _ops() -> tuple:
    def pair(fused_name: str, chain_name: str, kind: str) -> tuple:
        return (Op(fused_name, "fused", lambda _: _fused_benchmark(kind, "ropekit-fused"), chain_name),
                Op(chain_name, "chain", lambda _: _fused_benchmark(kind, "unfused (index_copy_)")))
    return (
        Op(APPLY_ROPE, "rope", lambda peers: _single_op("ropekit", peers)),
        Op(APPLY_ROPE_INPLACE, "rope", lambda peers: _single_op("ropekit-inplace", peers)),
        Op(LIGER, "peer", lambda peers: _single_op("liger", peers)),
        *pair("rope_and_cache", "apply_rope + index_copy_ x2", "cache"),
        *pair("rope_and_cache + QK-norm", "F.rms_norm x2 + apply_rope + index_copy_ x2", "qknorm"),
        *pair("rope_and_cache, float8 cache", "apply_rope + e4m3 rounding + index_copy_ x2", "fp8"),
        Op("qk_norm_rope", "fused", lambda _: _norm_rope(True), "F.rms_norm x2 + apply_rope"),
        Op("F.rms_norm x2 + apply_rope", "chain", lambda _: _norm_rope(False)),
        *pair("mla_rope_and_cache", "apply_rope + index_copy_ (latent cache)", "mla"),
    )


OPS = _ops()


# --- the run ---------------------------------------------------------------------------------------------------------

def _sync(device) -> Callable[[], None]:
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def run_case(case: EagerCase, device, *, calls: int, repeats: int, warmup: int, peers_dir=None,
             log=print) -> list[dict]:
    """Prepare and check every call of ``case``, warm each up, then time them in ``repeats`` interleaved runs."""
    rows, timed = [], {}
    for op in OPS:
        row = {"case": case.name, "op": op.name, "kind": op.kind, "chain": op.chain, "status": "ok", "reason": None,
               "us": None, "runs_us": [], "check_error": None}
        rows.append(row)
        try:
            with torch.no_grad():
                prepared = op.make(peers_dir)(case, device)
            row["check_error"] = prepared.check_error
            if prepared.message:
                row.update(status="wrong result", reason=prepared.message[:400])
            else:
                timed[op.name] = (row, prepared.fn)
        except Skip as reason:
            row.update(status="skipped", reason=str(reason)[:400])
        except Exception as error:  # noqa: BLE001  (one call's failure must not end the run)
            row.update(status="error", reason=f"{type(error).__name__}: {error}"[:400])
        log(f"{case.name:14s} {op.name:48s} {row['status']}")
    time_interleaved(list(timed.values()), device, calls=calls, repeats=repeats, warmup=warmup)
    return rows


def time_interleaved(timed: list, device, *, calls: int, repeats: int, warmup: int) -> None:
    """Time each ``(row, fn)`` of ``timed``: ``warmup`` calls each, then ``repeats`` runs, each timing ``calls``
    back-to-back calls of every fn in turn (so run i of every call saw the host as it was then), in ``timed``'s order
    and, every other run, in reverse (a host that drifts within a run favours neither of two neighbours), appended to
    ``row["runs_us"]``; ``row["us"]`` is their median. Under ``torch.no_grad()``, the garbage collector held off
    while the runs last."""
    sync = _sync(device)
    with torch.no_grad():
        for _, fn in timed:
            for _ in range(warmup):
                fn()
        sync()
        gc.collect()
        gc.disable()  # as timeit does: a collection inside a run is not the call's cost
        try:
            for run in range(repeats):
                for row, fn in (timed if run % 2 == 0 else timed[::-1]):
                    row["runs_us"].append(back_to_back_us(fn, calls, sync))
        finally:
            gc.enable()
    for row, _ in timed:
        row["us"] = statistics.median(row["runs_us"])


def run(cases, device, *, calls: int, repeats: int, warmup: int, dry_run: bool, peers_dir=None, log=print,
        budget_s: Optional[float] = None) -> dict:
    """The whole run as one JSON-ready document, its targets judged. Once ``budget_s`` seconds have passed, the
    remaining cases get "not run" rows (the first case always runs)."""
    from .report import environment

    started = time.perf_counter()
    rows = []
    for case in cases:
        if rows and budget_s and time.perf_counter() - started > budget_s:
            rows += [{"case": case.name, "op": op.name, "kind": op.kind, "chain": op.chain, "status": "not run",
                      "reason": f"time budget of {budget_s:g} s used up (--time-budget)", "us": None, "runs_us": [],
                      "check_error": None} for op in OPS]
            continue
        rows += run_case(case, device, calls=calls, repeats=repeats, warmup=warmup, peers_dir=peers_dir, log=log)
    doc = {
        "schema": SCHEMA, "benchmark": "eager host cost",
        "created": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "command": None, "dry_run": dry_run, "device": str(device), "environment": environment(),
        "settings": {"calls": calls, "repeats": repeats, "warmup_calls": warmup, "grad_mode": "no_grad"},
        "cases": [{"name": c.name, "title": c.title} for c in cases], "rows": rows,
        "duration_s": round(time.perf_counter() - started, 1),
    }
    doc["targets"] = evaluate_targets(doc)
    return doc


# --- the targets and the page --------------------------------------------------------------------------------------

def ratio(numerator: dict, denominator: dict) -> float:
    """How many times as long one call took as another, two rows of one case: the median over the runs of each
    run's ratio. The runs of every call are interleaved (:func:`run_case`), so run i of both ran on the host as it
    was then; a host whose speed drifts from run to run moves both alike, where a ratio of the two medians would
    mix its speeds. Rows without a run each (or with runs of other counts): the ratio of their medians."""
    runs_a, runs_b = numerator.get("runs_us") or [], denominator.get("runs_us") or []
    if runs_a and len(runs_a) == len(runs_b):
        return statistics.median(a / b for a, b in zip(runs_a, runs_b))
    return numerator["us"] / denominator["us"]


def evaluate_targets(doc: dict) -> list[dict]:
    """Each target on each case: the :func:`ratio` of the two calls and whether it holds (None: not measured, or a
    dry run, whose numbers are no measurement). ``apply_rope`` is judged in both of its modes, one row each."""
    targets = []
    for case in doc["cases"]:
        measured = {r["op"]: r for r in doc["rows"] if r["case"] == case["name"] and r["us"]}

        def add(target, numerator, denominator, limit):
            value = ratio(measured[numerator], measured[denominator]) \
                if numerator in measured and denominator in measured else None
            met = None if value is None or doc.get("dry_run") else value <= limit
            targets.append({"case": case["name"], "target": target, "op": numerator, "versus": denominator,
                            "value": value, "limit": limit, "met": met})

        for op in OPS:
            if op.kind != "fused":
                continue
            for base in (APPLY_ROPE, APPLY_ROPE_INPLACE):
                add(f"{op.name} <= {TARGETS['fused over apply_rope']:g}x {base}", op.name, base,
                    TARGETS["fused over apply_rope"])
            add(f"{op.name} <= {TARGETS['fused over its chain']:g}x its unfused chain", op.name, op.chain,
                TARGETS["fused over its chain"])
        for base in (APPLY_ROPE, APPLY_ROPE_INPLACE):
            add(f"{base} <= {TARGETS['apply_rope over Liger']:g}x {LIGER}", base, LIGER,
                TARGETS["apply_rope over Liger"])
    return targets


def _fmt(value, spec=".1f") -> str:
    return "–" if value is None else format(value, spec)


def render_markdown(doc: dict) -> str:
    env, settings = doc["environment"], doc["settings"]
    lines = ["# Eager host cost: back-to-back calls", "",
             f"Wall clock of {settings['calls']} back-to-back calls with one synchronisation at the end, divided by "
             f"the calls; the median of {settings['repeats']} such runs (the runs of every call interleaved), with "
             f"the runs' range. After {settings['warmup_calls']} warm-up calls each, under `torch.no_grad()`. Host "
             "time included: no CUDA graph. Every call checked against a reference before it was timed. A ratio "
             "of two calls is the median over the runs of each run's ratio: run i of every call ran on the host as "
             "it was then, so a host whose speed drifts between runs moves both alike.", ""]
    if doc.get("dry_run"):
        lines += ["**Dry run**: tiny shapes and a few calls, to check the pipeline. These times measure nothing and "
                  "no target is judged.", ""]
    lines += [*([f"Command: `{doc['command']}`  "] if doc.get("command") else []),
              f"Device: {env.get('gpu', doc['device'])}, torch {env['torch']}, triton {env['triton']}, "
              f"ropekit {env['ropekit']}, {doc['created']}", ""]
    for case in doc["cases"]:
        rows = [r for r in doc["rows"] if r["case"] == case["name"]]
        measured = {r["op"]: r for r in rows if r["us"]}
        lines += [f"## {case['title']}", "",
                  "| call | µs a call | runs' range | ÷ apply_rope | ÷ apply_rope in place | ÷ its unfused chain | "
                  "check |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            value = r["us"]
            ratios = [ratio(r, measured[base]) if value and base in measured else None
                      for base in (APPLY_ROPE, APPLY_ROPE_INPLACE)]
            chain = ratio(r, measured[r["chain"]]) if value and r["chain"] in measured else None
            spread = f"{min(r['runs_us']):.1f}–{max(r['runs_us']):.1f}" if r["runs_us"] else "–"
            status = "ok" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
            name = f"{r['op']} (fused)" if r["kind"] == "fused" else r["op"]
            lines.append(f"| {name} | {_fmt(value)} | {spread} | {_fmt(ratios[0], '.2f')} | "
                         f"{_fmt(ratios[1], '.2f')} | {_fmt(chain, '.2f')} | {status} |")
        lines.append("")
    lines += ["## Targets", "", "| case | target | value | met |", "|---|---|---|---|"]
    for t in doc["targets"]:
        met = {True: "yes", False: "**no**", None: "dry run" if doc.get("dry_run") else "not measured"}[t["met"]]
        lines.append(f"| {t['case']} | {t['target']} | {_fmt(t['value'], '.2f')}x | {met} |"
                     if t["value"] is not None else f"| {t['case']} | {t['target']} | – | {met} |")
    return "\n".join(lines) + "\n"


def publish(doc: dict, out: Path) -> list[Path]:
    """benchmarks_eager.json and .md in ``out`` (their paths printed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "benchmarks_eager.json", out / "benchmarks_eager.md"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(render_markdown(doc))
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


def _summary(doc: dict) -> str:
    lines = [f"eager host cost on {doc['environment'].get('gpu', doc['device'])}"
             + (" (dry run: not a measurement)" if doc["dry_run"] else "")]
    for r in doc["rows"]:
        lines.append(f"  {r['case']:14s} {r['op']:48s} " + (f"{r['us']:8.1f} µs" if r["us"] else r["status"]))
    for t in doc["targets"]:
        verdict = {True: "met", False: "NOT MET", None: "-"}[t["met"]]
        value = "not measured" if t["value"] is None else f"{t['value']:.2f}x"
        lines.append(f"  {verdict:7s} {t['case']:14s} {t['target']}: {value}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.bench.eager", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for benchmarks_eager.{json,md}")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, a few calls (any machine): no measurement")
    parser.add_argument("--calls", type=int, help="back-to-back calls a run (default 1000; dry run 5)")
    parser.add_argument("--repeats", type=int, help="runs of every call, interleaved (default 5; dry run 2)")
    parser.add_argument("--warmup", type=int, help="warm-up calls of every call (default 50; dry run 1)")
    parser.add_argument("--peers", help="directory tools/fetch_peers.sh filled (default .peers)")
    parser.add_argument("--cases", nargs="*", default=None, help=f"case names (default all): {[c.name for c in CASES]}")
    parser.add_argument("--time-budget", type=float, default=240.0,
                        help="seconds after which no new case starts (0: no limit); the outputs are written either way")
    args = parser.parse_args(argv)
    unknown = set(args.cases or ()) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}")
    cases = [c for c in CASES if args.cases is None or c.name in args.cases]
    gpu = torch.cuda.is_available()
    if not gpu and not args.dry_run:
        print("ropekit.bench.eager: refusing to time without a CUDA GPU (the CPU computes with other code); "
              "--dry-run checks the pipeline at tiny shapes anywhere", file=sys.stderr)
        return 2
    if args.dry_run:
        cases = [tiny(c) for c in cases]
    defaults = (5, 2, 1) if args.dry_run else (1000, 5, 50)
    calls, repeats, warmup = (given if given is not None else default
                              for given, default in zip((args.calls, args.repeats, args.warmup), defaults))
    doc = run(cases, "cuda" if gpu else "cpu", calls=calls, repeats=repeats, warmup=warmup, dry_run=args.dry_run,
              peers_dir=args.peers, budget_s=args.time_budget)
    doc["command"] = "python -m ropekit.bench.eager " + " ".join(argv if argv is not None else sys.argv[1:])
    publish(doc, args.out)
    print(_summary(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
