"""The fused backward's tiles on the OLMo-2 (norm over all heads) and Qwen3 (QK-norm) backward cases, graph replay,
the same rounds: the model's choice first, then neighbours (warps, token blocks, stages, tokens), and the model's
choice with the weight gradient stored per program (deterministic mode) instead of added atomically."""
import json, sys, torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.configs import FusedConfig

E = (True, True)
OLMO = [(1, 32, 8, *E, 16, 3), (1, 32, 32, *E, 16, 3), (1, 32, 4, *E, 16, 3),
        (1, 32, 16, *E, 64, 3), (1, 32, 16, *E, 4, 3), (1, 32, 16, *E, 32, 3), (1, 32, 16, *E, 128, 3),
        (1, 32, 16, *E, 16, 1), (1, 32, 16, *E, 16, 2), (2, 32, 16, *E, 16, 3), (2, 32, 16, *E, 8, 3),
        (1, 32, 8, *E, 64, 3), (1, 32, 8, *E, 16, 1), (1, 32, 16, False, True, 16, 3), (1, 32, 8, *E, 64, 2),
        (1, 32, 16, *E, 64, 2)]
QWEN = [(1, 8, 4, *E, 64, 3), (1, 8, 4, *E, 32, 3), (1, 8, 8, *E, 32, 3), (1, 16, 4, *E, 32, 3),
        (1, 8, 4, *E, 16, 2), (2, 8, 4, *E, 16, 3), (1, 4, 2, *E, 32, 3), (1, 8, 2, *E, 32, 3)]
SETS = {"olmo2-backward-b4-s4096": OLMO, "qknorm-backward-b4-s4096": QWEN}

def make(case):
    out = [ft._table_choice(case)]
    for f in SETS[case.name]:
        c = FusedConfig(*f)
        if c not in out:
            out.append(c)
    return out
ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[1:] or list(SETS):
    case = by[name]
    print("model:", ft._table_choice(case), flush=True)
    doc[name] = ft.tune([case], timer, "cuda")
    torch.use_deterministic_algorithms(True, warn_only=True)
    ft.candidates = lambda c: [ft._table_choice(c)]
    print("deterministic (per-program weight-gradient rows):", flush=True)
    doc[name + "-deterministic"] = ft.tune([case], timer, "cuda")
    torch.use_deterministic_algorithms(False)
    ft.candidates = make
json.dump(doc, open(sys.argv[0].replace(".py", ".json") if False else "/tmp/bwd_sweep.json", "w"), default=str, indent=1)
