"""The per-head QK-norm backward (Qwen3) at wider tiles: every q head of a token in one program step (1 x 32, k's
programs keep its 8), and 1 x 16, at 4 and 8 warps, three and four pipeline stages, graph replay, one process, the
configurations replayed in interleaved rounds; the model's choice first. argv: out.json"""
import json, sys
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings


def make(case):
    base = ft._table_choice(case)
    out = [base]
    for heads, warps, blocks, stages in ((32, 4, 16, 3), (32, 4, 16, 4), (32, 8, 16, 3), (32, 8, 16, 4), (16, 4, 16, 4),
                                         (8, 4, 32, 4), (32, 4, 32, 4), (32, 4, 8, 4)):
        c = base._replace(block_h=heads, num_warps=warps, token_blocks=blocks, stages=stages)
        if c not in out:
            out.append(c)
    return out


ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[2:] or ["qknorm-backward-b4-s4096"]:
    print("model:", ft._table_choice(by[name]), flush=True)
    doc[name] = ft.tune([by[name]], timer, "cuda")
json.dump(doc, open(sys.argv[1], "w"), default=str, indent=1)
