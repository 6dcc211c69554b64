"""The flat kernel, row-split (this tree) against the partner-loading one (.ab/ropekit_base), on the GPU: the
published DRAM cases forward and conjugate, the flat blocks around the model's, the streaming tile, in place (this
tree's flat kernel forced in place) and a torch copy of the same bytes. Graph replay of 10 calls cycling through
buffer sets larger than 4x the L2, interleaved rounds, one process."""
import json, os, statistics, sys
sys.path.insert(0, os.path.join(os.getcwd(), ".ab"))
import torch, triton
from ropekit.triton import launch as L, model, choice
from ropekit.triton.configs import FlatConfig, RopeShape
from ropekit.positions import resolve_positions
from ropekit.bench.timing import copy_ceiling
import ropekit_base.triton.launch as BL
from ropekit_base.triton.configs import FlatConfig as BFlat

dev = "cuda"
name = torch.cuda.get_device_name()
print(name, torch.__version__, triton.__version__, flush=True)
CALLS = 10
ceil = copy_ceiling()["gbps"]
print("ceiling", ceil, flush=True)
res = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "ceiling_gbps": ceil, "cases": {}}
L2 = torch.cuda.get_device_properties(0).L2_cache_size

CASES = {"llama3-8b": (4, 4096, 32, 8, 128, torch.bfloat16), "mha-fp16": (8, 2048, 64, 64, 128, torch.float16),
         "fp32": (2, 2048, 32, 32, 64, torch.float32)}


def graph(fn_list):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fn_list[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(CALLS):
            fn_list[i % len(fn_list)]()
    torch.cuda.synchronize()
    return g


def time_all(graphs, rounds=7, reps=15):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            g.replay()
            for _ in range(reps):
                a.record(); g.replay(); b.record(); b.synchronize()
                samples[k].append(a.elapsed_time(b) * 1e3 / CALLS)
    return {k: statistics.median(v) for k, v in samples.items()}


def reference(x, cos, sin, conj):
    x32 = x.float(); D = x.shape[-1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    s = -s if conj else s
    a, b = x32[..., :D // 2], x32[..., D // 2:]
    return torch.cat((a * c - b * s, b * c + a * s), -1)


for cname, (B, S, HQ, HK, D, dt) in CASES.items():
    pos = torch.arange(S, device=dev, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = pos[:, None] * inv[None]
    cos, sin = torch.cos(ang).contiguous(), torch.sin(ang).contiguous()
    spec = resolve_positions(batch=B, seqlen=S, positions=None, device=dev)
    set_bytes = B * S * (HQ + HK) * D * dt.itemsize
    n_sets = max(1, -(-4 * L2 // set_bytes)) if set_bytes < 4 * L2 else 1
    n_sets = min(n_sets, 5)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(B, S, HQ, D, device=dev, dtype=dt); k = torch.randn(B, S, HK, D, device=dev, dtype=dt)
        sets.append((q, k, torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))))
    moved = 2 * set_bytes
    shape = RopeShape(B * S, HQ, HK, D, D, dt.itemsize, False, True, HQ == HK)
    facts = choice.device_facts(dev)
    chosen = model.model_rope(facts, shape)
    tile = model.model_rope(facts, shape._replace(flat_ok=False))
    vec = 16 // dt.itemsize
    flats = [FlatConfig(32 * 4 * vec // 2, 4), FlatConfig(32 * 4 * vec, 4), FlatConfig(2 * 32 * 4 * vec, 4),
             FlatConfig(4 * 32 * 4 * vec, 4), FlatConfig(2 * 32 * 4 * vec, 8), FlatConfig(32 * 4 * vec, 4, streaming=True)]
    if HQ == HK:
        flats += [FlatConfig(32 * 4 * vec // 2, 4, paired=True), FlatConfig(32 * 4 * vec, 4, paired=True)]
    print(cname, "sets", n_sets, "model", chosen, "tile", tile, flush=True)
    graphs, notes = {}, {}

    def add(label, mk, conj, check=True):
        fns = [mk(*st, conj) for st in sets]
        fns[0](); torch.cuda.synchronize()
        if check:
            q, k, oq, ok = sets[0]
            if oq.data_ptr() == q.data_ptr():
                pass
            else:
                err = max(float((oq.float() - reference(q, cos, sin, conj)).abs().max()),
                          float((ok.float() - reference(k, cos, sin, conj)).abs().max()))
                assert err < 0.05, (label, err)
        graphs[label] = graph(fns)

    def new(config):
        def mk(q, k, oq, ok, conj):
            p = L.plan_rope(q, k, cos, sin, out_q=oq, out_k=ok, positions=spec, rotary_dim=D, conjugate=conj,
                            config=config)
            return lambda: p(q, k, oq, ok, cos, sin, None, None, 0)
        return mk

    def base(config):
        def mk(q, k, oq, ok, conj):
            bcfg = BFlat(*config) if isinstance(config, FlatConfig) else type(config)(*config)
            bcfg = bcfg if isinstance(config, FlatConfig) else None
            p = BL.plan_rope(q, k, cos, sin, out_q=oq, out_k=ok, positions=spec, rotary_dim=D, conjugate=conj,
                             config=bcfg)
            return lambda: p(q, k, oq, ok, cos, sin, None, None, 0)
        return mk

    for conj in (False, True):
        tag = "conj" if conj else "fwd"
        add(f"base-flat{tuple(chosen)}-{tag}", base(chosen), conj)
        for f in flats:
            add(f"new-flat{tuple(f)}-{tag}", new(f), conj)
        add(f"new-tile-{tag}", new(tile), conj)
    graphs["copy"] = graph([lambda st=st: (st[2].copy_(st[0]), st[3].copy_(st[1])) for st in sets])
    # in place: the streaming tile (the library's) and this tree's flat kernel forced in place
    for conj in (False,):
        add("inplace-tile", lambda q, k, oq, ok, c: new(tile)(q, k, q, k, c), conj, check=False)
        orig = L._flat_applies
        L._flat_applies = lambda q, k, out_q, out_k, *a: orig(q, k, torch.empty(0), torch.empty(0) if k is not None else None, *a)
        try:
            add("inplace-flat", lambda q, k, oq, ok, c: new(chosen)(q, k, q, k, c), conj, check=False)
            q, k = sets[0][0].clone(), sets[0][1].clone()
            want_q = reference(q, cos, sin, False)
            p = L.plan_rope(q, k, cos, sin, out_q=q, out_k=k, positions=spec, rotary_dim=D, config=chosen)
            p(q, k, q, k, cos, sin, None, None, 0); torch.cuda.synchronize()
            notes["inplace_flat_err"] = float((q.float() - want_q).abs().max())
        finally:
            L._flat_applies = orig
    r = time_all(graphs)
    res["cases"][cname] = {"times_us": r, "moved": moved, "notes": notes, "model": repr(chosen), "tile": repr(tile)}
    for k2, v in r.items():
        print(f"{cname:10s} {k2:70s} {v:8.2f} us {moved / v / 1e3 / ceil * 100:5.1f}%", flush=True)
    print(notes, flush=True)
    del sets, graphs
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "flat_probe.json"), "w"), indent=1)
