"""The fused prefill's bytes and addresses moved by the GPU's tensor memory accelerator (TMA, Triton's tensor
descriptors) instead of per-thread loads and stores: q's head vectors of a token block read and stored back in place
([BS, 128] boxes of the packed projection), k's and v's read a token's head vector at a time and stored at the
token's slot in the shuffled pages ([1, 128] boxes). The heads' loop is software-pipelined (tl.range num_stages), so
several boxes are in flight a program. Beside it, the best per-thread copy of the same addresses
(exp/addr_probe.py's 1 x 16 split) and the fused op. Graph replay, two rounds, one process."""
import json, os, sys
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
from ropekit.bench import fused as F, fused_cases as FC

sys.path.insert(0, os.path.dirname(__file__))


@triton.jit
def tma_copy(qkv_desc, row_desc, kc_desc, vc_desc, SLOTS, NQ: tl.constexpr, NK: tl.constexpr, D: tl.constexpr,
             BS: tl.constexpr, BH: tl.constexpr, BHK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    NQB: tl.constexpr = NQ // BH
    NB: tl.constexpr = NQB + NK // BHK
    tb = pid // NB
    hb = pid % NB
    t0 = tb * BS
    if hb < NQB:
        for h in tl.range(0, BH, num_stages=STAGES):
            col = (hb * BH + h) * D
            x = qkv_desc.load([t0, col])
            qkv_desc.store([t0, col], x)
    else:
        kb = hb - NQB
        for i in tl.range(0, BS * BHK, num_stages=STAGES):
            t = t0 + i // BHK
            head = kb * BHK + i % BHK
            slot = tl.load(SLOTS + t).to(tl.int32)
            kx = row_desc.load([t, (NQ + head) * D])
            vx = row_desc.load([t, (NQ + NK + head) * D])
            kc_desc.store([slot, head * D], kx)
            vc_desc.store([slot, head * D], vx)


def tma_copier(data, bs, bh, bhk, warps, stages):
    c = data.case
    t, d = c.tokens, c.head_dim
    width = (c.heads_q + 2 * c.heads_kv) * d
    qkv2 = data.qkv.view(t, width)
    kc2 = data.k_cache.view(-1, c.heads_kv * d)
    vc2 = data.v_cache.view(-1, c.heads_kv * d)
    qkv_desc = TensorDescriptor(qkv2, [t, width], [width, 1], [bs, d])
    row_desc = TensorDescriptor(qkv2, [t, width], [width, 1], [1, d])
    kc_desc = TensorDescriptor(kc2, list(kc2.shape), [kc2.shape[1], 1], [1, d])
    vc_desc = TensorDescriptor(vc2, list(vc2.shape), [vc2.shape[1], 1], [1, d])
    grid = (t // bs * (c.heads_q // bh + c.heads_kv // bhk),)

    def run():
        tma_copy[grid](qkv_desc, row_desc, kc_desc, vc_desc, data.slots, c.heads_q, c.heads_kv, d, bs, bh, bhk,
                       stages, num_warps=warps)
    return run


TMAS = [  # (label, bs, bh, bhk, warps, stages)
    ("tma 2x16 w4 s3", 2, 16, 8, 4, 3),
    ("tma 1x16 w4 s3", 1, 16, 8, 4, 3),
    ("tma 4x8 w4 s3", 4, 8, 8, 4, 3),
    ("tma 2x16 w1 s4", 2, 16, 8, 1, 4),
    ("tma 8x32 w4 s4", 8, 32, 8, 4, 4),
]


def main():
    import addr_probe as A
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cases = {c.name: c for c in FC.CASES}
    case = cases["prefill-b4-s4096"]
    if dev == "cpu":
        import dataclasses
        case = dataclasses.replace(case, batch=1, seqlen=16)
        data = FC.make_data(case, dev, 12)
        for label, *cfg in TMAS:
            A.check_copier(data, tma_copier(data, *cfg))
            print("ok", label)
        return
    from ropekit.bench.timing import GpuTimer, Settings
    timer = GpuTimer(Settings())
    ceiling = timer.copy_ceiling()["gbps"]
    name = torch.cuda.get_device_name()
    print(name, "ceiling", round(ceiling), flush=True)
    floor = FC.floor_bytes(case)
    pending = []

    def add(label, fn, keep):
        pending.append((label, fn, keep))

    result, data, fn = F.checked_call(case, F._fused, dev, 11)
    assert result["ok"]
    add("fused (the choice)", fn, data)
    for label, *cfg in TMAS:
        data = FC.make_data(case, dev, 13)
        try:
            fn = tma_copier(data, *cfg)
            A.check_copier(data, fn)
        except Exception as error:  # noqa: BLE001  (a configuration the compiler refuses is reported, not fatal)
            print("FAIL", label, type(error).__name__, str(error)[:300], flush=True)
            continue
        add("copy " + label, fn, data)
    data = FC.make_data(case, dev, 14)
    fn = A.copier(data, 1, 16, 8, 4, True, True, 2, False)
    A.check_copier(data, fn)
    add("copy 1x16 w4 split in registers, rotated (per-thread)", fn, data)
    src = torch.randint(0, 256, (floor // 2,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    add("copy of the floor's bytes", lambda: dst.copy_(src), (src, dst))
    rows = []
    for rnd in range(2):
        graphs = [timer.capture([fn], floor / (ceiling * 1e3)) for _, fn, _ in pending]
        for (label, _, _), (median, spread, calls) in zip(pending, timer.replay_rounds(graphs)):
            pct = floor / (median * 1e3) / ceiling * 100
            rows.append(dict(round=rnd, label=label, graph_us=median, spread=spread, pct_floor=pct))
            print(f"{rnd} {label:58s} {median:8.2f} us {pct:6.1f}%", flush=True)
    json.dump(dict(device=name, ceiling_gbps=ceiling, rows=rows),
              open(os.path.join(os.environ.get("OUT", "/tmp"), "tma_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
