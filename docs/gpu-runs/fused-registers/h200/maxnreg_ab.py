"""A/B: the fused forward at its chosen tile, as compiled, against the same tile with the registers a thread capped
(Triton's maxnreg) so that one or two more programs fit an SM. One process; every row checked against the float64
reference, captured together and replayed in interleaved rounds (ropekit.bench's harness)."""
import argparse, json, sys, time
from pathlib import Path
import torch
import ropekit.bench.fused as F
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import launch as L

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", required=True)
p.add_argument("--out", required=True)
p.add_argument("--rounds", type=int, default=7)
a = p.parse_args()
by = {c.name: c for c in CASES}
timer = GpuTimer(Settings(graph_ms=20.0, graph_rounds=a.rounds))
ceiling = timer.copy_ceiling()["gbps"]
print(f"{torch.cuda.get_device_name()}; copy ceiling {ceiling}", flush=True)
EXTRA = [0]
seen = {}
real = L._launch

def patched(launch, values):
    if not EXTRA[0]:
        return real(launch, values)
    regs = launch.registers(values) or 64
    threads = 32 * launch.num_warps
    blocks = 65536 // (((regs + 7) // 8 * 8) * threads)
    cap = max(24, (65536 // ((blocks + EXTRA[0]) * threads)) // 8 * 8)
    seen[(launch.kernel.__name__, launch.grid, launch.num_warps, EXTRA[0])] = (regs, blocks, cap)
    launch.kernel[launch.grid](**launch.named(values), num_warps=launch.num_warps, maxnreg=cap)

L._launch = patched

def variant(extra):
    def build(data):
        call = F._fused(data)
        def run():
            EXTRA[0] = extra
            try:
                return call()
            finally:
                EXTRA[0] = 0
        return run
    return build

builders = {"base": variant(0), "plus1": variant(1), "plus2": variant(2), "base2": variant(0), "plus1b": variant(1)}
rows = []
for name in a.cases:
    case_rows = F.run_case(by[name], builders, timer, "cuda", ceiling_gbps=ceiling, log=lambda *_: None)
    t = {r["impl"]: r.get("graph_us") for r in case_rows}
    pct = {r["impl"]: r.get("pct_of_floor") for r in case_rows}
    bad = [r["impl"] for r in case_rows if r["status"] not in ("ok", "reference")]
    caps = {k: v for k, v in seen.items()}
    print(f"{name:34s} base {t['base']:8.2f} {t['base2']:8.2f}  +1 {t['plus1']:8.2f} {t['plus1b']:8.2f}  "
          f"+2 {t['plus2']:8.2f}  (+1)/base {(t['plus1'] + t['plus1b']) / (t['base'] + t['base2']):.4f}  "
          f"(+2)/base {2 * t['plus2'] / (t['base'] + t['base2']):.4f}  copy {t[F.COPY_REFERENCE]:.2f} {bad or ''}",
          flush=True)
    print("   regs, blocks, cap:", caps, flush=True)
    seen.clear()
    rows += case_rows
Path(a.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), ceiling=ceiling, argv=sys.argv, rows=rows),
                                  indent=1, default=str))
