"""A/B of the fused forward: this tree's public ops against the exported base's (.ab/ropekit_base), each case's
rows checked against the float64 reference, captured together and replayed in interleaved rounds (ropekit.bench's
harness), in one process. Rows: base, new, base again, new again (the second pair shows the clock's spread)."""
import argparse, json, os, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
import ropekit_base.bench.fused as FB
import ropekit.bench.fused as F
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", default=None)
p.add_argument("--out", required=True)
p.add_argument("--rounds", type=int, default=7)
p.add_argument("--budget", type=float, default=300)
p.add_argument("--alt", default=None, help="more packages in .ab, comma-separated (rows altI, altI2)")
a = p.parse_args()
names = a.cases or [c.name for c in CASES if "backward" not in c.name]
by = {c.name: c for c in CASES}
device = "cuda" if torch.cuda.is_available() else "cpu"
timer = GpuTimer(Settings(graph_ms=20.0, graph_rounds=a.rounds)) if device == "cuda" else None
ceiling = timer.copy_ceiling()["gbps"] if timer else None
print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; copy ceiling {ceiling}", flush=True)
builders = {"base": FB._fused, "new": F._fused, "base2": FB._fused, "new2": F._fused}
alts = a.alt.split(",") if a.alt else []
for i, package in enumerate(alts):
    import importlib
    FA = importlib.import_module(package + ".bench.fused")
    builders.update({f"alt{i}": FA._fused, f"alt{i}2": FA._fused})
rows, start = [], time.time()
for name in names:
    if time.time() - start > a.budget:
        print(f"budget used: {name} not run", flush=True); continue
    case_rows = F.run_case(by[name], builders, timer, device, ceiling_gbps=ceiling, log=lambda *_: None)
    t = {r["impl"]: r.get("graph_us") for r in case_rows}
    bad = [r["impl"] for r in case_rows if r["status"] not in ("ok", "reference")]
    if timer and t.get("base") and t.get("new"):
        ratio = (t["new"] + t["new2"]) / (t["base"] + t["base2"])
        print(f"{name:34s} base {t['base']:8.2f} {t['base2']:8.2f}  new {t['new']:8.2f} {t['new2']:8.2f}  "
              f"new/base {ratio:.4f}  copy {t[F.COPY_REFERENCE]:.2f}"
              + (f"  chain {t[F.LAUNCH_FLOOR]:.3f} base/chain {(t['base'] + t['base2']) / 2 / t[F.LAUNCH_FLOOR]:.3f}"
                 f" new/chain {(t['new'] + t['new2']) / 2 / t[F.LAUNCH_FLOOR]:.3f}" if t.get(F.LAUNCH_FLOOR) else "")
              + "".join(f"  alt{i} {t[f'alt{i}']:6.2f} {t[f'alt{i}2']:6.2f} /base "
                        f"{(t[f'alt{i}'] + t[f'alt{i}2']) / (t['base'] + t['base2']):.4f}" for i in range(len(alts)))
              + f" {bad or ''}", flush=True)
    else:
        print(name, [(r["impl"], r["status"]) for r in case_rows], flush=True)
    rows += case_rows
Path(a.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                       ceiling=ceiling, argv=sys.argv, rows=rows), indent=1, default=str))
