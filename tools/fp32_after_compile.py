"""fp32 case: does running torch.compile first change how fast the other kernels run in the same process?

    python tools/fp32_after_compile.py

Times Liger, ropekit (in place and out of place) and the v4 launcher with the benchmark's graph clock, then compiles
and runs a trivial function with torch.compile (inductor), then times the same prepared calls again, and calls
built afresh (new buffers); then times torch.compile of the eager formula (what the benchmark runs just before
Liger) and everything once more. docs/gpu-runs/run18.
"""

import torch

from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables
from ropekit.bench.timing import GpuTimer, Settings

case = select_cases(names=["fp32"])[0]
timer = GpuTimer(Settings())
tables = make_tables(case, "cuda")
impls = {i.name: i for i in make_impls(".peers")}
names = ["liger", "ropekit-inplace", "ropekit", "triton-v4"]


def build(seed):
    return {n: impls[n].build(case, tables, make_data(case, "cuda", seed), "forward").fn for n in names}


def times(fns, label):
    for name, fn in fns.items():
        fn()
        print(f"{label:34s} {name:16s} {timer.graph_us([fn], 44.7)[0]:6.1f} us", flush=True)


before = build(1)
times(before, "before any torch.compile")
f = torch.compile(lambda x: x * 2 + 1)
f(torch.randn(1024, device="cuda"))
torch.cuda.synchronize()
times(before, "after torch.compile, same buffers")
times(build(2), "after torch.compile, new buffers")
# now what the benchmark does before Liger: build and time torch.compile of the eager formula on this case
compiled = impls["torch-compile"].build(case, tables, make_data(case, "cuda", 3), "forward").fn
times({"torch-compile": compiled}, "the compiled formula")
times(before, "after the compiled formula, old buffers")
times(build(4), "after the compiled formula, new buffers")
