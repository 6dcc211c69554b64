"""The per-head QK-norm backward (Qwen3) around 1 token x 16 heads a step (16 values a thread at 4 warps: 16-byte
copies): its token blocks and pipeline stages, and 2 tokens x 8 heads, graph replay, one process, the configurations
replayed in interleaved rounds; the model's choice first. argv: out.json"""
import json, sys
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings


def make(case):
    base = ft._table_choice(case)
    out = [base]
    for tokens, heads, blocks, stages in ((1, 16, 16, 4), (1, 16, 32, 4), (1, 16, 8, 4), (1, 16, 16, 5), (1, 16, 32, 3),
                                          (1, 16, 32, 5), (1, 8, 16, 4), (2, 8, 8, 4), (2, 8, 16, 4), (2, 8, 8, 3)):
        c = base._replace(block_s=tokens, block_h=heads, token_blocks=blocks, stages=stages)
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
