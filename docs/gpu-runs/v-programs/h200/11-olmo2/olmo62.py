"""Session 62: OLMo-2's prefill and decode with v's heads in programs of their own (forced tiles, graph replay)."""
from ropekit.bench import fused_tune
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.fused import FusedConfig

PLAN = {
    "prefill-b4-s4096-olmo2": [FusedConfig(1, 32, 4, True, True), FusedConfig(1, 32, 4, True, True, v_apart=True),
                               FusedConfig(1, 32, 8, True, True, v_apart=True)],
    "decode-b64-olmo2": [FusedConfig(1, 32, 4), FusedConfig(1, 32, 4, v_apart=True)],
}
by_name = {k.name: k for k in CASES}
timer = GpuTimer(Settings())
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
for name in PLAN:
    fused_tune.candidates = lambda case, _n=name: PLAN[_n]
    fused_tune.tune_case(by_name[name], timer, "cuda", ceiling)
