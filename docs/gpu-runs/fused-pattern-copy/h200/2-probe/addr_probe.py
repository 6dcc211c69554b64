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
def _moved(p, q, c, s, D: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr, MODE: tl.constexpr,
           EVICT: tl.constexpr):
    """Read the head vectors at p, store them at q. MODE 0: whole vectors; 1: NeoX halves, loaded and stored apart;
    2: whole vectors split into NeoX halves in registers and joined again, rotated by (c, s) between; 3: halves
    rotated by (c, s). With c = 1, s = 0 the rotation leaves every value as it was."""
    if MODE == 0:
        ch = tl.arange(0, D)
        x = tl.load(p + ch[None, None, :], eviction_policy=EVICT)
        tl.store(q + ch[None, None, :], x, eviction_policy=EVICT)
    elif MODE == 2:
        ch = tl.arange(0, D)
        x = tl.load(p + ch[None, None, :], eviction_policy=EVICT).to(tl.float32)
        xa, xb = tl.split(tl.permute(tl.reshape(x, [BS, BH, 2, D // 2]), [0, 1, 3, 2]))
        ya, yb = xa * c - xb * s, xb * c + xa * s
        y = tl.reshape(tl.permute(tl.join(ya, yb), [0, 1, 3, 2]), [BS, BH, D])
        tl.store(q + ch[None, None, :], y.to(q.dtype.element_ty), eviction_policy=EVICT)
    else:
        ch = tl.arange(0, D // 2)
        xa = tl.load(p + ch[None, None, :], eviction_policy=EVICT).to(tl.float32)
        xb = tl.load(p + D // 2 + ch[None, None, :], eviction_policy=EVICT).to(tl.float32)
        if MODE == 3:
            xa, xb = xa * c - xb * s, xb * c + xa * s
        tl.store(q + ch[None, None, :], xa.to(q.dtype.element_ty), eviction_policy=EVICT)
        tl.store(q + D // 2 + ch[None, None, :], xb.to(q.dtype.element_ty), eviction_policy=EVICT)


@triton.jit
def addr_copy(QKV, KC, VC, SLOTS, n_tblocks, stride_tok, c, s, NQ: tl.constexpr, NK: tl.constexpr,
              D: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr, BHK: tl.constexpr, INNER: tl.constexpr,
              EVICT: tl.constexpr, MODE: tl.constexpr, V_APART: tl.constexpr):
    """The fused prefill's bytes and addresses: q's head vectors read and stored back in place; k's and v's read and
    stored at their tokens' slots in the paged caches (v always whole, as the fused op moves it)."""
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
    if hb < NQB:
        qheads = hb * BH + tl.arange(0, BH)
        p = QKV + tok[:, None, None] * stride_tok + qheads[None, :, None] * D
        _moved(p, p, c, s, D, BS, BH, MODE, EVICT)
    else:
        kb = hb - NQB
        is_v = kb >= NKB
        kb = kb % NKB
        heads = kb * BHK + tl.arange(0, BHK)
        off = tok[:, None, None] * stride_tok + heads[None, :, None] * D
        slot = tl.load(SLOTS + tok)
        dst = slot[:, None, None] * (NK * D) + heads[None, :, None] * D
        if V_APART:
            if is_v:
                _moved(QKV + (NQ + NK) * D + off, VC + dst, c, s, D, BS, BHK, 0, EVICT)
            else:
                _moved(QKV + NQ * D + off, KC + dst, c, s, D, BS, BHK, MODE, EVICT)
        else:
            _moved(QKV + NQ * D + off, KC + dst, c, s, D, BS, BHK, MODE, EVICT)
            _moved(QKV + (NQ + NK) * D + off, VC + dst, c, s, D, BS, BHK, 0, EVICT)


def copier(data, bs, bh, bhk, warps, inner, evict, mode=0, v_apart=False):
    c = data.case
    qkv = data.qkv
    t = c.tokens
    n_tb = t // bs
    nb = c.heads_q // bh + (c.heads_kv // bhk) * (2 if v_apart else 1)
    grid = (n_tb * nb,)
    assert qkv.is_contiguous() and data.k_cache.is_contiguous()

    def run():
        addr_copy[grid](qkv, data.k_cache, data.v_cache, data.slots, n_tb, qkv.stride(1), 1.0, 0.0, c.heads_q,
                        c.heads_kv, c.head_dim, bs, bh, bhk, inner, "evict_first" if evict else "", mode, v_apart,
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


COPIES = [  # (label, bs, bh, bhk, warps, inner, evict, mode, v_apart)
    ("2x16 w4 whole (the choice's tile)", 2, 16, 8, 4, True, True, 0, False),
    ("2x16 w4 halves", 2, 16, 8, 4, True, True, 1, False),
    ("2x16 w4 whole split in registers, rotated", 2, 16, 8, 4, True, True, 2, False),
    ("2x16 w4 halves, rotated", 2, 16, 8, 4, True, True, 3, False),
    ("1x8 w4 whole", 1, 8, 8, 4, True, True, 0, False),
    ("1x8 w4 halves", 1, 8, 8, 4, True, True, 1, False),
    ("1x8 w4 whole split in registers, rotated", 1, 8, 8, 4, True, True, 2, False),
    ("1x8 w4 halves, rotated", 1, 8, 8, 4, True, True, 3, False),
    ("1x16 w4 whole split in registers, rotated", 1, 16, 8, 4, True, True, 2, False),
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
    for label, *cfg in (COPIES[0], COPIES[2], COPIES[4], COPIES[6]):
        data = FC.make_data(case, dev, 15)
        data.slots.copy_(torch.arange(data.slots.numel(), device=dev))
        fn = copier(data, *cfg)
        check_copier(data, fn)
        add("copy kernel " + label + ", slots in order", floor, fn, (data, fn))
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
