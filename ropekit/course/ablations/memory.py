"""Memory-system experiments: Little's law on a plain copy, and coalescing on one RoPE kernel."""

from __future__ import annotations

from dataclasses import replace

import torch

from ... import frequencies
from ...triton import v2
from .. import perf_model
from .kernels import copy_blocks
from .registry import experiment

# Program sizes of the copy sweep, in float32 elements (256 B to 64 KiB a program).
COPY_BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@experiment("littles_law", "How many bytes in flight per SM does a copy need to reach the ceiling?")
def littles_law(lab) -> dict:
    """A Triton copy whose programs each move BLOCK float32 elements (4 warps): the bytes in flight per SM grow
    with BLOCK until the bus, not the latency, is the limit. Fits the model's latency (perf_model.fit_latency_ns)
    and then gives each point the model's prediction with that latency."""
    (n,) = lab.shape((1 << 26,), (1 << 12,))  # 256 MiB per buffer on a GPU: a copy's working set far beyond L2
    src, dst = lab.randn((n,)), torch.empty(n, device=lab.device)
    rows = [lab.time(f"copy, {block * 4} B a program", lambda block=block: copy_blocks(src, dst, block),
                     2 * src.nbytes, perf_model.Launch(-(-n // block), 4, block * 4), block_elements=block)
            for block in COPY_BLOCKS]
    rows.append(lab.time("torch copy_", lambda: dst.copy_(src), 2 * src.nbytes))
    points = [(r["bytes_in_flight_per_sm"], r["gbps"]) for r in rows if "bytes_in_flight_per_sm" in r]
    latency = perf_model.fit_latency_ns(points, lab.model.n_sms, lab.ceiling["gbps"]) if lab.on_gpu else None
    fit = {"latency_ns": latency, "points_used": sum(1 for _, g in points if g < 0.7 * lab.ceiling["gbps"])}
    if latency:
        lab.model = replace(lab.model, latency_ns=latency, latency_source="fitted on the copy sweep of the same run")
        for r in rows:
            if "bytes_in_flight_per_sm" in r:
                r["predicted_pct"] = 100.0 * min(1.0, r["bytes_in_flight_per_sm"]
                                                 / lab.model.needed_bytes_in_flight_per_sm)
    fit["needed_bytes_in_flight_per_sm"] = lab.model.needed_bytes_in_flight_per_sm
    return {"rows": rows, "fit": fit}


@experiment("coalescing", "Same kernel, same bytes: what do lanes that are not adjacent in memory cost?")
def coalescing(lab) -> dict:
    """v2 on one float32 q in three memory orders. bshd and sbhd both keep a head vector's channels adjacent (the
    control: only the order of whole rows differs); "transposed q" stores (batch, seq, head_dim, heads), so a
    program's lanes are ``heads`` elements apart and each 4-byte load needs a 32-byte sector of its own."""
    batch, seq, heads, head_dim = lab.shape((4, 4096, 32, 128), (1, 4, 4, 16))
    cos, sin = frequencies.cos_sin_table(seq, head_dim, device=lab.device)
    memories = {
        "bshd (adjacent channels)": (lab.randn((batch, seq, heads, head_dim)), lambda m: m),
        "sbhd (adjacent channels, rows reordered)": (lab.randn((seq, batch, heads, head_dim)),
                                                     lambda m: m.transpose(0, 1)),
        "transposed q (channels `heads` apart)": (lab.randn((batch, seq, head_dim, heads)),
                                                  lambda m: m.transpose(2, 3)),
    }
    rows = []
    for variant, (memory, view_of) in memories.items():
        x = view_of(memory)
        out = view_of(torch.empty_like(memory))
        stride_bytes = x.stride(3) * x.element_size()
        touched, useful = perf_model.sectors_per_access(32, stride_bytes, x.element_size())
        launch = perf_model.row_launch(batch * seq * heads, head_dim, x.element_size())
        rows.append(lab.time(variant, lambda x=x, out=out: v2.rope_v2(x, cos, sin, out), 2 * x.nbytes, launch,
                             channel_stride_bytes=stride_bytes, sectors_per_warp_load=touched,
                             sectors_if_adjacent=useful))
    return {"rows": rows}
