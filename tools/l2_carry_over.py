"""Why Liger's in-place fp32 rotation (b2 s2048 32x64) times faster than a copy of the same bytes in the benchmark.

    python tools/l2_carry_over.py time            # graph replays: back to back vs host sync between replays
    python tools/l2_carry_over.py calls NAME      # NAME's kernel 8 times back to back (for ncu; see below)

    ncu --cache-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
        python tools/l2_carry_over.py calls liger

The case's q and k hold 67 MB, the H100's L2 50 MB. An in-place kernel called again on the same buffers may find
part of them still in L2 (no cache flush in between), so DRAM moves fewer bytes than the nominal 134 MB; ncu's
DRAM byte counters (caches not flushed) show how many it actually moves, call after call.
"""

from __future__ import annotations

import statistics
import sys

import torch

from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables
from ropekit.positions import resolve_positions
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig
from tune_v4 import graph_of  # tools/ is on sys.path when this file runs as a script

CASE = select_cases(names=["fp32"])[0]


def functions():
    tables = make_tables(CASE, "cuda")
    impls = {impl.name: impl for impl in make_impls(".peers")}
    fns = {}
    for name in ("liger", "ropekit", "ropekit-inplace", "torch-compile"):
        if impls[name].available() is None:
            fns[name] = impls[name].build(CASE, tables, make_data(CASE, "cuda", 11), "forward").fn
    data = make_data(CASE, "cuda", 12)
    spec = resolve_positions(batch=CASE.batch, seqlen=CASE.seqlen, positions=None)
    no_hint = LaunchConfig(2, 1, 16, fused_qk=True, evict_first=False)
    fns["v4-inplace-no-evict-hint"] = lambda: v4.rope_v4(data.q, data.k, tables.cos_half, tables.sin_half,
                                                         out_q=data.q, out_k=data.k, positions=spec,
                                                         rotary_dim=CASE.rotary, copy_tail=False, config=no_hint)
    flat = torch.randn(CASE.qk_bytes // 4, device="cuda")
    flat_out = torch.empty_like(flat)
    fns["copy-one-launch"] = lambda: flat_out.copy_(flat)
    fns["add-inplace-one-launch"] = lambda: flat.mul_(1.0)  # in place, the same bytes: read + write of 67 MB
    return fns


def time_graph(fn, calls=7, replays=40, sync_between=False):
    graph = graph_of(fn, calls)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
        if sync_between:
            end.synchronize()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 / calls for s, e in events)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "time"
    fns = functions()
    if mode == "calls":
        fn = fns[sys.argv[2]]
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        return
    moved = CASE.moved_bytes(False)
    print(f"fp32 case: {moved / 1e6:.1f} MB moved per call; q+k {CASE.qk_bytes / 1e6:.1f} MB; "
          f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB")
    for name, fn in fns.items():
        back_to_back = time_graph(fn)
        synced = time_graph(fn, sync_between=True)
        print(f"{name:28s} back-to-back replays {back_to_back:6.1f} us   host sync between replays {synced:6.1f} us",
              flush=True)


if __name__ == "__main__":
    main()
