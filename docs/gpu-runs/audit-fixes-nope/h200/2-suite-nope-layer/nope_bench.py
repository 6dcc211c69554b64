"""A Llama 4 NoPE layer's pre-processing on the GPU: rope_and_cache(..., nope_temperature=(8192, 0.1)) against the
unfused chain a user would write (apply_rope's NoPE in place on q, then index_copy_ of k and v into the paged cache),
against torch.compile of that chain written in PyTorch, and against rope_and_cache's rotation on the same shapes;
Llama-4-Scout heads (40 q, 8 kv, head_dim 128), bf16, a shuffled paged cache. Graph replay of each, interleaved
rounds (ropekit.bench.timing.GpuTimer), fresh random inputs in DRAM-sized buffer sets, checked against the float64
reference first; % of the byte floor (q read and written, k and v read, their cache rows written; positions and
slots not counted) at the copy ceiling measured in the same run."""
import math
import sys

import torch

import ropekit
from ropekit import reference as ref
from ropekit.bench.timing import DryRunTimer, GpuTimer, Settings

torch.manual_seed(0)
GPU = torch.cuda.is_available()  # without one: a dry run of the checks at small sizes (the interpreter)
timer = GpuTimer(Settings(graph_rounds=7, graph_ms=60.0)) if GPU else DryRunTimer()
ceiling = timer.copy_ceiling()["gbps"] if GPU else 1000.0
print(f"{torch.cuda.get_device_name() if GPU else 'dry run'}, copy ceiling {ceiling:.0f} GB/s")
HQ, HK, D, BLOCK = (40, 8, 128, 16) if GPU else (4, 2, 16, 4)
dev = torch.device("cuda" if GPU else "cpu")
for name, batch, seq in (("decode b64", 64, 1), ("prefill b4 s4096", 4, 4096)) if GPU else (("decode", 4, 1),
                                                                                           ("prefill", 2, 8)):
    tokens = batch * seq
    n_blocks = math.ceil(tokens / BLOCK) + 8
    floor_bytes = tokens * D * 2 * (2 * HQ + 2 * HK + 2 * HK)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if GPU else 0
    sets = max(1, math.ceil(4 * l2 / floor_bytes)) if seq > 1 else 1
    cos, sin = ropekit.cos_sin_table(32768, D, device=dev)
    data = []
    for _ in range(sets):
        qkv = torch.randn(tokens, (HQ + 2 * HK) * D, device=dev, dtype=torch.bfloat16)
        q, k, v = (t.view(batch, seq, -1, D) for t in qkv.split([HQ * D, HK * D, HK * D], -1))
        caches = [torch.zeros(n_blocks, BLOCK, HK, D, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        slots = torch.randperm(n_blocks * BLOCK, device=dev)[:tokens]
        offsets = torch.randint(0, 20000, (batch,), device=dev) if seq == 1 else torch.zeros(batch, dtype=torch.long,
                                                                                              device=dev)
        data.append((q, k, v, caches, slots, offsets))

    def fused(d, nope=True):
        q, k, v, caches, slots, offsets = d
        extra = dict(nope_temperature=(8192, 0.1)) if nope else dict(cos=cos, sin=sin)
        return lambda: ropekit.rope_and_cache(q, k, v, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots,
                                              positions=offsets, inplace=True, **extra)

    def unfused(d):
        q, k, v, caches, slots, offsets = d
        flat = [c.view(-1, HK, D) for c in caches]

        def call():
            ropekit.apply_rope(q, None, positions=offsets, inplace=True, nope_temperature=(8192, 0.1))
            flat[0].index_copy_(0, slots, k.reshape(-1, HK, D))
            flat[1].index_copy_(0, slots, v.reshape(-1, HK, D))
        return call

    def chain(q, k, v, offsets, slots, f0, f1):
        pos = offsets[:, None] + torch.arange(q.shape[1], device=q.device)
        temp = torch.log(torch.floor((pos + 1).double() / 8192) + 1) * 0.1 + 1
        q.copy_((q.float() * temp.float()[..., None, None]).to(q.dtype))
        f0.index_copy_(0, slots, k.reshape(-1, HK, D))
        f1.index_copy_(0, slots, v.reshape(-1, HK, D))
    compiled = torch.compile(chain, dynamic=False)

    def compiled_call(d):
        q, k, v, caches, slots, offsets = d
        flat = [c.view(-1, HK, D) for c in caches]
        return lambda: compiled(q, k, v, offsets, slots, *flat)

    # the check: every implementation's q and cache rows against the float64 reference, on fresh copies
    q0, k0, v0, caches0, slots0, offsets0 = data[0]
    pos = (offsets0[:, None] + torch.arange(seq, device=dev)).cpu()
    want_q = ref.nope_temperature(q0, pos, 8192, 0.1)
    for label, build in (("fused", fused), ("unfused", unfused), ("torch.compile", compiled_call)):
        keep = q0.clone(), [c.clone() for c in caches0]
        build(data[0])()
        torch.cuda.synchronize() if GPU else None
        err = (q0.double().cpu() - want_q).abs().max().item()
        ok_cache = torch.equal(caches0[0].view(-1, HK, D)[slots0], k0.reshape(-1, HK, D)) and \
            torch.equal(caches0[1].view(-1, HK, D)[slots0], v0.reshape(-1, HK, D))
        print(f"  check {name} {label}: q max error {err:.3g}, caches exact {ok_cache}")
        if not ok_cache or err > 0.02 * want_q.abs().max().item():
            sys.exit(f"{label} wrong")
        q0.copy_(keep[0])
        for c, kc in zip(caches0, keep[1]):
            c.copy_(kc)
    floor_us = floor_bytes / (ceiling * 1e3)
    rows = [("rope_and_cache NoPE (fused)", [fused(d) for d in data]),
            ("apply_rope NoPE in place + index_copy_ x2", [unfused(d) for d in data]),
            ("torch.compile of the chain", [compiled_call(d) for d in data]),
            ("rope_and_cache rotation (same shapes)", [fused(d, nope=False) for d in data])]
    if not GPU:
        continue
    graphs = [timer.capture(fns, floor_us) for _, fns in rows]
    results = timer.replay_rounds(graphs)
    print(f"{name}: byte floor {floor_bytes / 1e6:.2f} MB ({floor_us:.2f} us), {sets} buffer sets")
    fused_us = results[0][0]
    for (label, _), (us, spread, calls) in zip(rows, results):
        print(f"  {label:45s} {us:9.2f} us  {100 * floor_us / us:5.1f} % of floor  x{us / fused_us:5.2f} fused "
              f"(spread {spread:.3f}, {calls} calls a graph)")
