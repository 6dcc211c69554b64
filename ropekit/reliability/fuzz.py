"""A fuzzer for hostile-but-plausible inputs: ``python -m ropekit.reliability.fuzz --cases N --seed S``.

Each case draws, independently for *every* tensor argument of an op (q, k, cos and sin or the inverse frequencies,
positions, cu_seqlens; for the fused ops also their norm weights, caches, slot mappings, page tables, scales and float8
outputs), its dtype, its view (contiguous, padded rows, stepped channels, permuted dimensions, expanded stride-0
dimensions, self-overlapping ``as_strided``) and its values (positions inside and outside the table, negative,
``cu_seqlens`` valid or not, ending past the tokens), plus the switches (layout, pairing, ``rotary_dim``, per-token
rows, M-RoPE's sections, the angles' scale, in place, autograd, check mode) and aliasing between tensors:
a tensor the call writes carved from one byte pool with another tensor of the call, on its bytes (an overlap kind
that must be refused: counted by kind in ``by_overlap_kind``) or apart.

The oracle, for every case:

* the call matches the float64 reference (``ropekit.reference``) within the output dtype's bound
  (``ropekit.testing``), or raises a documented error: ``TypeError``/``ValueError`` naming an argument,
  ``NotImplementedError``, or for overlapping in-place arguments the ``RuntimeError`` PyTorch raises for them;
* a call the documentation says must be refused is refused, and a plain valid call is not;
* in every case nothing outside the outputs changes: every input lives inside a larger buffer (guard elements
  before, after and between its rows, some of them NaN), and after the call each buffer is compared bit for bit
  outside what the call may write (nothing when it raised; an in-place target's own elements otherwise);
* an in-place call bumps the version counter of what it writes.

Cases are seeded one by one (``--case I`` replays case I of a seed and prints it), shapes are tiny and compile-time
values come from a bounded set, so the Triton interpreter runs a few hundred cases in CI within a minute.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from ropekit import device as _device  # first: the interpreter switch must precede any triton import

from .arena import VIEW_KINDS, Arena, footprint, same_bits, self_overlapping  # noqa: F401  (the targets' toolkit)

__all__ = ["Arena", "VIEW_KINDS", "Case", "footprint", "self_overlapping", "same_bits", "judge", "run", "run_case",
           "draw_case", "targets", "main"]

# An error message must name the argument it is about: one of the fuzzed ops' arguments (apply_rope's, the fused
# ops' and the engines' signatures', FlashInfer's float8 calls among them).
_ARGUMENT = re.compile(r"\b(q|k|v|cos|sin|positions|position_ids|cu_seqlens|max_seqlen|rotary_dim|layout|inplace|"
                       r"per_token|interleaved|table|backend|head_size|query|key|cos_sin_cache|k_cache|v_cache|"
                       r"kv_cache|slot_mapping|cache_offsets|k_scale_cache|v_scale_cache|kv_cache_dtype|k_scale|"
                       r"v_scale|scale|q_weight|k_weight|kv_c|q_pe|k_pe|eps|weight_offset|kv_indices|kv_indptr|"
                       r"batch_indices|cache_positions|kv_layout|ckv_cache|kpe_cache|mrope_section|mrope_interleaved|"
                       r"nope_temperature|inv_freq|q_dtype|q_scale|norm|norm_over|write_k|kv_cache_scale|"
                       r"rope_dim_offset|fused_set_kv_buffer_arg|q_rope|k_rope|q_nope|k_nope|pos_ids|is_neox|"
                       r"quantize_dtype|quant_scale_q|quant_scale_kv|q_rope_out|k_rope_out|q_nope_out|k_nope_out|"
                       r"paged_kv_cache|page_size)\b")


# --------------------------------------------------------------------------------------------------------------------
# Cases and the oracle.
# --------------------------------------------------------------------------------------------------------------------

MATCH, RAISE, EITHER = "match", "raise", "either"


@dataclass
class Case:
    """One drawn call. ``call()`` runs it; ``check(result)`` returns the ways its result is wrong (empty: right)."""

    target: str
    spec: dict  # what was drawn, for the reproducer
    arena: Arena
    call: Callable[[], object]
    check: Callable[[object], list[str]]
    expect: str = MATCH  # MATCH: must succeed and match; RAISE: must raise a documented error; EITHER: may do either
    why_raise: str = ""  # for RAISE: what the documentation says is wrong
    overlap: bool = False  # in-place arguments overlap: PyTorch's RuntimeError is documented too
    inplace_targets: list = field(default_factory=list)  # tensors the call may write (their versions must bump)
    env: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)  # the call's tensors by argument name, where a target names them


def _documented(error: BaseException, overlap: bool) -> str | None:
    """Why ``error`` is not a documented error (None when it is)."""
    if isinstance(error, NotImplementedError):
        return None
    if isinstance(error, RuntimeError) and overlap:
        return None  # PyTorch's own error for an in-place write to overlapping memory
    if isinstance(error, (TypeError, ValueError)):
        return None if _ARGUMENT.search(str(error)) else f"{type(error).__name__} naming no argument: {error}"
    return f"undocumented {type(error).__name__}: {str(error)[:300]}"


@contextlib.contextmanager
def _environment(env: dict):
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, value in env.items():
            os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def judge(case: Case) -> tuple[str, list[str]]:
    """Run a case: ("matched" | "documented_error", []) or ("violation", what went wrong)."""
    versions = [t._version for t in case.inplace_targets]
    error = None
    with _environment(case.env):
        try:
            result = case.call()
            if str(case.arena.device).startswith("cuda"):
                torch.cuda.synchronize()  # an asynchronous fault belongs to this case
        except Exception as e:  # noqa: BLE001  (the oracle classifies every exception)
            error, trace = e, traceback.format_exc(limit=-3)
    if error is not None:
        problems = case.arena.changed(allow=False)
        problems = [f"raised {type(error).__name__} but wrote {p}" for p in problems]
        why = _documented(error, case.overlap)
        if why is not None:
            problems.append(why + "\n" + trace)
        elif case.expect == MATCH:
            problems.append(f"refused a valid call: {type(error).__name__}: {error}")
        return ("violation", problems) if problems else ("documented_error", [])
    problems = [f"wrote outside its outputs: {p}" for p in case.arena.changed(allow=True)]
    if case.expect == RAISE:
        problems.append(f"accepted a call it must refuse ({case.why_raise})")
    else:
        problems += case.check(result)
        for t, before in zip(case.inplace_targets, versions):
            if t._version == before:
                problems.append("an in-place call did not bump the version counter of what it wrote")
                break
    return ("violation", problems) if problems else ("matched", [])


# --------------------------------------------------------------------------------------------------------------------
# Running.
# --------------------------------------------------------------------------------------------------------------------

# Targets a run leaves out unless named (--target): the CUDA backend builds its extension with nvcc first.
OPT_IN = frozenset({"apply_rope_cuda"})
# apply_rope has the most arguments to draw; the engines' two names share one contract; the cache writers draw
# layouts, cache addressing, engines' cache views and overlaps of their own; FlashInfer's float8 calls are
# rope_and_cache underneath
_WEIGHT = {"apply_rope": 6, "apply_rope_cuda": 6, "apply_rope_with_cos_sin_cache_inplace": 1, "rotary_embedding": 2,
           "rope_and_cache": 3, "mla_rope_and_cache": 2, "qk_norm_rope": 2, "rope_quantize_fp8": 1,
           "rope_quantize_fp8_append_paged_kv_cache": 1}


def _targets() -> dict:
    from . import fuzz_rope

    targets = {"apply_rope": fuzz_rope.draw, "apply_rope_cuda": fuzz_rope.draw_cuda}
    with contextlib.suppress(ImportError):
        from . import fuzz_fused

        targets.update(fuzz_fused.TARGETS)
    with contextlib.suppress(ImportError):
        from . import fuzz_cache

        targets.update(fuzz_cache.TARGETS)
    with contextlib.suppress(ImportError):
        from . import fuzz_fp8

        targets.update(fuzz_fp8.TARGETS)
    return targets


targets = _targets


def case_rng(seed: int, index: int, family_size: int = 1) -> tuple[random.Random, torch.Generator]:
    """The generators of case ``index`` of ``seed``: each case is replayable on its own.

    ``random.Random`` draws a case's structure (shapes, views, switches, dtypes, offsets), the torch generator its
    tensors' values. With ``family_size`` > 1 consecutive cases share their structure and differ in values: on a
    GPU one compiled kernel then serves the whole family (Triton specialises on dtypes, switches, the alignment of
    every pointer and which integer arguments are 1 or multiples of 16)."""
    structure = (seed * 1_000_003 + index // max(family_size, 1)) & 0xFFFF_FFFF_FFFF
    values = (seed * 1_000_003 + index) & 0xFFFF_FFFF_FFFF
    return random.Random(structure), torch.Generator().manual_seed(values)


def draw_case(seed: int, index: int, device, targets: dict, family_size: int = 1) -> Case:
    rng, gen = case_rng(seed, index, family_size)
    names = sorted(targets)
    name = rng.choices(names, weights=[_WEIGHT.get(n, 1) for n in names])[0]
    return targets[name](rng, gen, device)


def run_case(seed: int, index: int, device, targets: dict | None = None,
             family_size: int = 1) -> tuple[Case, str, list[str]]:
    case = draw_case(seed, index, device, targets or _targets(), family_size)
    outcome, problems = judge(case)
    return case, outcome, problems


def _tally(counts: dict, index: int, target: str, outcome: str, problems: list, spec: dict,
           max_findings: int) -> None:
    key = {"matched": "matched", "documented_error": "documented_errors", "violation": "violations"}[outcome]
    counts["cases"] += 1
    counts[key] += 1
    per = counts["by_target"].setdefault(target, {"cases": 0, "matched": 0, "documented_errors": 0, "violations": 0})
    per["cases"] += 1
    per[key] += 1
    kind = spec.get("overlap_kind")  # a written tensor drawn on another one's bytes: docs/fuzzing.md's kinds
    if kind:
        per = counts["by_overlap_kind"].setdefault(kind, {"cases": 0, "violations": 0, "by_pair": {}})
        per["cases"] += 1
        per["violations"] += key == "violations"
        if key == "violations":
            per["by_pair"][spec["overlap"]] = per["by_pair"].get(spec["overlap"], 0) + 1
    if problems and len(counts["findings"]) < max_findings:
        named = {"overlap": spec["overlap"]} if kind else {}
        counts["findings"].append({"case": index, "target": target, **named, "problems": problems, "spec": spec})


def _isolated_chunk(start: int, stop: int, seed: int, device, chosen: dict, deadline: float | None,
                    record_result: Callable, family_size: int) -> None:
    """Run cases ``start..stop-1`` in child processes; a case that kills its process (a crash, an illegal memory
    access that poisons the CUDA context) is a violation, and the chunk goes on with the next case in a new one."""
    index = start
    while index < stop and (deadline is None or time.time() < deadline):
        command = [sys.executable, "-m", "ropekit.reliability.fuzz", "--worker", "--seed", str(seed), "--start",
                   str(index), "--cases", str(stop), "--device", str(device)] + [f"--target={n}" for n in sorted(chosen)]
        command += ["--family-size", str(family_size)] + (["--deadline", repr(deadline)] if deadline else [])
        first = index
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = child.communicate()
        begun, progressed = None, False
        for line in stdout.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "begin" in record:
                begun = record["begin"]
            else:
                record_result(record["case"], record["target"], record["outcome"], record["problems"], record["spec"])
                index, begun, progressed = record["case"] + 1, None, True
        if child.returncode == 0 and begun is None:
            return
        if begun is None:
            if progressed:
                continue  # it left after a case that poisoned its device: go on in a fresh process
            raise RuntimeError(f"the fuzzing worker failed to start: {stderr[-2000:]}")
        case = draw_case(seed, begun, device, chosen, family_size)  # deterministic: the spec of the case that died
        # A corrupted heap may abort a later case than the one that wrote out of bounds: replay this one alone.
        alone = subprocess.run([sys.executable, "-m", "ropekit.reliability.fuzz", "--seed", str(seed), "--case",
                                str(begun), "--device", str(device), "--family-size", str(family_size)]
                               + [f"--target={n}" for n in sorted(chosen)],
                               capture_output=True, text=True)
        culprit = ("it dies alone too" if alone.returncode not in (0, 1) else
                   f"alone it does not die: an earlier case of that process (from case {first}) corrupted memory")
        record_result(begun, case.target, "violation", [f"the process died (exit status {child.returncode}) during "
                                                        f"the case; {culprit}: {stderr.strip()[-600:]}"], case.spec)
        index = begun + 1


def run(cases: int, seed: int, device: str | None = None, *, targets: list[str] | None = None,
        isolate: bool = False, workers: int = 1, time_budget_s: float | None = None, family_size: int = 1,
        trace: bool = False, max_findings: int = 50) -> dict:
    """Run ``cases`` seeded cases; return the counts (and the first ``max_findings`` violations, replayable with
    ``python -m ropekit.reliability.fuzz --seed SEED --case INDEX``).

    ``isolate``: cases run in child processes (``workers`` of them at a time, each over its own share of the
    cases: Triton compiles in parallel on a GPU machine), so a case may kill its process without ending the run.
    ``time_budget_s``: start no case after that many seconds (``cases`` in the result says how many ran).
    ``family_size``: consecutive cases that share their structure (see :func:`case_rng`)."""
    device = device or _device.DEVICE
    available = _targets()
    chosen = {name: available[name] for name in (targets or sorted(set(available) - OPT_IN))}
    counts = {"cases": 0, "matched": 0, "documented_errors": 0, "violations": 0, "seed": seed, "device": str(device),
              "targets": sorted(chosen), "family_size": family_size, "by_target": {}, "by_overlap_kind": {},
              "findings": []}
    start = time.perf_counter()
    deadline = None if time_budget_s is None else time.time() + time_budget_s
    lock = threading.Lock()

    def record_result(index, target, outcome, problems, spec):
        with lock:
            _tally(counts, index, target, outcome, problems, spec, max_findings)

    if isolate:
        bounds = [cases * w // workers for w in range(workers + 1)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            chunks = [pool.submit(_isolated_chunk, a, b, seed, device, chosen, deadline, record_result, family_size)
                      for a, b in zip(bounds, bounds[1:]) if b > a]
            for chunk in chunks:
                chunk.result()
        counts["findings"].sort(key=lambda finding: finding["case"])
    else:
        for index in range(cases):
            if deadline is not None and time.time() >= deadline:
                break
            if trace:
                print(f"case {index}", file=sys.stderr, flush=True)
            case, outcome, problems = run_case(seed, index, device, chosen, family_size)
            record_result(index, case.target, outcome, problems, case.spec)
    counts["seconds"] = round(time.perf_counter() - start, 1)
    return counts


def _worker(seed: int, start: int, stop: int, device, names: list, deadline: float | None,
            family_size: int) -> int:
    """The child of an isolated run: one JSON line as each case begins and one with its result."""
    available = _targets()
    chosen = {n: available[n] for n in names}
    for index in range(start, stop):
        if deadline is not None and time.time() >= deadline:
            break
        print(json.dumps({"begin": index}), flush=True)
        case, outcome, problems = run_case(seed, index, device, chosen, family_size)
        print(json.dumps({"case": index, "target": case.target, "outcome": outcome, "problems": problems,
                          "spec": case.spec}, default=str), flush=True)
        if not _device_alive(device):
            return 3  # a fault poisoned the CUDA context: the parent goes on in a fresh process
    return 0


def _device_alive(device) -> bool:
    if not str(device).startswith("cuda"):
        return True
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=device).add(1).item() == 2.0
    except Exception:  # noqa: BLE001  (any CUDA error here means the context is gone)
        return False


def _summary(counts: dict) -> str:
    """The counts as indented JSON, each finding on one line."""
    head = {k: v for k, v in counts.items() if k != "findings"}
    lines = json.dumps(head, indent=1, default=str)[:-2]
    findings = ",\n  ".join(json.dumps(f, default=str) for f in counts["findings"])
    return f'{lines},\n "findings": [\n  {findings}\n ]\n}}'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.reliability.fuzz", description=__doc__.splitlines()[0],
                                     epilog="example: python -m ropekit.reliability.fuzz --cases 300 --seed 0")
    parser.add_argument("--cases", type=int, default=300, help="how many cases (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="the seed (default 0)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: ropekit.device.DEVICE)")
    parser.add_argument("--case", type=int, default=None, help="replay one case of the seed and print it")
    parser.add_argument("--target", action="append", default=None, help="fuzz only this op (repeatable)")
    parser.add_argument("--in-process", action="store_true",
                        help="run every case in this process (default: child processes, so a crash is one finding)")
    parser.add_argument("--trace", action="store_true", help="(in process) print each case's index before it runs")
    parser.add_argument("--out", default=None, help="also write the counts as JSON to this file")
    parser.add_argument("--max-findings", type=int, default=50, help="how many violations to list (default 50)")
    parser.add_argument("--workers", type=int, default=1,
                        help="child processes at a time (default 1; on a GPU machine, about its CPU cores)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="start no case after this many seconds (the counts say how many ran)")
    parser.add_argument("--family-size", type=int, default=1,
                        help="consecutive cases sharing their structure, differing in values (GPU: fewer compiles)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device or _device.DEVICE
    if args.worker:
        return _worker(args.seed, args.start, args.cases, device, args.target, args.deadline, args.family_size)
    if args.case is not None:
        available = _targets()
        chosen = {n: available[n] for n in (args.target or sorted(set(available) - OPT_IN))}
        case, outcome, problems = run_case(args.seed, args.case, device, chosen, args.family_size)
        print(json.dumps({"case": args.case, "seed": args.seed, "target": case.target, "outcome": outcome,
                          "expect": case.expect, "problems": problems, "spec": case.spec}, indent=1, default=str))
        return 1 if outcome == "violation" else 0
    counts = run(args.cases, args.seed, device, targets=args.target, isolate=not args.in_process,
                 workers=args.workers, time_budget_s=args.time_budget, family_size=args.family_size, trace=args.trace,
                 max_findings=args.max_findings)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(counts, f, indent=1, default=str)
            f.write("\n")
    print(_summary(counts))
    return 1 if counts["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
