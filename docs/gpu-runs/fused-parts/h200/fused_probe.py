"""The fused prefill (Llama-3-8B b4 s4096, paged bf16, q rotated in place in a packed qkv) on the GPU, split into its
parts: the fused op at its choice and at small tiles; apply_rope alone in place on the same q and k views (the
rotation's bytes); torch's index_copy_ of k and v into the shuffled pages alone (the cache write's bytes); a plain copy
of each part's bytes. Graph replay, interleaved rounds, one process. Where does the fused op lose its 8 %?"""
import json, os, sys
import torch
import ropekit
from ropekit.bench import fused as F, fused_cases as FC
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config

dev = "cuda"
name = torch.cuda.get_device_name()
timer = GpuTimer(Settings())
ceiling = timer.copy_ceiling()["gbps"]
print(name, "ceiling", round(ceiling), flush=True)
cases = {c.name: c for c in FC.CASES}
out = {"device": name, "ceiling_gbps": ceiling, "rows": []}
for cname in sys.argv[1:] or ["prefill-b4-s4096"]:
    case = cases[cname]
    c = case
    t, d = c.tokens, c.head_dim
    act = c.dtype.itemsize
    q_b, kv_b = t * c.heads_q * d * act, t * c.heads_kv * d * act
    parts = {"floor": FC.floor_bytes(case), "rotation": 2 * (q_b + kv_b), "cache write": 4 * kv_b,
             "q rotation": 2 * q_b}
    pending = []

    def add(label, nbytes, fn, keep):
        pending.append((label, nbytes, timer.capture([fn], nbytes / (ceiling * 1e3)), keep))

    for cfg in (None, FusedConfig(1, 8, 4, True, True), FusedConfig(1, 4, 2, True, True),
                FusedConfig(2, 8, 4, True, True), FusedConfig(1, 16, 4, True, True), FusedConfig(1, 8, 2, True, True)):
        with forced_fused_config(cfg):
            result, data, fn = F.checked_call(case, F._fused, dev, 11)
            assert result["ok"], (cfg, result)
            add(f"fused {cfg}", parts["floor"], fn, (data, fn))
    data = FC.make_data(case, dev, 12)
    q, k, v = data.split()
    rot = lambda: ropekit.apply_rope(q, k, data.cos, data.sin, positions=data.offsets, inplace=True)  # noqa: E731
    rot()
    add("apply_rope in place (q, k)", parts["rotation"], rot, data)
    rotq = lambda: ropekit.apply_rope(q, None, data.cos, data.sin, positions=data.offsets, inplace=True)  # noqa: E731
    rotq()
    add("apply_rope in place (q only)", parts["q rotation"], rotq, None)
    k_flat, v_flat = F._flat(data.k_cache), F._flat(data.v_cache)
    heads = (-1, c.heads_kv, c.head_dim)

    def write():
        k_flat.index_copy_(0, data.slots, k.reshape(heads))
        v_flat.index_copy_(0, data.slots, v.reshape(heads))
    write()
    add("index_copy_ k and v into the pages", parts["cache write"], write, None)
    for part in ("floor", "rotation", "cache write"):
        src = torch.randint(0, 256, (parts[part] // 2,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        add(f"copy of the {part}'s bytes", parts[part], (lambda s=src, t=dst: t.copy_(s)), (src, dst))
    results = timer.replay_rounds([p[2] for p in pending])
    for (label, nbytes, _, _), (median, spread, calls) in zip(pending, results):
        pct = nbytes / (median * 1e3) / ceiling * 100
        row = dict(case=cname, label=label, bytes=nbytes, graph_us=median, spread=spread, pct_ceiling=pct)
        out["rows"].append(row)
        print(f"{cname:22s} {label:70s} {median:8.2f} us {pct:6.1f}% (bytes {nbytes / 1e6:.1f} MB)", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "fused_probe.json"), "w"), indent=1)
