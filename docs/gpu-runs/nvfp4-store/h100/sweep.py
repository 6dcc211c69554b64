"""Fused launch sweep with a given config list (through ropekit.bench.fused_tune's harness: checked, graph replay,
interleaved rounds, copy ceiling in the same process)."""
import argparse, json, sys
import torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings

def parse(text):
    out = []
    for item in text.split(";"):
        f = [int(x) for x in item.split(",")]
        out.append(tuple([f[0], f[1], f[2]] + [bool(x) for x in f[3:5]] + f[5:]))
    return out

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", required=True)
p.add_argument("--prefill", default=None)
p.add_argument("--decode", default=None)
p.add_argument("--out", required=True)
p.add_argument("--budget", type=float, default=200)
p.add_argument("--dry", action="store_true")
a = p.parse_args()
if a.prefill:
    ft.SWEEP["prefill"] = parse(a.prefill)
if a.decode:
    ft.SWEEP["decode"] = parse(a.decode)
by = {c.name: c for c in CASES}
if a.dry:
    from ropekit.bench.fused_cases import tiny
    doc = ft.tune([tiny(by[n]) for n in a.cases], None, "cpu", budget_s=a.budget)
else:
    timer = GpuTimer(Settings(graph_ms=30.0, graph_rounds=5))
    doc = ft.tune([by[n] for n in a.cases], timer, "cuda", budget_s=a.budget)
doc["command"] = " ".join(sys.argv)
doc["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
open(a.out, "w").write(json.dumps(doc, indent=1, default=str))
