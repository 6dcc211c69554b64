"""v4's flat path (``FLAT``: blocks of consecutive elements, the structure torch.compile's Inductor generates for the
rotate_half formula, docs/gpu-runs/run22/inductor_fp32.txt) against v4's fused token tile and torch.compile on the
large cases, in the harness's conditions (CUDA graphs, buffer sets rotating past 4x L2, rounds interleaved).

Without ``--ab``: the flat path's block sizes and warps. With ``--ab``: the launch table's tile against its flat
path, forward and conjugate (the backward). With ``--paired``: the paired flat path (the same block of q and of k
in one program, ``LaunchConfig.flat_paired``: the kernel Inductor generates when q and k have the same shape) over
block sizes, warps and the streaming hint, forward and conjugate, against the tile and the q-then-k flat path.
(run26 ran the first sweep on a standalone copy of the kernel, before it became v4's FLAT switch.)

``--ballast GB`` first allocates (and writes) that much other device memory: the harness holds every
implementation's buffer sets of a case at once (its graphs are replayed together), and v4's fp32 tile read 47.0 µs
alone but 47.5-47.8 µs with the others' buffers alive, where torch.compile stayed at 46.9 (run34).

    python tools/flat_probe.py [--cases fp32,llama3-8b-prefill] [--rounds 5] [--ab | --paired] [--ballast 8]
                               [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import statistics

import torch

from ropekit import api
from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables, seed_for
from ropekit.bench.runner import dram_sets
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import v4
from tune_v4 import graph_replay_us  # tools/ is on sys.path when this file runs as a script


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="fp32,llama3-8b-prefill")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ab", action="store_true", help="v4's tile against v4's flat path (and their conjugates) "
                        "instead of the flat path's block sizes")
    parser.add_argument("--paired", action="store_true", help="the paired flat path's block sizes, warps and hint, "
                        "forward and conjugate, against the tile and the q-then-k flat path")
    parser.add_argument("--ballast", type=float, default=0.0, help="GB of other device memory held meanwhile")
    parser.add_argument("--json", help="also write the medians (µs) per case and candidate to this file")
    parser.add_argument("--dtype", help="run the cases in this dtype instead (e.g. float32: a GQA shape in fp32, "
                        "where the paired path falls back to q then k)")
    args = parser.parse_args()
    ballast = [torch.ones(1 << 28, dtype=torch.float32, device="cuda") for _ in range(int(args.ballast))]  # 1 GB each
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ceiling = GpuTimer(Settings()).copy_ceiling()["gbps"]  # the harness's ceiling (run26 used a 4-call graph: wrong)
    print(f"{torch.cuda.get_device_name()} ceiling {ceiling:.0f} GB/s, {len(ballast)} GB of ballast", flush=True)
    impls = {i.name: i for i in make_impls(".peers")}
    medians = {}
    for case in select_cases(names=args.cases.split(",")):
        if args.dtype:
            case = dataclasses.replace(case, name=f"{case.name}-{args.dtype}", dtype=getattr(torch, args.dtype))
        n_sets = dram_sets(case, l2, 4.0)
        tables = make_tables(case, "cuda")
        datas = [make_data(case, "cuda", 300 + i) for i in range(n_sets)]
        outs = [(torch.empty_like(d.q), torch.empty_like(d.k)) for d in datas]
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=None)
        cos, sin = tables.cos_half, tables.sin_half
        candidates = {
            "v4 default": [lambda d=d, o=o: v4.rope_v4(d.q, d.k, cos, sin, out_q=o[0], out_k=o[1], positions=spec,
                                                       rotary_dim=case.rotary, interleaved=case.interleaved)
                           for d, o in zip(datas, outs)],
        }
        table = v4.launch_config(case.n_tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary,
                                 element_size=case.element_size)
        if args.paired:
            configs = {"v4 tile": table._replace(flat=0),
                       "flat 1024/8w": table._replace(flat=1024, flat_warps=8, flat_paired=False,
                                                      flat_streaming=True),
                       "flat 2048/8w": table._replace(flat=2048, flat_warps=8, flat_paired=False,
                                                      flat_streaming=True)}
            for (block, warps), hint in itertools.product(((512, 4), (1024, 4), (512, 8), (1024, 8), (2048, 8),
                                                           (2048, 16)), (True, False)):
                configs[f"paired {block}/{warps}w{' ef' if hint else ''}"] = table._replace(
                    flat=block, flat_warps=warps, flat_paired=True, flat_streaming=hint)
        elif args.ab:
            # v4's own two paths for this shape, forward and conjugate (the backward), A/B in the same rounds
            configs = {"v4 tile": table._replace(flat=0), "v4 flat": table._replace(flat=2048, flat_streaming=True),
                       "v4 flat, no hint": table._replace(flat=2048, flat_streaming=False)}
        else:
            configs = {f"flat {block}/{warps}w": table._replace(flat=block, flat_warps=warps)
                       for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 16))}
        for label, config in configs.items():
            for conjugate in (False, True) if args.ab or args.paired else (False,):
                candidates[f"{label}{' conj' if conjugate else ''}"] = [
                    lambda d=d, o=o, c=config, j=conjugate: v4.rope_v4(
                        d.q, d.k, cos, sin, out_q=o[0], out_k=o[1], positions=spec, rotary_dim=case.rotary,
                        interleaved=case.interleaved, conjugate=j, config=c) for d, o in zip(datas, outs)]
        compile_impl = impls["torch-compile"]
        if compile_impl.available() is None:
            candidates["torch-compile"] = [compile_impl.build(case, tables, make_data(case, "cuda", seed_for(
                case.name, "torch-compile", str(i))), "forward").fn for i in range(n_sets)]
        # the flat path against the tile on the first set (where the call allows the flat path at all)
        tile_fn = functools.partial(v4.rope_v4, datas[0].q, datas[0].k, cos, sin, out_q=outs[0][0],
                                    out_k=outs[0][1], positions=spec, rotary_dim=case.rotary,
                                    interleaved=case.interleaved)
        tile_fn(config=table._replace(flat=0))
        expected = [t.clone() for t in outs[0]]
        for label, flat_config in (("flat", table._replace(flat=1024, flat_warps=4)),
                                   ("paired flat", table._replace(flat=1024, flat_warps=4, flat_paired=True))):
            tile_fn(config=flat_config)
            torch.cuda.synchronize()
            err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], expected))
            print(f"{case.name}: {n_sets} buffer sets; {label} vs tile max abs difference {err:.2e}", flush=True)
        samples = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, fns in candidates.items():
                turn = itertools.cycle(fns)
                samples[name].append(graph_replay_us(lambda: next(turn)(), calls=2 * n_sets, reps=20))
        for name, values in samples.items():
            us = statistics.median(values)
            medians.setdefault(case.name, {})[name] = us
            pct = case.moved_bytes(False) / (us * 1e-6) / 1e9 / ceiling * 100
            print(f"flat {case.name:18s} {name:16s} {us:7.2f} us ({pct:5.1f}%)  range {min(values):.2f}-"
                  f"{max(values):.2f}", flush=True)
        del datas, outs, candidates
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "ceiling_gbps": ceiling, "ballast_gb": len(ballast),
                       "rounds": args.rounds, "median_us": medians}, f, indent=1)


if __name__ == "__main__":
    main()
