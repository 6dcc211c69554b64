"""Session 62 exploration: the forward walking several token blocks a program, its loads software-pipelined (forced tiles, graph replay)."""
import sys
from ropekit.bench import fused_tune
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.fused import FusedConfig

def c(s, h, tb=1, st=1, w=4, v=False):
    return FusedConfig(s, h, w, True, True, tb, st, v)

PLAN = {
    "prefill-b4-s4096-olmo2": [c(1, 32), c(1, 32, 4, 2), c(1, 32, 8, 2), c(1, 32, 8, 3), c(1, 32, 16, 3), c(1, 32, 4, 3)],
    "prefill-b4-s4096": [c(2, 16), c(1, 16), c(2, 16, 8, 2), c(2, 16, 8, 3), c(1, 16, 16, 3), c(2, 8, 8, 3), c(1, 16, 8, 2)],
    "prefill-b4-s4096-qknorm": [c(4, 16), c(4, 16, 4, 2), c(2, 16, 8, 3), c(1, 16, 16, 3), c(4, 16, 4, 3)],
    "prefill-b4-s4096-fp8-q": [c(2, 16), c(4, 16), c(2, 16, 8, 3), c(4, 16, 4, 2), c(2, 16, 4, 2), c(1, 16, 16, 3)],
    "prefill-b4-s4096-nvfp4": [c(2, 32), c(2, 32, 8, 2), c(2, 32, 8, 3), c(1, 32, 16, 3), c(2, 16, 8, 3)],
    "prefill-b4-s4096-page-table": [c(2, 16), c(2, 16, 8, 3), c(1, 16, 16, 3)],
}
names = sys.argv[1:] or list(PLAN)
by_name = {k.name: k for k in CASES}
timer = GpuTimer(Settings())
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
for name in names:
    fused_tune.candidates = lambda case, _n=name: PLAN[_n]
    fused_tune.tune_case(by_name[name], timer, "cuda", ceiling)
