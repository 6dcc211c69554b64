"""PDL against the grid's waves: a copy of 4-warp programs at 0.5-31 waves, plain / wait / release at start / at end."""
import json, os, statistics
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_wait, gdc_launch_dependents
print(torch.cuda.get_device_name(), triton.__version__, flush=True)

@triton.jit
def copy(x_ptr, y_ptr, BLOCK: tl.constexpr, WAIT: tl.constexpr, RELEASE: tl.constexpr):
    if RELEASE == 1:
        gdc_launch_dependents()
    if WAIT:
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))
    if RELEASE == 2:
        gdc_launch_dependents()

MODES = {"plain": (False, False, 0), "wait": (True, True, 0), "release-start": (True, True, 1),
         "release-end": (True, True, 2)}
sms = torch.cuda.get_device_properties(0).multi_processor_count
res = {"device": torch.cuda.get_device_name(), "sms": sms}

def graph_of(f, calls):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): f()
    return g

def replay(g, calls, reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        a.record(); g.replay(); b.record(); b.synchronize(); out.append(a.elapsed_time(b) * 1e3 / calls)
    return out

for waves in (0.25, 0.5, 1, 1.5, 2, 4, 8, 31):
    programs = max(1, int(sms * 16 * waves))
    n = programs * 1024
    sets = max(1, min(8, int(4 * 50e6 // (4 * n)) + 1))
    bufs = [(torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda", dtype=torch.bfloat16))
            for _ in range(sets)]
    calls = max(16, min(512, int(3e-4 / (4 * n / 4.2e12))))
    graphs = {}
    for m, (pdl, wait, rel) in MODES.items():
        st = [0]
        def f(pdl=pdl, wait=wait, rel=rel, st=st):
            x, y = bufs[st[0] % sets]; st[0] += 1
            copy[(programs,)](x, y, BLOCK=1024, WAIT=wait, RELEASE=rel, num_warps=4, launch_pdl=pdl)
        graphs[m] = graph_of(f, calls)
    torch.cuda.synchronize()
    samples = {m: [] for m in MODES}
    for r in range(5):
        for m in MODES:
            samples[m] += replay(graphs[m], calls, 10)
    row = {m: round(statistics.median(v), 3) for m, v in samples.items()}
    res[str(waves)] = row
    print(waves, programs, sets, calls, row, flush=True)
    del graphs, bufs
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "pdl_waves.json"), "w"), indent=1)
