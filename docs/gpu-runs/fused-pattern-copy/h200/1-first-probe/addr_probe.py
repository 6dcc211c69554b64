"""Is the fused prefill's gap to its floor the kernel's arithmetic or its access pattern? The Llama-3-8B prefill
(b4 s4096, paged bf16, q in place in a packed qkv) timed beside Triton kernels that move exactly its bytes with its
addresses and do nothing else: q read and stored back in place, k and v read and stored to the shuffled pages at
the tokens' slots. Tiles as the fused op's; loads whole head vectors or halves (as the fused op loads a NeoX pair);
k and v in one program or in programs of their own; the grid's two orders; with and without the streaming hint.
Graph replay, interleaved rounds, one process."""
import json, os, sys
import torch
import triton
import triton.language as tl
import ropekit
from ropekit.bench import fused as F, fused_cases as FC
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config


@triton.jit
def addr_copy(QKV, KC, VC, SLOTS, n_tblocks, stride_tok, NQ: tl.constexpr, NK: tl.constexpr, D: tl.constexpr,
              BS: tl.constexpr, BH: tl.constexpr, BHK: tl.constexpr, INNER: tl.constexpr, EVICT: tl.constexpr,
              HALVES: tl.constexpr, V_APART: tl.constexpr):
    pid = tl.program_id(0)
    NQB: tl.constexpr = NQ // BH
    NKB: tl.constexpr = NK // BHK
    NB: tl.constexpr = NQB + NKB * (2 if V_APART else 1)
    if INNER:
        tb = pid // NB
        hb = pid % NB
    else:
        tb = pid % n_tblocks
        hb = pid // n_tblocks
    tok = (tb * BS + tl.arange(0, BS)).to(tl.int64)
    if HALVES:
        ch = tl.arange(0, D // 2)
    else:
        ch = tl.arange(0, D)
    if hb < NQB:
        qheads = hb * BH + tl.arange(0, BH)
        p = QKV + tok[:, None, None] * stride_tok + qheads[None, :, None] * D + ch[None, None, :]
        x = tl.load(p, eviction_policy=EVICT)
        if HALVES:
            y = tl.load(p + D // 2, eviction_policy=EVICT)
            tl.store(p + D // 2, y, eviction_policy=EVICT)
        tl.store(p, x, eviction_policy=EVICT)
    else:
        kb = hb - NQB
        is_v = kb >= NKB
        kb = kb % NKB
        heads = kb * BHK + tl.arange(0, BHK)
        off = tok[:, None, None] * stride_tok + heads[None, :, None] * D + ch[None, None, :]
        slot = tl.load(SLOTS + tok)
        dst = slot[:, None, None] * (NK * D) + heads[None, :, None] * D + ch[None, None, :]
        if V_APART:
            if is_v:
                vx = tl.load(QKV + (NQ + NK) * D + off, eviction_policy=EVICT)
                tl.store(VC + dst, vx, eviction_policy=EVICT)
            else:
                kx = tl.load(QKV + NQ * D + off, eviction_policy=EVICT)
                tl.store(KC + dst, kx, eviction_policy=EVICT)
        else:
            kx = tl.load(QKV + NQ * D + off, eviction_policy=EVICT)
            vx = tl.load(QKV + (NQ + NK) * D + off, eviction_policy=EVICT)
            if HALVES:
                kx2 = tl.load(QKV + NQ * D + D // 2 + off, eviction_policy=EVICT)
                vx2 = tl.load(QKV + (NQ + NK) * D + D // 2 + off, eviction_policy=EVICT)
                tl.store(KC + dst + D // 2, kx2, eviction_policy=EVICT)
                tl.store(VC + dst + D // 2, vx2, eviction_policy=EVICT)
            tl.store(KC + dst, kx, eviction_policy=EVICT)
            tl.store(VC + dst, vx, eviction_policy=EVICT)


def copier(data, bs, bh, bhk, warps, inner, evict, halves=False, v_apart=False):
    c = data.case
    qkv = data.qkv
    t = c.tokens
    n_tb = t // bs
    nb = c.heads_q // bh + (c.heads_kv // bhk) * (2 if v_apart else 1)
    grid = (n_tb * nb,)
    assert qkv.is_contiguous() and data.k_cache.is_contiguous()

    def run():
        addr_copy[grid](qkv, data.k_cache, data.v_cache, data.slots, n_tb, qkv.stride(1), c.heads_q, c.heads_kv,
                        c.head_dim, bs, bh, bhk, inner, "evict_first" if evict else "", halves, v_apart,
                        num_warps=warps)
    return run


def check_copier(data, fn):
    """The copy leaves q as it was and puts k and v at their slots."""
    c = data.case
    q, k, v = data.split()
    q0 = q.clone()
    data.k_cache.zero_(); data.v_cache.zero_()
    fn()
    torch.cuda.synchronize() if q.is_cuda else None
    assert torch.equal(q, q0)
    kf = data.k_cache.reshape(-1, c.heads_kv, c.head_dim)[data.slots]
    vf = data.v_cache.reshape(-1, c.heads_kv, c.head_dim)[data.slots]
    assert torch.equal(kf, k.reshape(-1, c.heads_kv, c.head_dim)), "k"
    assert torch.equal(vf, v.reshape(-1, c.heads_kv, c.head_dim)), "v"


COPIES = [  # (label, bs, bh, bhk, warps, inner, evict, halves, v_apart)
    ("2x16 w4 inner evict (the choice's tile)", 2, 16, 8, 4, True, True, False, False),
    ("2x16 w4 inner evict, halves", 2, 16, 8, 4, True, True, True, False),
    ("2x16 w4 inner, no hint", 2, 16, 8, 4, True, False, False, False),
    ("2x16 w4 tokens inner, evict", 2, 16, 8, 4, False, True, False, False),
    ("2x16 w4 inner evict, v apart", 2, 16, 8, 4, True, True, False, True),
    ("1x8 w4 inner evict", 1, 8, 8, 4, True, True, False, False),
    ("1x16 w4 inner evict", 1, 16, 8, 4, True, True, False, False),
    ("1x32 w4 inner evict", 1, 32, 8, 4, True, True, False, False),
    ("4x16 w8 inner evict", 4, 16, 8, 8, True, True, False, False),
]


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cases = {c.name: c for c in FC.CASES}
    cname = sys.argv[1] if len(sys.argv) > 1 else "prefill-b4-s4096"
    case = cases[cname]
    if dev == "cpu":  # a smoke test of the kernels' addressing under the interpreter
        import dataclasses
        case = dataclasses.replace(case, batch=1, seqlen=8)
        data = FC.make_data(case, dev, 12)
        for label, *cfg in COPIES:
            check_copier(data, copier(data, *cfg))
            print("ok", label)
        return
    from ropekit.bench.timing import GpuTimer, Settings
    timer = GpuTimer(Settings())
    ceiling = timer.copy_ceiling()["gbps"]
    name = torch.cuda.get_device_name()
    print(name, "ceiling", round(ceiling), flush=True)
    floor = FC.floor_bytes(case)
    pending = []

    def add(label, nbytes, fn, keep):
        pending.append((label, nbytes, timer.capture([fn], nbytes / (ceiling * 1e3)), keep))

    for cfg in (None, FusedConfig(1, 16, 4, True, True)):
        with forced_fused_config(cfg):
            result, data, fn = F.checked_call(case, F._fused, dev, 11)
            assert result["ok"], (cfg, result)
            add(f"fused {cfg}", floor, fn, (data, fn))
    for label, *cfg in COPIES:
        data = FC.make_data(case, dev, 13)
        fn = copier(data, *cfg)
        check_copier(data, fn)
        add("copy kernel " + label, floor, fn, (data, fn))
    data = FC.make_data(case, dev, 14)
    q, k, v = data.split()
    rot = lambda: ropekit.apply_rope(q, k, data.cos, data.sin, positions=data.offsets, inplace=True)  # noqa: E731
    rot()
    c = case
    qk_bytes = 2 * c.tokens * (c.heads_q + c.heads_kv) * c.head_dim * c.dtype.itemsize
    add("apply_rope in place (q, k views)", qk_bytes, rot, data)
    src = torch.randint(0, 256, (floor // 2,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    add("copy of the floor's bytes", floor, lambda: dst.copy_(src), (src, dst))
    rows = []
    for rnd in range(2):
        results = timer.replay_rounds([timer.capture(p[2].fns, p[1] / (ceiling * 1e3)) if rnd else p[2]
                                       for p in pending])
        for (label, nbytes, _, _), (median, spread, calls) in zip(pending, results):
            pct = nbytes / (median * 1e3) / ceiling * 100
            rows.append(dict(case=cname, round=rnd, label=label, bytes=nbytes, graph_us=median, spread=spread,
                             pct_ceiling=pct))
            print(f"{rnd} {label:60s} {median:8.2f} us {pct:6.1f}% (bytes {nbytes / 1e6:.1f} MB)", flush=True)
    json.dump(dict(device=name, ceiling_gbps=ceiling, rows=rows),
              open(os.path.join(os.environ.get("OUT", "/tmp"), f"addr_probe_{cname}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
