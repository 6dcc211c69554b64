"""Time the ladder's steps against the copy ceiling on one shape (GPU only; the interpreter is never timed)."""

from __future__ import annotations

import torch

from ...frequencies import cos_sin_table
from .. import measure
from . import STEPS, step
from .launch import bytes_moved, rope_ladder

__all__ = ["LLAMA3_8B_PREFILL", "measure_steps"]

# Llama-3-8B prefill (the benchmark's main case): batch 4, 4096 tokens, 32 q heads and 8 k heads of 128, bf16.
LLAMA3_8B_PREFILL = (4, 4096, 32, 8, 128, torch.bfloat16)


def measure_steps(shape=LLAMA3_8B_PREFILL, *, timer=None, device="cuda") -> list[dict]:
    """For each step: its median time, GB/s of q and k moved and share of the copy ceiling
    (:func:`ropekit.course.measure.time_launch`, one ceiling for every step), on fresh random inputs far larger than
    the L2 cache. Each step runs with positions 0..seq-1 and nothing else switched on, so the steps differ only in
    the code they compile."""
    batch, seq, heads_q, heads_k, head_dim, dtype = shape
    q = torch.randn(batch, seq, heads_q, head_dim, device=device).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, device=device).to(dtype)
    cos, sin = cos_sin_table(max(seq, 64), head_dim, device=device)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    rows = []
    for name in STEPS:
        kernel = step(name).KERNEL

        def run(kernel=kernel):
            rope_ladder(kernel, q, k, cos, sin, out_q=out_q, out_k=out_k)

        run()  # compile outside the timing
        measured = measure.time_launch(run, bytes_moved(q, k), label=name, timer=timer)
        rows.append({"step": name, "time_us": measured.time_us, "gbps": measured.gbps, "share": measured.share,
                     "ceiling_gbps": measured.ceiling_gbps})
    return rows
