"""Three questions the benchmark's unmet targets raised, answered in one process on the GPU (prints tables, writes
JSON to $OUT/probe_host_l2.json):

1. **Host path.** What an eager call costs the host: ``apply_rope`` (cached plan, and with the cache switched off),
   the v4 launcher, Liger; plus a profile of ``apply_rope`` for a decode step.
2. **L2 carry-over on the large cases.** In a graph of back-to-back calls on one buffer set, an in-place kernel on
   67 MB (fp32) can find part of its input still in the 50 MB L2 from the previous call; a kernel with a streaming
   hint cannot. Each large case is timed with one buffer set and with sets rotating past 4x L2.
3. **Graph sizing for the small cases.** Per-call time of graphs holding 8..512 calls, one buffer set (L2) and
   rotating sets (DRAM), so that the harness can size its graphs by device work, not by a host-bound estimate.
4. **v4 tiles for the small cases** (L2 graph replay), against Liger.

5. **Large-case tiles** (fp32, MHA) against torch.compile and a one-launch copy; **small-case tiles on Liger's
   inputs** (per-token rows).

6. **Arithmetic** (``math``): the small cases' v4 tiles computing in fp32 (ropekit's) and in the input dtype
   (Liger's), against Liger.

    python tools/probe_host_l2.py [--parts host,l2,graph,tiles,large_tiles,rows_tiles,math]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import itertools
import json
import math
import os
import pstats
import statistics
import time

import torch

from ropekit import api
from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables, seed_for
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig
from tune_v4 import graph_replay_us  # tools/ is on sys.path when this file runs as a script

OUT = os.environ.get("OUT", ".")


def graph_calls_us(fns, calls: int, replays: int = 30) -> float:
    """Median per-call device time of a graph of exactly ``calls`` calls cycling through ``fns`` (buffer sets)."""
    turn = itertools.cycle(fns)
    return graph_replay_us(lambda: next(turn)(), calls=calls, reps=replays)


def eager_us(fn, n: int = 2000, rounds: int = 7) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def builders(case, names):
    tables = make_tables(case, "cuda")
    impls = {impl.name: impl for impl in make_impls(".peers") if impl.name in names}
    out = {}
    for name, impl in impls.items():
        if impl.available() is None and impl.supports(case, "forward") is None:
            out[name] = lambda seed, impl=impl: impl.build(case, tables, make_data(case, "cuda", seed), "forward")
    return out, tables


def part_host(results):
    rows = {}
    for case in select_cases(names=["decode", "small-prefill"]):
        make, _ = builders(case, {"liger", "triton-v4", "ropekit", "ropekit-inplace"})
        for name, build in make.items():
            prepared = build(seed_for(case.name, name))
            rows[f"{case.name} {name}"] = eager_us(prepared.fn)
        # the API with its plan cache switched off: what every call cost before the cache
        real_signature = api._signature
        api._signature = lambda *args: None
        try:
            rows[f"{case.name} ropekit (no plan cache)"] = eager_us(make["ropekit"](1).fn)
            rows[f"{case.name} ropekit-inplace (no plan cache)"] = eager_us(make["ropekit-inplace"](1).fn)
        finally:
            api._signature = real_signature
        # an empty launch's worth of host work, for scale
        x = torch.empty(1, device="cuda")
        rows[f"{case.name} torch add_ (one tiny op)"] = eager_us(lambda: x.add_(1))
        if case.name == "decode":
            fn = make["ropekit"](2).fn
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(3000):
                fn()
            profile.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
            print(text.getvalue()[-3500:])
    for label, us in rows.items():
        print(f"host  {label:48s} {us:8.1f} us", flush=True)
    results["host_eager_us"] = rows


def part_l2(results, timer, l2_bytes):
    rows = {}
    for case in select_cases(names=["fp32", "llama3-8b-prefill", "mha-fp16"]):
        make, tables = builders(case, {"liger", "ropekit", "ropekit-inplace", "triton-v4"})
        n_sets = max(2, math.ceil(4 * l2_bytes / case.qk_bytes) + 1)
        for name, build in make.items():
            sets = [build(seed_for(case.name, name, str(i))) for i in range(n_sets)]
            one = graph_calls_us([sets[0].fn], calls=8)
            rotating = graph_calls_us([p.fn for p in sets], calls=2 * n_sets)
            rows[f"{case.name} {name}"] = {"one_set_us": one, "rotating_us": rotating, "sets": n_sets,
                                           "bytes": case.moved_bytes(sets[0].inplace)}
            del sets
            torch.cuda.empty_cache()
        # v4 in place without the streaming hint: does L2 carry-over explain an in-place kernel beating a copy?
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=None)
        datas = [make_data(case, "cuda", 100 + i) for i in range(n_sets)]
        for config in (v4.launch_config(case.n_tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary,
                                        element_size=case.element_size),
                       LaunchConfig(2, 1, 16, fused_qk=True, evict_first=False),
                       LaunchConfig(1, 1, 4, fused_qk=True, evict_first=False)):
            fns = [lambda d=d: v4.rope_v4(d.q, d.k, tables.cos_half, tables.sin_half, out_q=d.q, out_k=d.k,
                                          positions=spec, rotary_dim=case.rotary, copy_tail=False, config=config)
                   for d in datas]
            rows[f"{case.name} v4 in place {tuple(config)}"] = {
                "one_set_us": graph_calls_us(fns[:1], calls=8), "rotating_us": graph_calls_us(fns, calls=2 * n_sets),
                "sets": n_sets, "bytes": case.moved_bytes(True)}
        outs = [(torch.empty_like(d.q), torch.empty_like(d.k)) for d in datas]
        copies = [lambda d=d, o=o: (o[0].copy_(d.q), o[1].copy_(d.k)) for d, o in zip(datas, outs)]
        rows[f"{case.name} torch copy_ q,k"] = {"one_set_us": graph_calls_us(copies[:1], calls=8),
                                                "rotating_us": graph_calls_us(copies, calls=2 * n_sets),
                                                "sets": n_sets, "bytes": case.moved_bytes(False)}
        flat = [torch.cat((d.q.flatten(), d.k.flatten())) for d in datas]
        flat_out = [torch.empty_like(f) for f in flat]
        flat_copies = [lambda f=f, o=o: o.copy_(f) for f, o in zip(flat, flat_out)]
        rows[f"{case.name} torch copy_ one flat buffer"] = {
            "one_set_us": graph_calls_us(flat_copies[:1], calls=8),
            "rotating_us": graph_calls_us(flat_copies, calls=2 * n_sets), "sets": n_sets,
            "bytes": case.moved_bytes(False)}
        del datas, outs, flat, flat_out, copies, flat_copies
        torch.cuda.empty_cache()
    ceiling = results["ceiling_gbps"]
    for label, row in rows.items():
        row["one_set_pct"] = row["bytes"] / (row["one_set_us"] * 1e-6) / 1e9 / ceiling * 100
        row["rotating_pct"] = row["bytes"] / (row["rotating_us"] * 1e-6) / 1e9 / ceiling * 100
        print(f"l2    {label:58s} one set {row['one_set_us']:7.1f} us ({row['one_set_pct']:5.1f}%)  "
              f"{row['sets']} sets {row['rotating_us']:7.1f} us ({row['rotating_pct']:5.1f}%)", flush=True)
    results["large_l2_carry_over"] = rows


def part_graph(results, l2_bytes):
    rows = {}
    for case in select_cases(names=["decode", "small-prefill"]):
        make, _ = builders(case, {"liger", "triton-v4", "ropekit", "ropekit-inplace"})
        n_sets = math.ceil(4 * l2_bytes / case.working_set_bytes) + 1
        for name, build in make.items():
            sets = [build(seed_for(case.name, name, str(i))) for i in range(n_sets)]
            for calls in (8, 32, 128, 512):
                rows[f"{case.name} {name} L2 calls={calls}"] = graph_calls_us([sets[0].fn], calls)
            for calls in (n_sets, 2 * n_sets):
                rows[f"{case.name} {name} DRAM({n_sets} sets) calls={calls}"] = graph_calls_us(
                    [p.fn for p in sets], calls)
            del sets
            torch.cuda.empty_cache()
    for label, us in rows.items():
        print(f"graph {label:60s} {us:7.2f} us", flush=True)
    results["graph_sizing_us"] = rows


def part_tiles(results):
    rows = {}
    configs = [LaunchConfig(1, 4, 4), LaunchConfig(1, 8, 4), LaunchConfig(1, 32, 4), LaunchConfig(1, 4, 2),
               LaunchConfig(1, 8, 2), LaunchConfig(1, 1, 4, fused_qk=True), LaunchConfig(1, 1, 8, fused_qk=True),
               LaunchConfig(2, 1, 4, fused_qk=True), LaunchConfig(2, 16, 4), LaunchConfig(2, 8, 4),
               LaunchConfig(4, 8, 4), LaunchConfig(2, 1, 8, fused_qk=True), LaunchConfig(4, 1, 8, fused_qk=True),
               LaunchConfig(4, 1, 16, fused_qk=True)]
    for case in select_cases(names=["decode", "small-prefill"]):
        tables = make_tables(case, "cuda")
        data = make_data(case, "cuda", 3)
        out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=tables.offsets)
        default = v4.launch_config(case.n_tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary,
                                   element_size=case.element_size)
        for config in [default] + configs:
            fn = lambda: v4.rope_v4(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k,  # noqa: E731
                                    positions=spec, rotary_dim=case.rotary, config=config)
            label = f"{case.name} v4 {tuple(config)}{' (default)' if config == default else ''}"
            rows[label] = graph_calls_us([fn], 128)
        make, _ = builders(case, {"liger"})
        if "liger" in make:
            rows[f"{case.name} liger"] = graph_calls_us([make["liger"](5).fn], 128)
    for label, us in rows.items():
        print(f"tiles {label:60s} {us:7.2f} us", flush=True)
    results["small_tiles_l2_us"] = rows


def part_math(results):
    """What the small prefill's gap to Liger is made of: v4 with its fp32 arithmetic against v4 forced to compute in
    the input dtype (bf16, Liger's arithmetic; not an API option), same tiles, L2 graph replay, plus each variant's
    worst per-token error against the float32 rotation (the harness's check)."""
    import triton.language as tl

    from ropekit.bench.inputs import check_outputs, expected_output

    rows, errors = {}, {}
    configs = [None, LaunchConfig(1, 8, 4), LaunchConfig(2, 8, 4), LaunchConfig(1, 1, 8, fused_qk=True)]
    for case in select_cases(names=["small-prefill", "decode"]):
        tables = make_tables(case, "cuda")
        data = make_data(case, "cuda", 3)
        out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=tables.offsets)
        expected = [expected_output(case, tables, x) for x in (data.q, data.k)]
        for math_name in ("fp32", "input dtype"):
            if math_name == "fp32":
                v4._MATH_DTYPE.pop(case.dtype, None)
            else:
                v4._MATH_DTYPE[case.dtype] = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[case.dtype]
            for config in configs:
                fn = lambda: v4.rope_v4(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q,  # noqa: E731
                                        out_k=out_k, positions=spec, rotary_dim=case.rotary, config=config)
                label = f"{case.name} v4 {math_name} math {tuple(config) if config else 'default tile'}"
                fn()
                torch.cuda.synchronize()
                errors[label] = check_outputs(case, (out_q, out_k), expected)[0]
                rows[label] = graph_calls_us([fn], 128)
        v4._MATH_DTYPE.pop(case.dtype, None)
        make, _ = builders(case, {"liger"})
        if "liger" in make:
            prepared = make["liger"](5)
            rows[f"{case.name} liger"] = graph_calls_us([prepared.fn], 128)
    for label, us in rows.items():
        error = f"  error {errors[label]:.2e}" if label in errors else ""
        print(f"math {label:60s} {us:7.2f} us{error}", flush=True)
    results["math_l2_us"], results["math_errors"] = rows, errors


def part_large_tiles(results):
    """fp32 and MHA: v4 tiles against torch.compile and the same bytes copied in one launch, three rounds each
    (interleaved, so that drift shows as spread), buffer sets rotating."""
    rows = {}
    grid = {
        "fp32": [(1, 1, 4, True, True), (2, 1, 4, True, True), (2, 1, 8, True, True), (2, 1, 16, True, True),
                 (2, 1, 16, True, False), (4, 1, 8, True, True), (4, 1, 16, True, True), (8, 1, 16, True, True),
                 (16, 1, 4, False, True), (32, 1, 4, False, True), (4, 8, 4, False, True), (2, 32, 8, False, True),
                 (1, 32, 4, False, True), (8, 4, 8, False, True)],
        "mha-fp16": [(1, 1, 8, True, True), (1, 1, 16, True, True), (2, 1, 16, True, True), (2, 1, 16, True, False),
                     (2, 1, 32, True, True), (1, 64, 8, False, True), (4, 16, 8, False, True),
                     (16, 1, 4, False, True), (8, 8, 8, False, True)],
    }
    from ropekit.bench.runner import dram_sets

    grid["fp32"] += [(1, 1, 8, True, True), (1, 1, 16, True, True), (2, 1, 32, True, True), (4, 1, 32, True, True),
                     (1, 1, 8, True, False), (4, 1, 16, True, False), (1, 32, 8, False, True), (4, 32, 8, False, True)]
    if TILES:
        grid = {name: list(TILES) for name in LARGE_CASES}
    for case in select_cases(names=[n for n in grid if n in LARGE_CASES]):
        # as many buffer sets as the harness rotates (docs/gpu-runs/run21: fewer let L2 carry lines over)
        n_sets = dram_sets(case, torch.cuda.get_device_properties(0).L2_cache_size, 4.0)
        make, tables = builders(case, {"torch-compile", "liger", "ropekit"})
        sets = {name: [build(seed_for(case.name, name, str(i))) for i in range(n_sets)] for name, build in make.items()}
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=None)
        datas = [make_data(case, "cuda", 200 + i) for i in range(n_sets)]
        outs = [(torch.empty_like(d.q), torch.empty_like(d.k)) for d in datas]
        flat = [torch.cat((d.q.flatten(), d.k.flatten())) for d in datas]
        flat_out = [torch.empty_like(f) for f in flat]
        candidates = {name: [p.fn for p in prepared] for name, prepared in sets.items()}
        candidates["copy, one launch"] = [lambda f=f, o=o: o.copy_(f) for f, o in zip(flat, flat_out)]
        for shape in grid[case.name]:
            config = LaunchConfig(*shape)
            candidates[f"v4 {shape}"] = [
                lambda d=d, o=o, config=config: v4.rope_v4(d.q, d.k, tables.cos_half, tables.sin_half, out_q=o[0],
                                                           out_k=o[1], positions=spec, rotary_dim=case.rotary,
                                                           config=config) for d, o in zip(datas, outs)]
        samples = {name: [] for name in candidates}
        for _ in range(3):
            for name, fns in candidates.items():
                samples[name].append(graph_calls_us(fns, calls=2 * n_sets, replays=20))
        for name, values in samples.items():
            rows[f"{case.name} {name}"] = {"median_us": statistics.median(values), "min_us": min(values),
                                           "max_us": max(values), "bytes": case.moved_bytes(False)}
        del sets, datas, outs, flat, flat_out, candidates
        torch.cuda.empty_cache()
    ceiling = results["ceiling_gbps"]
    for label, row in rows.items():
        row["pct"] = row["bytes"] / (row["median_us"] * 1e-6) / 1e9 / ceiling * 100
        print(f"ltile {label:44s} {row['median_us']:7.1f} us ({row['pct']:5.1f}%)  range {row['min_us']:.1f}-"
              f"{row['max_us']:.1f}", flush=True)
    results["large_tiles"] = rows


def part_rows_tiles(results):
    """Decode and small prefill on Liger's inputs (per-token cos/sin rows), v4 tiles, L2 graph replay."""
    rows = {}
    configs = [LaunchConfig(1, 4, 4), LaunchConfig(1, 8, 4), LaunchConfig(1, 32, 4), LaunchConfig(1, 8, 2),
               LaunchConfig(1, 1, 4, fused_qk=True), LaunchConfig(1, 1, 2, fused_qk=True),
               LaunchConfig(2, 16, 4), LaunchConfig(2, 8, 4), LaunchConfig(1, 1, 8, fused_qk=True)]
    for case in select_cases(names=["decode", "small-prefill"]):
        make, tables = builders(case, {"liger", "ropekit-rows", "ropekit", "triton-v4"})
        data = make_data(case, "cuda", 4)
        cos_rows = tables.cos_rows.expand(case.batch, case.seqlen, -1)
        sin_rows = tables.sin_rows.expand(case.batch, case.seqlen, -1)
        spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=None)
        default = v4.launch_config(case.n_tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary,
                                   element_size=case.element_size)
        for config in [default] + configs:
            fn = functools.partial(v4.rope_v4, data.q, data.k, cos_rows, sin_rows, out_q=data.q, out_k=data.k,
                                   positions=spec, rotary_dim=case.rotary, cos_per_token=True, copy_tail=False,
                                   config=config)
            rows[f"{case.name} v4 rows in place {tuple(config)}{' (default)' if config == default else ''}"] = \
                graph_calls_us([fn], 256)
        for name, build in make.items():
            rows[f"{case.name} {name}"] = graph_calls_us([build(9).fn], 256)
    for label, us in rows.items():
        print(f"rows  {label:60s} {us:7.2f} us", flush=True)
    results["rows_tiles_l2_us"] = rows


LARGE_CASES = ("fp32", "mha-fp16")
TILES: tuple = ()  # --tiles: the large_tiles part's candidates for every case instead of its own lists


def main():
    global LARGE_CASES, TILES
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="host,l2,graph,tiles")
    parser.add_argument("--large-cases", default=",".join(LARGE_CASES), help="cases of the large_tiles part")
    parser.add_argument("--tiles", default="", help="large_tiles candidates, e.g. '1,16,4,F,T;2,1,32,T,T' "
                        "(block_s, block_h, warps, fused_qk, evict_first)")
    args = parser.parse_args()
    LARGE_CASES = tuple(args.large_cases.split(","))
    TILES = tuple(tuple(int(v) if v.isdigit() else v == "T" for v in tile.split(","))
                  for tile in args.tiles.split(";") if tile)
    timer = GpuTimer(Settings())
    l2_bytes, _ = timer.l2_bytes()
    ceiling = timer.copy_ceiling()
    import triton
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "l2_bytes": l2_bytes, "ceiling_gbps": ceiling["gbps"]}
    print(f"{results['gpu']} ceiling {ceiling['gbps']:.0f} GB/s, L2 {l2_bytes / 2**20:.0f} MiB", flush=True)
    parts = {"host": lambda: part_host(results), "l2": lambda: part_l2(results, timer, l2_bytes),
             "graph": lambda: part_graph(results, l2_bytes), "tiles": lambda: part_tiles(results),
             "large_tiles": lambda: part_large_tiles(results), "rows_tiles": lambda: part_rows_tiles(results),
             "math": lambda: part_math(results)}
    for part in args.parts.split(","):
        started = time.time()
        try:
            parts[part]()
        except Exception as error:  # noqa: BLE001  (keep the other parts' results)
            import traceback
            traceback.print_exc()
            results[f"{part}_error"] = f"{type(error).__name__}: {error}"
        print(f"[{part} took {time.time() - started:.0f} s]", flush=True)
        with open(os.path.join(OUT, f"probe_host_l2_{args.parts.replace(',', '_')}.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
