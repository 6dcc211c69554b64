"""Is a flat element-wise kernel (the structure torch.compile's Inductor generates for the rotate_half formula,
docs/gpu-runs/run22/inductor_fp32.txt) faster than v4's fused token tile on the large cases? A standalone Triton
kernel here, timed against v4's default launch and torch.compile in the harness's conditions (CUDA graphs, buffer
sets rotating past 4x L2, rounds interleaved). An experiment, not part of the package.

    python tools/flat_probe.py [--cases fp32,llama3-8b-prefill] [--rounds 5] [--ab]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import triton
import triton.language as tl

from ropekit import api
from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables, seed_for
from ropekit.bench.runner import dram_sets
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import v4
from tune_v4 import graph_replay_us  # tools/ is on sys.path when this file runs as a script


@triton.jit
def flat_rope_kernel(Q, K, OUT_Q, OUT_K, COS, SIN, n_q, n_k, n_q_blocks, seqlen, H_Q: tl.constexpr,
                     H_K: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    """Element e of q (programs < n_q_blocks) or of k: out[e] = x[e] cos - x[e + D/2] sin (first half of a head)
    or x[e] cos + x[e - D/2] sin (second half); the partner element comes from L1. Contiguous bshd, NeoX,
    positions 0..S-1."""
    pid = tl.program_id(0)
    is_q = pid < n_q_blocks
    if is_q:
        X, OUT = Q, OUT_Q
    else:
        X, OUT = K, OUT_K
    n = tl.where(is_q, n_q, n_k)
    H = tl.where(is_q, H_Q, H_K)
    e = tl.where(is_q, pid, pid - n_q_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = e < n
    d = e % D
    token = e // (D * H)
    position = token % seqlen
    first = d < D // 2
    pair = tl.where(first, d, d - D // 2)
    cos = tl.load(COS + position * (D // 2) + pair, mask=mask, eviction_policy="evict_last")
    sin = tl.load(SIN + position * (D // 2) + pair, mask=mask, eviction_policy="evict_last")
    x = tl.load(X + e, mask=mask).to(tl.float32)
    partner = tl.load(X + tl.where(first, e + D // 2, e - D // 2), mask=mask, eviction_policy="evict_last")
    out = x * cos + tl.where(first, -sin, sin) * partner.to(tl.float32)
    tl.store(OUT + e, out.to(OUT.dtype.element_ty), mask=mask)


def flat_rope(q, k, out_q, out_k, cos, sin, block, warps):
    n_q, n_k = q.numel(), k.numel()
    n_q_blocks = triton.cdiv(n_q, block)
    grid = (n_q_blocks + triton.cdiv(n_k, block),)
    flat_rope_kernel[grid](q, k, out_q, out_k, cos, sin, n_q, n_k, n_q_blocks, q.shape[1], q.shape[2], k.shape[2],
                           q.shape[3], BLOCK=block, num_warps=warps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="fp32,llama3-8b-prefill")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ab", action="store_true", help="v4's tile against v4's flat path (and their conjugates) "
                        "instead of the standalone flat kernel's block sizes")
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ceiling = GpuTimer(Settings()).copy_ceiling()["gbps"]  # the harness's ceiling (run26 used a 4-call graph: wrong)
    print(f"{torch.cuda.get_device_name()} ceiling {ceiling:.0f} GB/s", flush=True)
    impls = {i.name: i for i in make_impls(".peers")}
    for case in select_cases(names=args.cases.split(",")):
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
        if args.ab:
            # v4's own two paths for this shape, forward and conjugate (the backward), A/B in the same rounds
            table = v4.launch_config(case.n_tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary,
                                     element_size=case.element_size)
            for label, config in (("v4 tile", table._replace(flat=0)), ("v4 flat", table._replace(flat=2048)),
                                  ("v4 flat, no hint", table._replace(flat=2048, evict_first=False))):
                for conjugate in (False, True):
                    candidates[f"{label}{' conj' if conjugate else ''}"] = [
                        lambda d=d, o=o, c=config, j=conjugate: v4.rope_v4(
                            d.q, d.k, cos, sin, out_q=o[0], out_k=o[1], positions=spec, rotary_dim=case.rotary,
                            interleaved=case.interleaved, conjugate=j, config=c) for d, o in zip(datas, outs)]
        elif not case.interleaved:  # the standalone kernel pairs NeoX halves only
            for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 16)):
                candidates[f"flat {block}/{warps}w"] = [
                    lambda d=d, o=o, b=block, w=warps: flat_rope(d.q, d.k, o[0], o[1], cos, sin, b, w)
                    for d, o in zip(datas, outs)]
        compile_impl = impls["torch-compile"]
        if compile_impl.available() is None:
            candidates["torch-compile"] = [compile_impl.build(case, tables, make_data(case, "cuda", seed_for(
                case.name, "torch-compile", str(i))), "forward").fn for i in range(n_sets)]
        # correctness of the standalone flat kernel against v4 on the first set
        if not case.interleaved:
            candidates["v4 default"][0]()
            expected = [t.clone() for t in outs[0]]
            flat_rope(datas[0].q, datas[0].k, outs[0][0], outs[0][1], cos, sin, 1024, 4)
            torch.cuda.synchronize()
            err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], expected))
            print(f"{case.name}: {n_sets} buffer sets; flat vs v4 max abs difference {err:.2e}", flush=True)
        samples = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, fns in candidates.items():
                turn = itertools.cycle(fns)
                samples[name].append(graph_replay_us(lambda: next(turn)(), calls=2 * n_sets, reps=20))
        for name, values in samples.items():
            us = statistics.median(values)
            pct = case.moved_bytes(False) / (us * 1e-6) / 1e9 / ceiling * 100
            print(f"flat {case.name:18s} {name:16s} {us:7.2f} us ({pct:5.1f}%)  range {min(values):.2f}-"
                  f"{max(values):.2f}", flush=True)
        del datas, outs, candidates
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
