"""Llama-3-8B prefill (b4 s4096, 32 q / 8 kv heads, 128, bf16) on the GPU: is the backward's 2.4 % gap the kernel or
the addresses? And does a row-split flat kernel (each pair loaded once) beat the partner-loading flat kernel?

Everything is timed by graph replay of 10 calls, interleaved rounds, in one process."""
import json, os, statistics, sys
import torch, triton, triton.language as tl
from ropekit.triton import launch as L, choice, model
from ropekit.triton.configs import FlatConfig, TileConfig, RopeShape
from ropekit.positions import resolve_positions
from ropekit.bench.timing import copy_ceiling

dev = "cuda"
name = torch.cuda.get_device_name()
print(name, torch.__version__, triton.__version__, flush=True)
B, S, HQ, HK, D = 4, 4096, 32, 8, 128
dt = torch.bfloat16
nq, nk = B * S * HQ * D, B * S * HK * D
MB = 1 << 20
pos = torch.arange(S, device=dev, dtype=torch.float32)
inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
ang = pos[:, None] * inv[None]
cos, sin = torch.cos(ang).contiguous(), torch.sin(ang).contiguous()
spec = resolve_positions(batch=B, seqlen=S, positions=None, device=dev)


@triton.jit
def rows_kernel(Q, K, OQ, OK, COS, SIN, n_rows_q, n_rows_k, n_heads_q, n_heads_k, seqlen,
                HALF: tl.constexpr, ROWS: tl.constexpr, CONJ: tl.constexpr):
    """A program takes ROWS consecutive head vectors (token-major) of q, then of k; each pair loaded once."""
    pid = tl.program_id(0)
    n_q_blocks = tl.cdiv(n_rows_q, ROWS)
    is_q = pid < n_q_blocks
    if is_q:
        X = Q
        O = OQ
    else:
        X = K
        O = OK
    block = tl.where(is_q, pid, pid - n_q_blocks)
    n_rows = tl.where(is_q, n_rows_q, n_rows_k)
    n_heads = tl.where(is_q, n_heads_q, n_heads_k)
    r = block * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, HALF)
    mask = (r < n_rows)[:, None]
    token = r // n_heads
    position = token % seqlen
    base = r[:, None] * (2 * HALF) + c[None, :]
    x1 = tl.load(X + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + HALF, mask=mask, other=0.0).to(tl.float32)
    t = position[:, None] * HALF + c[None, :]
    co = tl.load(COS + t, mask=mask, other=0.0, eviction_policy="evict_last")
    si = tl.load(SIN + t, mask=mask, other=0.0, eviction_policy="evict_last")
    if CONJ:
        si = -si
    tl.store(O + base, (x1 * co - x2 * si).to(O.dtype.element_ty), mask=mask)
    tl.store(O + base + HALF, (x2 * co + x1 * si).to(O.dtype.element_ty), mask=mask)


def rows_call(q, k, oq, ok, conj, rows, warps):
    nrq, nrk = B * S * HQ, B * S * HK
    grid = (triton.cdiv(nrq, rows) + triton.cdiv(nrk, rows),)
    return lambda: rows_kernel[grid](q, k, oq, ok, cos, sin, nrq, nrk, HQ, HK, S, HALF=D // 2, ROWS=rows,
                                     CONJ=conj, num_warps=warps)


def rope_call(q, k, oq, ok, conj, config=None):
    plan = L.plan_rope(q, k, cos, sin, out_q=oq, out_k=ok, positions=spec, rotary_dim=D, conjugate=conj,
                       config=config)
    return lambda: plan(q, k, oq, ok, cos, sin, None, None, 0)


def copy_call(q, k, oq, ok):
    return lambda: (oq.copy_(q), ok.copy_(k))


def reference(x, conj):
    x32 = x.float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    s = -s if conj else s
    a, b = x32[..., :D // 2], x32[..., D // 2:]
    return torch.cat((a * c - b * s, b * c + a * s), -1)


def views(pool, offsets):
    """q, k, out_q, out_k as views of one byte pool at the given byte offsets."""
    shapes = [(B, S, HQ, D), (B, S, HK, D), (B, S, HQ, D), (B, S, HK, D)]
    out = []
    for (o, shp) in zip(offsets, shapes):
        n = 1
        for v in shp:
            n *= v
        out.append(pool[o:o + 2 * n].view(dt).view(shp))
    return out


CALLS = 10


def graph(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
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


res = {"device": name, "torch": torch.__version__, "triton": triton.__version__}
ceil = copy_ceiling()
res["copy_ceiling_gbps"] = ceil["gbps"]
moved = 2 * 2 * (nq + nk)
print("ceiling", ceil["gbps"], "bytes", moved, flush=True)

facts = choice.device_facts(dev)
shape = RopeShape(B * S, HQ, HK, D, D, 2, False, True, False)
res["model_choice"] = repr(model.model_rope(facts, shape))
cands = model.rope_candidates(facts, shape)
print("model", res["model_choice"], "candidates", cands, flush=True)

# 1. addresses: one pool; inputs at 0, outputs after them at a gap that varies
nbytes_in = 2 * (nq + nk)
pool = torch.empty(3 * nbytes_in + 64 * MB, dtype=torch.uint8, device=dev)
gaps = {"gap0": 0, "gap4K": 4096, "gap64K": 65536, "gap1M": MB, "gap2M": 2 * MB, "gap3M+8K": 3 * MB + 8192,
        "gap16M": 16 * MB, "gap33M+1K": 33 * MB + 1024}
graphs, checks = {}, {}
for gname, gap in gaps.items():
    o = [0, 2 * nq, nbytes_in + gap, nbytes_in + gap + 2 * nq]
    q, k, oq, ok = views(pool, o)
    q.copy_(torch.randn(q.shape, device=dev, dtype=dt)); k.copy_(torch.randn(k.shape, device=dev, dtype=dt))
    for conj in (False, True):
        tag = "conj" if conj else "fwd"
        f = rope_call(q, k, oq, ok, conj); f(); torch.cuda.synchronize()
        err = float((oq.float() - reference(q, conj)).abs().max())
        assert err < 0.05, err
        graphs[f"{gname}/flat-{tag}"] = graph(f)
        f = rows_call(q, k, oq, ok, conj, 16, 4); f(); torch.cuda.synchronize()
        err = float((oq.float() - reference(q, conj)).abs().max()) + float((ok.float() - reference(k, conj)).abs().max())
        assert err < 0.1, err
        graphs[f"{gname}/rows16x4w-{tag}"] = graph(f)
    graphs[f"{gname}/copy"] = graph(copy_call(q, k, oq, ok))
    res.setdefault("addr", {}).update({k2: v for k2, v in time_all(graphs).items()})
    for k2 in graphs:
        print(k2, round(res["addr"][k2], 2), flush=True)
    graphs = {}
del pool
torch.cuda.empty_cache()

# 2. the bench's allocation: forward data (q, k, outs) and backward data (q, k, gq, gk, outs)
gen = torch.Generator(device=dev).manual_seed(1)
draw = lambda shp: torch.randn(shp, generator=gen, device=dev, dtype=dt)  # noqa: E731
fq, fk = draw((B, S, HQ, D)), draw((B, S, HK, D))
foq, fok = torch.full_like(fq, float("nan")), torch.full_like(fk, float("nan"))
bq, bk, gq, gk = draw((B, S, HQ, D)), draw((B, S, HK, D)), draw((B, S, HQ, D)), draw((B, S, HK, D))
boq, bok = torch.full_like(gq, float("nan")), torch.full_like(gk, float("nan"))
graphs = {
    "benchfwd/flat-fwd": graph(rope_call(fq, fk, foq, fok, False)),
    "benchfwd/flat-conj": graph(rope_call(fq, fk, foq, fok, True)),
    "benchbwd/flat-conj(g)": graph(rope_call(gq, gk, boq, bok, True)),
    "benchbwd/flat-fwd(g)": graph(rope_call(gq, gk, boq, bok, False)),
    "benchbwd/flat-conj(q)": graph(rope_call(bq, bk, boq, bok, True)),
    "benchfwd/copy": graph(copy_call(fq, fk, foq, fok)),
    "benchbwd/copy(g)": graph(copy_call(gq, gk, boq, bok)),
}
r = time_all(graphs)
res["bench_alloc"] = r
res["bench_alloc_ptrs"] = {n: t.data_ptr() for n, t in (("fq", fq), ("fk", fk), ("foq", foq), ("fok", fok), ("bq", bq),
                                                       ("gq", gq), ("gk", gk), ("boq", boq), ("bok", bok))}
for k2, v in r.items():
    print(k2, round(v, 2), flush=True)

# 3. the candidates and the row-split kernel's tiles, forward, bench-forward allocation
graphs = {}
for c in cands:
    graphs[f"cand/{c!r}"] = graph(rope_call(fq, fk, foq, fok, False, c))
for rows, warps in ((8, 4), (16, 4), (32, 4), (16, 8), (32, 8), (64, 8)):
    f = rows_call(fq, fk, foq, fok, False, rows, warps); f(); torch.cuda.synchronize()
    assert float((foq.float() - reference(fq, False)).abs().max()) < 0.05
    graphs[f"rows/{rows}x{warps}w"] = graph(f)
graphs["copy"] = graph(copy_call(fq, fk, foq, fok))
r = time_all(graphs)
res["tiles"] = r
for k2, v in r.items():
    print(k2, round(v, 2), f"{moved / v / 1e3 / ceil['gbps'] * 100:.1f}%", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "addr_probe.json"), "w"), indent=1)
