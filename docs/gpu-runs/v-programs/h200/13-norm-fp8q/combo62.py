"""Session 62: the per-(token, head) prefill rule on shapes the benchmark lacks: with a per-head QK-norm (Qwen3's), with a
float8 q; forced tiles, graph replay. Argument --tiny: on a CPU (interpreter), checked only."""
import dataclasses, sys
import torch
from ropekit.bench import fused_tune
from ropekit.bench.fused_cases import CASES, tiny
from ropekit.triton.fused import FusedConfig

base = {c.name: c for c in CASES}["prefill-b4-s4096-int8-token-head"]
cases = [dataclasses.replace(base, name="prefill-int8-th+qknorm", qk_norm=True),
         dataclasses.replace(base, name="prefill-int8-th+fp8-q", q_dtype=torch.float8_e4m3fn)]
E = dict(evict_first=True, heads_inner=True)
PLAN = [FusedConfig(2, 16, 4, **E, v_apart=True), FusedConfig(2, 16, 4, **E), FusedConfig(2, 32, 4, **E),
        FusedConfig(2, 32, 4, **E, v_apart=True)]
if "--tiny" in sys.argv:
    for case in cases:
        fused_tune.candidates = lambda c: PLAN
        fused_tune.tune_case(tiny(case), None, "cpu", None)
else:
    from ropekit.bench.timing import GpuTimer, Settings
    timer = GpuTimer(Settings())
    ceiling = timer.copy_ceiling()["gbps"]
    print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
    for case in cases:
        fused_tune.candidates = lambda c: PLAN
        fused_tune.tune_case(case, timer, "cuda", ceiling)
