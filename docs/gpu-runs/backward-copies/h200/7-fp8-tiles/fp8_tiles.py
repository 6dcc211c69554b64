"""The float8 caches' prefill at 2 and 4 tokens a program: at 2 tokens x 8 k heads (4 warps) a k program's thread
stores 8 bytes of each half of a float8 head vector (STG.E.EF.64 in the sm_90 SASS), at 4 tokens 16. Graph replay,
one process, each case's configurations replayed in interleaved rounds; the model's choice first. argv: out.json"""
import json, sys
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings


def make(case):
    base = ft._table_choice(case)
    out = [base]
    for tokens, heads in ((2, 16), (4, 16), (4, 8), (2, 8)):
        c = base._replace(block_s=tokens, block_h=heads)
        if c not in out:
            out.append(c)
    return out


ft.candidates = make
timer = GpuTimer(Settings())
by = {c.name: c for c in CASES}
doc = {}
for name in sys.argv[2:] or ["prefill-b4-s4096-fp8", "prefill-b4-s4096-fp8-q", "prefill-b4-s4096-e5m2",
                             "prefill-b4-s4096-fp8-head", "prefill-b4-s4096"]:
    print("model:", ft._table_choice(by[name]), flush=True)
    doc[name] = ft.tune([by[name]], timer, "cuda")
json.dump(doc, open(sys.argv[1], "w"), default=str, indent=1)
