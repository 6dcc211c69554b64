"""Measure v4 launch configurations against the library's own choice, on the benchmark's cases (GPU; prints a table
and writes JSON): how the model's candidates compare on a GPU; docs/tuning.md records the results.

    python tools/tune_v4.py --cases llama3-8b-prefill,fp32 --out $OUT/tune_v4.json
    python tools/tune_v4.py --cases small-prefill --configs "choice; tile:block_s=1,block_h=32,num_warps=4"
    python tools/tune_v4.py --dry-run --cases small-prefill       # CPU: the whole path, tiny shapes, no clock
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer python tools/tune_v4.py --once   # each configuration once

``--once`` runs every configuration once on the case's real shape, compares it with the choice's output and times
nothing: what compute-sanitizer watches, each configuration alone (``bash tools/gpu_run.sh configs``).

A configuration is ``choice`` (whatever ``ropekit.triton.choice`` picks for the call on this GPU), or
``tile:field=value,...`` over ``TileConfig``'s fields, or ``flat:field=value,...`` over ``FlatConfig``'s (unnamed
fields keep their defaults). Without ``--configs`` each case gets the choice and every candidate the model offers the
autotune for the case on this GPU (``ropekit.triton.model.rope_candidates``).

Inputs come from the benchmark (``ropekit.bench``: same shapes, fresh random values, as many buffer sets as the harness
rotates through so that large cases read DRAM). Each configuration runs through the launcher with
``config=TileConfig(...)`` or ``FlatConfig(...)``; its output must equal the choice's bit for bit before it is timed. All configurations of
a case are timed together on the harness's graph clock, in interleaved rounds (``ropekit.bench.timing``), against the
copy ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this file sits in

import ropekit  # noqa: E402  (first: decides CUDA or the interpreter before triton is imported)
from ropekit.bench.cli import resolve_cases  # noqa: E402
from ropekit.bench.inputs import make_data, make_tables, seed_for  # noqa: E402
from ropekit.bench.runner import dram_sets, refusal_reason  # noqa: E402
from ropekit.bench.timing import DryRunTimer, GpuTimer, Settings  # noqa: E402
from ropekit.positions import resolve_positions  # noqa: E402

from ropekit.triton import choice, model  # noqa: E402
from ropekit.triton.launch import FlatConfig, TileConfig, plan_rope, rope_v4  # noqa: E402

DEFAULT_CASES = "llama3-8b-prefill,mha-fp16,fp32,small-prefill,decode"
_KINDS = {"tile": TileConfig, "flat": FlatConfig}


def label_of(config) -> str:
    kind = "flat" if type(config) is FlatConfig else "tile"
    return kind + ":" + ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in config._asdict().items())


def case_shape(case, tables, data):
    """The RopeShape the launch choice sees for the case's call."""
    out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
    return plan_rope(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k,
                     positions=case_positions(case, tables, data), rotary_dim=case.rotary,
                     interleaved=case.interleaved).shape


def parse_configs(text: str | None, shape) -> list[tuple[str, object]]:
    """(label, configuration or None for the choice) from ``--configs``; without it, the choice and every candidate
    the model offers the autotune for ``shape`` on this GPU (on a CPU: an H100's facts as published)."""
    if not text:
        facts = (choice.device_facts() if torch.cuda.is_available()
                 else model.DeviceFacts("H100 SXM (published)", 132, 3350.0, 600.0, "assumed"))
        return [("choice", None)] + [(label_of(c), c) for c in model.rope_candidates(facts, shape)]
    configs = []
    for spec in (s.strip() for s in text.split(";")):
        if spec == "choice":
            configs.append(("choice", None))
            continue
        kind, _, fields = spec.partition(":")
        cls = _KINDS[kind.strip()]
        defaults = {"tile": dict(block_s=1, block_h=1, num_warps=4), "flat": dict(block=1024, num_warps=8)}[kind]
        change = dict(defaults)
        for item in filter(None, fields.split(",")):
            key, _, value = item.partition("=")
            change[key.strip()] = int(value)
        change = {k: (bool(v) if isinstance(cls._field_defaults.get(k), bool) else v) for k, v in change.items()}
        configs.append((spec, cls(**change)))
    return configs


def case_positions(case, tables, data):
    return resolve_positions(batch=case.batch, seqlen=case.n_tokens if case.layout == "thd" else case.seqlen,
                             positions=tables.offsets, cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen,
                             device=data.q.device)


def case_shape_config(case, tables, data):
    """What the launch choice picks for the case's call on this GPU."""
    out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
    return plan_rope(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k,
                     positions=case_positions(case, tables, data), rotary_dim=case.rotary,
                     interleaved=case.interleaved).config


def launches(case, config, tables, data_sets):
    """One call per buffer set: the launcher on the case's bshd tensors into fresh outputs, with ``config``."""
    calls = []
    for data in data_sets:
        out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
        spec = case_positions(case, tables, data)

        def call(data=data, out_q=out_q, out_k=out_k, spec=spec):
            rope_v4(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k, positions=spec,
                    rotary_dim=case.rotary, interleaved=case.interleaved, config=config)
            return out_q, out_k
        calls.append(call)
    return calls


def tune_case(case, config_text, timer, settings, ceiling_gbps) -> dict:
    device = ropekit.device.DEVICE
    tables = make_tables(case, device)
    l2_bytes, _ = timer.l2_bytes()
    data_sets = [make_data(case, device, seed_for(case.name, str(i)))
                 for i in range(dram_sets(case, l2_bytes, settings.dram_factor))]
    moved = case.moved_bytes(False)
    estimate_us = moved / (ceiling_gbps * 1e3)
    table_calls = launches(case, None, tables, data_sets)
    expected = [t.clone() for t in table_calls[0]()]
    labels, graphs, rows = [], [], []
    for label, config in parse_configs(config_text, case_shape(case, tables, data_sets[0])):
        calls = table_calls if config is None else launches(case, config, tables, data_sets)
        try:
            got = calls[0]()
            same = all(torch.equal(a, b) for a, b in zip(got, expected))
        except Exception as error:  # noqa: BLE001  (a configuration the compiler or the launcher refuses)
            rows.append({"config": label, "error": f"{type(error).__name__}: {error}"[:300]})
            continue
        if not same:
            rows.append({"config": label, "error": "output differs from the choice's"})
            continue
        labels.append((label, config))
        graphs.append(timer.capture(calls, estimate_us))
    for (label, config), (us, spread, calls) in zip(labels, timer.replay_rounds(graphs)):
        planned = config if config is not None else case_shape_config(case, tables, data_sets[0])
        rows.append({"config": label, "fields": {"kind": type(planned).__name__, **planned._asdict()},
                     "graph_us": us, "spread": spread, "calls_per_graph": calls,
                     "pct_ceiling": moved / (us * 1e-6) / 1e9 / ceiling_gbps * 100})
    return {"case": case.name, "bytes": moved, "buffer_sets": len(data_sets), "rows": rows}


def run_once(cases, config_text) -> int:
    """Every configuration once on each case's real shape, checked bit for bit against the choice's output; returns
    the number that differ."""
    device = ropekit.device.DEVICE
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    differing = 0
    for case in cases:
        tables = make_tables(case, device)
        data = make_data(case, device, seed_for(case.name, "0"))
        expected = [t.clone() for t in launches(case, None, tables, [data])[0]()]
        sync()
        for label, config in parse_configs(config_text, case_shape(case, tables, data)):
            try:
                got = launches(case, config, tables, [data])[0]()
                sync()
                verdict = "same as choice" if all(torch.equal(a, b) for a, b in zip(got, expected)) else "DIFFERS"
            except Exception as error:  # noqa: BLE001  (a configuration the compiler or the launcher refuses)
                verdict = f"refused: {type(error).__name__}: {str(error)[:160]}"
            differing += verdict == "DIFFERS"
            print(f"{case.name:20s} {label:40s} {verdict}", flush=True)
    print(f"configs differing from the choice: {differing}")
    return differing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated benchmark case names")
    parser.add_argument("--configs", default=None,
                        help='"choice; tile:field=value,...; flat:field=value,..." (default: the candidates)')
    parser.add_argument("--rounds", type=int, default=7, help="interleaved graph-replay rounds")
    parser.add_argument("--graph-ms", type=float, default=40.0, help="replay time per configuration, all rounds")
    parser.add_argument("--dry-run", action="store_true", help="CPU: tiny shapes, every call once, no clock")
    parser.add_argument("--once", action="store_true", help="real shapes, every configuration once, no clock "
                                                            "(for compute-sanitizer)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "tune_v4.json"))
    args = parser.parse_args(argv)
    cases = resolve_cases(args.cases.split(","))
    if args.once:
        return 1 if run_once(cases, args.configs) else 0
    settings = Settings(graph_rounds=args.rounds, graph_ms=args.graph_ms)
    if args.dry_run:
        timer = DryRunTimer()
        cases = [dataclasses.replace(c, batch=2, seqlen=8, heads_q=4, heads_k=2, head_dim=16,
                                     **({"seq_lens": (3, 8)} if c.layout == "thd" else {}),
                                     **({"rotary_dim": 8} if c.rotary_dim else {})) for c in cases]
    else:
        if refusal_reason():
            raise SystemExit(refusal_reason())
        timer = GpuTimer(settings)
    ceiling = timer.copy_ceiling()
    report = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (dry run)",
              "torch": torch.__version__, "ceiling": ceiling, "dry_run": args.dry_run, "cases": []}
    print(f"{report['gpu']}: copy ceiling {ceiling['gbps']:.0f} GB/s ({ceiling['method']})", flush=True)
    for case in cases:
        result = tune_case(case, args.configs, timer, settings, ceiling["gbps"])
        report["cases"].append(result)
        print(f"\n{case.name}: {result['bytes'] / 1e6:.1f} MB moved, {result['buffer_sets']} buffer set(s)")
        for row in sorted(result["rows"], key=lambda r: r.get("graph_us", float("inf"))):
            if "error" in row:
                print(f"  {row['config']:48s} {row['error']}")
            else:
                print(f"  {row['config']:48s} {row['graph_us']:9.2f} us {row['pct_ceiling']:6.1f}%  "
                      f"(spread {100 * row['spread']:.1f}%)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
