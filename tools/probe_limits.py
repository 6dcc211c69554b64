"""What limits the large cases: the same bytes copied, v4 tile layouts, the CUDA launch shapes and the peers, all
timed as CUDA-graph replays in one process (run on the H100; prints tables and writes JSON).

    python tools/probe_limits.py [--out probe.json] [--cases llama3-8b-prefill,fp32]

Per case: the copy ceiling (1 GiB), the **same-bytes floor** (q and k copied to fresh outputs: torch's copy kernel,
and one Triton launch that copies both with 16-byte vectors), v4 under a set of launch configurations (out of place
and in place), the CUDA backend under a set of launch shapes, torch.compile of the eager formula and Liger (in place,
when importable). Every timing: graphs of back-to-back calls on inputs far larger than L2 (DRAM), median of replays.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

import ropekit
from ropekit.bench.impls import hf_formula
from ropekit.positions import resolve_positions
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig
from tune_v4 import graph_replay_us  # tools/ is on sys.path when this file runs as a script

CASES = {
    # name: (batch, seq, hq, hk, head_dim, rotary_dim, dtype, interleaved, inplace)
    "llama3-8b-prefill": (4, 4096, 32, 8, 128, 128, torch.bfloat16, False, False),
    "mha-fp16": (8, 2048, 64, 64, 128, 128, torch.float16, False, False),
    "fp32": (2, 2048, 32, 32, 64, 64, torch.float32, False, False),
    "gptj-interleaved": (4, 4096, 32, 8, 128, 128, torch.bfloat16, True, False),
    "partial-rotary": (4, 4096, 32, 8, 128, 64, torch.bfloat16, False, False),
    "partial-rotary-inplace": (4, 4096, 32, 8, 128, 64, torch.bfloat16, False, True),
}

V4_CONFIGS = [
    LaunchConfig(16, 1, 8, evict_first=True),
    LaunchConfig(16, 1, 4, evict_first=True),
    LaunchConfig(8, 2, 8, evict_first=True),
    LaunchConfig(1, 32, 8, evict_first=True),
    LaunchConfig(1, 1, 4, fused_qk=True),
    LaunchConfig(1, 1, 8, fused_qk=True),
    LaunchConfig(1, 1, 4, fused_qk=True, evict_first=True),
    LaunchConfig(1, 1, 8, fused_qk=True, evict_first=True),
    LaunchConfig(2, 1, 8, fused_qk=True, evict_first=True),
    LaunchConfig(2, 1, 16, fused_qk=True, evict_first=True),
    LaunchConfig(4, 1, 16, fused_qk=True, evict_first=True),
]

CUDA_SHAPES = [(0, 0), (128, 0), (512, 0), (1024, 0), (256, 128), (512, 256), (1024, 1024)]


@triton.jit
def _flat_copy(SRC_A, DST_A, n_a, SRC_B, DST_B, n_b, blocks_a, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < blocks_a:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_a
        tl.store(DST_A + offs, tl.load(SRC_A + offs, mask=mask), mask=mask)
    else:
        offs = (pid - blocks_a) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_b
        tl.store(DST_B + offs, tl.load(SRC_B + offs, mask=mask), mask=mask)


def graph_us(fn, calls=6, replays=30):
    """Median per-call device time of `calls` back-to-back calls captured in one graph (inputs here exceed L2)."""
    return graph_replay_us(fn, calls=calls, reps=replays)


def copy_ceiling_gbps():
    n = 1 << 30
    src = torch.randint(0, 100, (n,), dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e3
    t_graph = graph_us(lambda: dst.copy_(src), calls=3, replays=20)
    del src, dst
    return 2 * n / (t * 1e-6) / 1e9, 2 * n / (t_graph * 1e-6) / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe.json"))
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    torch.manual_seed(0)
    ceiling, ceiling_graph = copy_ceiling_gbps()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "copy_ceiling_gbps": ceiling, "copy_ceiling_graph_gbps": ceiling_graph, "cases": {}}
    print(f"copy ceiling {ceiling:.0f} GB/s (do_bench), {ceiling_graph:.0f} GB/s (graph of 3 copies)", flush=True)
    try:
        from liger_kernel.ops.rope import rope_forward as liger_forward
    except Exception as error:  # optional peer
        liger_forward = None
        print("liger unavailable:", error)
    from ropekit import cuda as rcuda
    cuda_ok, cuda_why = rcuda.available()
    if not cuda_ok:
        print("ropekit.cuda unavailable:", cuda_why)
    for name in args.cases.split(","):
        b, s, hq, hk, d, rd, dtype, interleaved, inplace = CASES[name]
        q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype)
        oq, ok = torch.empty_like(q), torch.empty_like(k)
        cos_t, sin_t = ropekit.cos_sin_table(s, rd, device="cuda")
        spec = resolve_positions(batch=b, seqlen=s, positions=None)
        moved = 2 * (q.numel() + k.numel()) * q.element_size() * (rd / d if inplace else 1)
        rows = {}

        def record(label, us):
            rows[label] = {"us": us, "gbps": moved / (us * 1e-6) / 1e9, "pct": moved / (us * 1e-6) / 1e9 / ceiling * 100}
            print(f"  {name:24s} {label:58s} {us:8.1f} us  {rows[label]['pct']:5.1f}%", flush=True)

        print(f"{name}: {moved / 1e6:.1f} MB moved", flush=True)
        if not inplace:
            record("floor: torch copy_ of q and k", graph_us(lambda: (oq.copy_(q), ok.copy_(k))))
            n_a, n_b = q.numel(), k.numel()
            block = 4096
            blocks_a = triton.cdiv(n_a, block)
            grid = (blocks_a + triton.cdiv(n_b, block),)
            record("floor: one Triton copy launch (q then k)",
                   graph_us(lambda: _flat_copy[grid](q, oq, n_a, k, ok, n_b, blocks_a, BLOCK=block, num_warps=4)))
        for cfg in V4_CONFIGS:
            target_q, target_k = (q, k) if inplace else (oq, ok)
            try:
                us = graph_us(lambda: v4.rope_v4(q, k, cos_t, sin_t, out_q=target_q, out_k=target_k, positions=spec,
                                                 rotary_dim=rd, interleaved=interleaved, copy_tail=not inplace,
                                                 config=cfg))
            except Exception as error:
                print(f"  {name} {cfg}: {type(error).__name__}: {str(error)[:150]}")
                continue
            record(f"v4 {'inplace ' if inplace else ''}{tuple(cfg)}", us)
        default = v4.launch_config(b * s, hq, hk, d, rd, element_size=q.element_size())
        record(f"v4 default {tuple(default)}",
               graph_us(lambda: v4.rope_v4(q, k, cos_t, sin_t, out_q=q if inplace else oq, out_k=k if inplace else ok,
                                           positions=spec, rotary_dim=rd, interleaved=interleaved,
                                           copy_tail=not inplace)))
        if not inplace and not interleaved:
            # the in-place form of the same case, for the in-place peers (Liger)
            for cfg in (default, LaunchConfig(1, 1, 8, fused_qk=True, evict_first=True)):
                record(f"v4 inplace {tuple(cfg)}",
                       graph_us(lambda: v4.rope_v4(q, k, cos_t, sin_t, out_q=q, out_k=k, positions=spec,
                                                   rotary_dim=rd, config=cfg)))
        if cuda_ok:
            for shape in CUDA_SHAPES:
                rcuda.LAUNCH_TUNING.update(block_threads_target=shape[0], row_threads_cap=shape[1])
                record(f"cuda {'inplace ' if inplace else ''}block_target={shape[0]} row_cap={shape[1]}",
                       graph_us(lambda: rcuda.rope_cuda(q, k, cos_t, sin_t, out_q=q if inplace else oq,
                                                        out_k=k if inplace else ok, positions=spec, rotary_dim=rd,
                                                        interleaved=interleaved, copy_tail=not inplace)))
            rcuda.LAUNCH_TUNING.update(block_threads_target=0, row_threads_cap=0)
        if not interleaved and rd == d and not inplace:
            positions = torch.arange(s, device="cuda")
            cos_full = torch.cat((cos_t, cos_t), -1)[positions][None].to(dtype)  # (1, s, d): transformers' rows
            sin_full = torch.cat((sin_t, sin_t), -1)[positions][None].to(dtype)
            compiled = torch.compile(hf_formula(d, d, interleaved=False, unsqueeze_dim=2))
            record("torch.compile", graph_us(lambda: compiled(q, k, cos_full, sin_full)))
        if liger_forward is not None and not interleaved and (rd == d or inplace):
            hf_cos = torch.cat((cos_t, cos_t), -1)[None].to(dtype)
            hf_sin = torch.cat((sin_t, sin_t), -1)[None].to(dtype)
            kw = {} if rd == d else {"rotary_dim": rd}
            record("liger (in place)", graph_us(lambda: liger_forward(q.transpose(1, 2), k.transpose(1, 2), hf_cos,
                                                                        hf_sin, **kw)))
        results["cases"][name] = {"moved_bytes": moved, "rows": rows}
        del q, k, oq, ok
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
