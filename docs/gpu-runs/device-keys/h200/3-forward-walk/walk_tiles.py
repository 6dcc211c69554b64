"""The forward walking several token blocks a program, its loop software-pipelined (a working-tree probe: the
forward kernel's loop over TILE.TOKEN_BLOCKS at TILE.STAGES): each prefill case at the model's choice, then the
same tile at (token blocks, stages) from WALKS, graph replay, one process, interleaved rounds (fused_tune.tune).
argv: out.json [case ...]"""
import json, sys
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings

WALKS = {"prefill-b4-s4096-olmo2": ((4, 2), (4, 3), (8, 3), (16, 3), (8, 4), (16, 4)),
         "prefill-b4-s4096-qknorm": ((4, 2), (4, 3), (8, 3)),
         "prefill-b4-s4096": ((4, 2), (4, 3), (8, 3)),
         "prefill-b4-s4096-nvfp4": ((4, 3), (8, 3)),
         "prefill-b4-s4096-fp8-q": ((4, 3), (8, 3))}


def make(case):
    base = ft._table_choice(case)
    return [base] + [base._replace(token_blocks=g, stages=p) for g, p in WALKS[case.name]]


ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[2:] or list(WALKS):
    print("model:", name, ft._table_choice(by[name]), flush=True)
    doc[name] = ft.tune([by[name]], timer, "cuda")
    json.dump(doc, open(sys.argv[1], "w"), default=str, indent=1)
