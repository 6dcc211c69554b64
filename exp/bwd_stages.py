"""The fused backward's pipeline depth on the Qwen3 QK-norm and OLMo-2 (norm over all heads) backward cases, graph
replay, one process, the cases' configurations replayed in interleaved rounds: the model's choice (three stages,
16 token blocks) first, then 2, 4 and 5 stages and 16 or 32 token blocks at the choice's tile."""
import json, sys, torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings

def make(case):
    base = ft._table_choice(case)
    out = [base]
    for blocks, stages in ((16, 4), (16, 5), (32, 4), (32, 3), (16, 2), (8, 4), (64, 4)):
        c = base._replace(token_blocks=blocks, stages=stages)
        if c not in out:
            out.append(c)
    return out
ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[2:] or ["qknorm-backward-b4-s4096", "olmo2-backward-b4-s4096"]:
    print("model:", ft._table_choice(by[name]), flush=True)
    doc[name] = ft.tune([by[name]], timer, "cuda")
json.dump(doc, open(sys.argv[1], "w"), default=str, indent=1)
