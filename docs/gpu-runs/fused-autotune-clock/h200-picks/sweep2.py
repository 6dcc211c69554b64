"""Per case: the fused autotune's own pick (the public op's first call, autotune on, an empty cache), the model's
choice, and a list of configurations, timed together by ropekit.bench.fused_tune's harness (checked, graph replay,
interleaved rounds, the copy ceiling of the same process)."""
import argparse, json, sys
import torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused import checked_call, impls
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import choice, model

def parse(text):
    out = []
    for item in text.split(";"):
        f = [int(x) for x in item.split(",")]
        out.append(tuple([f[0], f[1], f[2]] + [bool(x) for x in f[3:5]] + f[5:]))
    return out

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", required=True)
p.add_argument("--prefill", required=True)
p.add_argument("--out", required=True)
p.add_argument("--budget", type=float, default=200)
a = p.parse_args()
by = {c.name: c for c in CASES}
facts = choice.device_facts("cuda")
timer = GpuTimer(Settings(graph_ms=30.0, graph_rounds=5))
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
picks, rows = {}, []
for name in a.cases:
    case = by[name]
    shape = ft.case_shape(case)
    mine = model.model_fused(facts, choice.fused_bucket(shape))
    checked_call(case, impls()["ropekit-fused"], "cuda", 7)  # the public op's first call: the autotune decides
    tuned = choice.choose_fused(shape, "cuda")
    picks[name] = dict(model=mine._asdict(), autotune=tuned._asdict())
    print(f"{name}: model {tuple(mine)} autotune {tuple(tuned)}", flush=True)
    ft.SWEEP["prefill"] = [tuple(mine)] + parse(a.prefill)
    rows += ft.tune_case(case, timer, "cuda", ceiling)
doc = dict(command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(), ceiling=ceiling, picks=picks, rows=rows)
open(a.out, "w").write(json.dumps(doc, indent=1, default=str))
