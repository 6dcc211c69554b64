"""The tile kernel at small tiles, its grid walked tokens-inner (this tree) or heads-inner (.ab/ropekit_hin), against
the flat kernel and a row-split reference kernel, on the main prefill shapes: graph replay, interleaved rounds."""
import json, os, statistics, sys
from pathlib import Path
import torch, triton, triton.language as tl
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
from ropekit.triton import launch as L, choice, model
from ropekit.triton.configs import TileConfig
from ropekit.positions import resolve_positions
from ropekit.bench.timing import copy_ceiling
from ropekit_hin.triton import launch as LH
from ropekit_hin.triton.configs import TileConfig as TileH
from ropekit_hin.positions import resolve_positions as resolve_h

dev = "cuda"
name = torch.cuda.get_device_name()
print(name, torch.__version__, triton.__version__, flush=True)
ONLY = os.environ.get("ONLY")


@triton.jit
def rows_kernel(Q, K, OQ, OK, COS, SIN, n_rows_q, n_rows_k, n_heads_q, n_heads_k, seqlen,
                HALF: tl.constexpr, ROWS: tl.constexpr, CONJ: tl.constexpr):
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
    position = (r // n_heads) % seqlen
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


def time_all(graphs, rounds=7, reps=12):
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
ceil = copy_ceiling()["gbps"]
res["copy_ceiling_gbps"] = ceil
print("ceiling", ceil, flush=True)

SHAPES = {"llama": (4, 4096, 32, 8, 128, torch.bfloat16), "mha": (8, 2048, 64, 64, 128, torch.float16),
          "fp32": (2, 2048, 32, 32, 64, torch.float32)}
TILES = [(1, 8, 4, False), (2, 8, 4, False), (1, 16, 4, False), (1, 8, 4, True), (2, 4, 4, False), (1, 4, 2, False),
         (1, 16, 8, False)]
for sname, (B, S, HQ, HK, D, dt) in SHAPES.items():
    if ONLY and sname not in ONLY:
        continue
    pos = torch.arange(8192, device=dev, dtype=torch.float32)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = pos[:, None] * inv[None]
    cos, sin = torch.cos(ang).contiguous(), torch.sin(ang).contiguous()
    q = torch.randn(B, S, HQ, D, device=dev, dtype=dt); k = torch.randn(B, S, HK, D, device=dev, dtype=dt)
    oq, ok = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    iq, ik = q.clone(), k.clone()  # in place
    moved = 2 * q.element_size() * (q.numel() + k.numel())

    def ref(x, conj):
        c, s_ = cos[:S][None, :, None, :], sin[:S][None, :, None, :]
        s_ = -s_ if conj else s_
        a, b_ = x.float()[..., :D // 2], x.float()[..., D // 2:]
        return torch.cat((a * c - b_ * s_, b_ * c + a * s_), -1)

    def mk(lib, resolve, config, conj, inplace=False, interleaved=False):
        xq, xk = (iq, ik) if inplace else (q, k)
        yq, yk = (iq, ik) if inplace else (oq, ok)
        spec = resolve(batch=B, seqlen=S, positions=None, device=dev)
        plan = lib.plan_rope(xq, xk, cos, sin, out_q=yq, out_k=yk, positions=spec, rotary_dim=D, conjugate=conj,
                             interleaved=interleaved, config=config)
        f = lambda: plan(xq, xk, yq, yk, cos, sin, None, None, 0)  # noqa: E731
        if not inplace and not interleaved:
            f(); torch.cuda.synchronize()
            err = float((oq.float() - ref(q, conj)).abs().max()) + float((ok.float() - ref(k, conj)).abs().max())
            assert err < (0.1 if dt != torch.float32 else 1e-4), (config, err)
            oq.fill_(float("nan")); ok.fill_(float("nan"))
        return f

    for conj in (False, True):
        tag = "conj" if conj else "fwd"
        graphs = {f"{sname}/{tag}/model": graph(mk(L, resolve_positions, None, conj))}
        for (bs, bh, w, ev) in TILES:
            if bh > max(HQ, HK) * 2:
                continue
            graphs[f"{sname}/{tag}/tile{bs}x{bh}x{w}w{'-ev' if ev else ''}"] = graph(
                mk(L, resolve_positions, TileConfig(bs, bh, w, False, ev), conj))
            graphs[f"{sname}/{tag}/hin{bs}x{bh}x{w}w{'-ev' if ev else ''}"] = graph(
                mk(LH, resolve_h, TileH(bs, bh, w, False, ev), conj))
        nrq, nrk = B * S * HQ, B * S * HK
        for rows, w in ((8, 4), (16, 4)):
            grid = (triton.cdiv(nrq, rows) + triton.cdiv(nrk, rows),)
            f = (lambda grid=grid, rows=rows, w=w, conj=conj: rows_kernel[grid](
                q, k, oq, ok, cos, sin, nrq, nrk, HQ, HK, S, HALF=D // 2, ROWS=rows, CONJ=conj, num_warps=w))
            graphs[f"{sname}/{tag}/rows{rows}x{w}w"] = graph(f)
        if not conj:
            graphs[f"{sname}/copy"] = graph(lambda: (oq.copy_(q), ok.copy_(k)))
            graphs[f"{sname}/inplace/model"] = graph(mk(L, resolve_positions, None, False, True))
            for (bs, bh, w, ev) in TILES[:4]:
                graphs[f"{sname}/inplace/hin{bs}x{bh}x{w}w{'-ev' if ev else ''}"] = graph(
                    mk(LH, resolve_h, TileH(bs, bh, w, False, ev), False, True))
            if sname == "llama":
                graphs[f"{sname}/gptj/model"] = graph(mk(L, resolve_positions, None, False, True, True))
                for (bs, bh, w, ev) in TILES[:4]:
                    graphs[f"{sname}/gptj/hin{bs}x{bh}x{w}w{'-ev' if ev else ''}"] = graph(
                        mk(LH, resolve_h, TileH(bs, bh, w, False, ev), False, True, True))
        r = time_all(graphs)
        for k2, v in r.items():
            res[k2] = v
            print(f"{k2:34s} {v:8.2f} {moved / v / 1e3 / ceil * 100:5.1f}%", flush=True)
        del graphs
    del q, k, oq, ok, iq, ik
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "tile_probe.json"), "w"), indent=1)
