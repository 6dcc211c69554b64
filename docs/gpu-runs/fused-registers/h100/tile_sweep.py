"""Forced fused tiles, as compiled and with the registers a thread capped (Triton's maxnreg) so that one more program
fits an SM, against the usual choice: one process, rows checked against the float64 reference, captured together and
replayed in interleaved rounds (ropekit.bench's harness)."""
import argparse, json, sys
from pathlib import Path
import torch
import ropekit.bench.fused as F
from ropekit.bench.fused_cases import CASES, floor_bytes
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import launch as L
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--rounds", type=int, default=7)
a = p.parse_args()
by = {c.name: c for c in CASES}
from ropekit.triton import choice as CH
import time as _t
probe = []
for _ in range(3):
    probe.append(round(CH.measure_copy_gbps(0)))
t0 = _t.time()
src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
while _t.time() - t0 < 0.3:
    dst.copy_(src)
torch.cuda.synchronize()
probe.append(("after 0.3 s of copies", round(CH.measure_copy_gbps(0))))
print("measure_copy_gbps, cold then again:", probe, flush=True)
timer = GpuTimer(Settings(graph_ms=20.0, graph_rounds=a.rounds))
ceiling = timer.copy_ceiling()["gbps"]
print(f"{torch.cuda.get_device_name()}; copy ceiling {ceiling}; facts {CH.device_facts(0)}", flush=True)
EXTRA = [0]
seen = {}
real = L._launch

def patched(launch, values):
    if not EXTRA[0]:
        seen.setdefault(("chosen", launch.grid, launch.num_warps), launch.registers(values))
        return real(launch, values)
    regs = launch.registers(values) or 64
    threads = 32 * launch.num_warps
    blocks = 65536 // (((regs + 7) // 8 * 8) * threads)
    cap = max(24, (65536 // ((blocks + EXTRA[0]) * threads)) // 8 * 8)
    seen[(launch.grid, launch.num_warps, EXTRA[0])] = (regs, blocks, cap)
    launch.kernel[launch.grid](**launch.named(values), num_warps=launch.num_warps, maxnreg=cap)

L._launch = patched

def variant(config, extra):
    def build(data):
        call = F._fused(data)
        def run():
            EXTRA[0] = extra
            try:
                if config is None:
                    return call()
                with forced_fused_config(config):
                    return call()
            finally:
                EXTRA[0] = 0
        return run
    return build

def C(s, h, w):
    return FusedConfig(s, h, w, True, True, 1, 1)

plan = {
    "prefill-b4-s4096-olmo2": [(C(2, 32, 4), 0), (C(1, 32, 4), 0), (C(1, 32, 8), 0), (C(1, 32, 4), 1)],
    "prefill-b4-s4096": [(C(2, 8, 4), 0), (C(2, 16, 4), 0)],
    "prefill-b4-s4096-qknorm": [(C(4, 8, 4), 0), (C(4, 16, 4), 0)],
    "prefill-b4-s4096-page-table": [(C(2, 8, 4), 0), (C(2, 16, 4), 0)],
    "prefill-b4-s4096-e5m2": [(C(2, 8, 4), 0), (C(2, 16, 4), 0)],
    "prefill-b4-s4096-fp8-head": [(C(2, 8, 4), 0), (C(2, 16, 4), 0)],
    "prefill-b4-s4096-fp8": [(C(2, 8, 4), 0), (C(2, 16, 4), 0)],
    "prefill-b4-s4096-nvfp4": [(C(2, 32, 4), 0), (C(2, 32, 4), 1)],
}
rows = []
for name, variants in plan.items():
    builders = {"default": variant(None, 0)}
    for config, extra in variants:
        builders[f"{config.block_s}x{config.block_h}w{config.num_warps}{'+%d' % extra if extra else ''}"] = \
            variant(config, extra)
    builders["default2"] = variant(None, 0)
    case_rows = F.run_case(by[name], builders, timer, "cuda", ceiling_gbps=ceiling, log=lambda *_: None)
    base = None
    print(name, flush=True)
    for r in case_rows:
        if r.get("graph_us") is None:
            print(f"   {r['impl']:16s} {r['status']}", flush=True)
            continue
        base = base or r["graph_us"]
        print(f"   {r['impl']:16s} {r['graph_us']:8.2f} us  {floor_bytes(by[name]) / (ceiling * 1e3) / r['graph_us'] * 100:5.1f}%  "
              f"x{r['graph_us'] / base:.4f}  {r['status']}", flush=True)
    print("   regs:", dict(seen), flush=True)
    seen.clear()
    rows += case_rows
Path(a.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), ceiling=ceiling, argv=sys.argv, rows=rows),
                                  indent=1, default=str))
