"""OLMo-2's norm over all heads, and the per-head backward: the model's choice beside a few neighbours, graph replay,
one process, the configurations replayed in interleaved rounds (fused_tune.tune); the model's choice first.
Backward: stages 3 and 5 beside the rule's 4, 8 warps; decode: 2, 8 and 16 warps, v in programs of its own.
argv: out.json [case ...]"""
import json, sys
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings


def make(case):
    base = ft._table_choice(case)
    out = [base]
    if "backward" in case.name:
        changes = [dict(stages=3), dict(stages=5), dict(num_warps=8), dict(token_blocks=8), dict(token_blocks=32)]
    else:
        changes = [dict(num_warps=2), dict(num_warps=8), dict(num_warps=16), dict(v_apart=True),
                   dict(v_apart=True, num_warps=8)]
    for change in changes:
        c = base._replace(**change)
        if c not in out:
            out.append(c)
    return out


ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[2:] or ["olmo2-backward-b4-s4096", "qknorm-backward-b4-s4096", "decode-b64-olmo2"]:
    print("model:", name, ft._table_choice(by[name]), flush=True)
    doc[name] = ft.tune([by[name]], timer, "cuda")
json.dump(doc, open(sys.argv[1], "w"), default=str, indent=1)
