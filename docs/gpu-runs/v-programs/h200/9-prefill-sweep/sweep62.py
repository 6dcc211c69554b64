"""Session 62 exploration: forced tiles (v apart on the reduced-scale prefills; the float8 q's tokens) by graph replay."""
import sys
import torch
from ropekit.bench import fused_tune
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.fused import FusedConfig

E = dict(evict_first=True, heads_inner=True)
def cfgs(*tiles):
    return [FusedConfig(s, h, w, **E, v_apart=v) for (s, h, w, v) in tiles]

PLAN = {
    "prefill-b4-s4096-nvfp4": cfgs((2, 32, 4, False), (2, 32, 4, True), (2, 16, 4, True), (1, 32, 4, True),
                                   (4, 32, 4, True), (4, 16, 4, True), (2, 32, 8, True), (1, 32, 4, False)),
    "prefill-b4-s4096-int8-token-head": cfgs((2, 32, 4, False), (2, 32, 4, True), (2, 16, 4, True),
                                             (1, 32, 4, True), (4, 16, 4, True), (4, 32, 4, True)),
    "prefill-b4-s4096-fp8-token-head": cfgs((2, 32, 4, False), (2, 32, 4, True), (2, 16, 4, True),
                                            (1, 32, 4, True), (4, 16, 4, True), (4, 32, 4, True)),
    "prefill-b4-s4096-fp8-q": cfgs((2, 16, 4, False), (4, 16, 4, False), (4, 8, 4, False), (4, 32, 4, False),
                                   (8, 16, 4, False), (4, 16, 8, False), (8, 8, 4, False)),
    "prefill-b4-s4096-e5m2": cfgs((2, 16, 4, False), (1, 32, 4, False), (4, 16, 4, False), (2, 32, 4, False)),
    "prefill-b4-s4096": cfgs((2, 16, 4, False), (4, 16, 4, False), (1, 16, 4, False)),
}
names = sys.argv[1:] or list(PLAN)
by_name = {c.name: c for c in CASES}
timer = GpuTimer(Settings())
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
for name in names:
    fused_tune.candidates = lambda case, _n=name: [fused_tune._table_choice(case)] + [c for c in PLAN[_n] if c != fused_tune._table_choice(case)]
    fused_tune.tune_case(by_name[name], timer, "cuda", ceiling)
