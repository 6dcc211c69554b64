"""Does programmatic dependent launch (PDL) shorten back-to-back kernels under graph replay? Floor and copy kernels."""
import json, os, statistics, sys, time
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_wait, gdc_launch_dependents

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
dev = "cuda"

@triton.jit
def chain(positions_ptr, table_ptr, out_ptr, ROW: tl.constexpr, WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER == 1:
        gdc_launch_dependents()
    if WAIT:
        gdc_wait()
    if TRIGGER == 2:
        gdc_launch_dependents()
    i = tl.program_id(0)
    position = tl.load(positions_ptr + i)
    columns = tl.arange(0, ROW)
    row = tl.load(table_ptr + position * ROW + columns)
    tl.store(out_ptr + i * ROW + columns, row)

@triton.jit
def copy(x_ptr, y_ptr, BLOCK: tl.constexpr, WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER:
        gdc_launch_dependents()
    if WAIT:
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))

@triton.jit
def add_one(x_ptr, BLOCK: tl.constexpr, WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER:
        gdc_launch_dependents()
    if WAIT:
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

MODES = {"plain": (False, False, False), "pdl-wait": (True, True, False), "pdl-trigger-wait": (True, True, True),
         "wait-no-pdl": (False, True, False), "pdl-wait-trigger": (True, True, 2)}

def floor_call(mode):
    pdl, wait, trig = MODES[mode]
    pos = torch.randint(0, 8192, (64,), device=dev); table = torch.randn(8192, 64, device=dev)
    out = torch.empty(64, 64, device=dev)
    def f():
        chain[(64,)](pos, table, out, ROW=64, WAIT=wait, TRIGGER=trig, num_warps=1, launch_pdl=pdl)
    f(); torch.cuda.synchronize(); assert torch.equal(out, table[pos])
    return f

def copy_call(mode, sets):
    pdl, wait, trig = MODES[mode]
    n = 4 * 4096 * 40 * 128  # the Llama prefill's q and k elements, bf16
    bufs = [(torch.randn(n, device=dev, dtype=torch.bfloat16), torch.empty(n, device=dev, dtype=torch.bfloat16))
            for _ in range(sets)]
    state = [0]
    def f():
        x, y = bufs[state[0] % sets]; state[0] += 1
        copy[(n // 1024,)](x, y, BLOCK=1024, WAIT=wait, TRIGGER=trig, num_warps=4, launch_pdl=pdl)
    f(); torch.cuda.synchronize(); x, y = bufs[0]; assert torch.equal(x, y)
    return f

def graph_of(f, calls):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): f()
    torch.cuda.synchronize()
    return g

def replay_us(g, calls, reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        a.record(); g.replay(); b.record(); b.synchronize(); out.append(a.elapsed_time(b) * 1e3 / calls)
    return out

res = {"device": torch.cuda.get_device_name()}
MODES_ALL = MODES
# correctness: in-place +1 chained under a graph with PDL trigger-at-top: must count exactly
for mode in ():
    pdl, wait, trig = MODES[mode]
    x = torch.zeros(1 << 24, device=dev)
    f = lambda: add_one[(x.numel() // 1024,)](x, BLOCK=1024, WAIT=wait, TRIGGER=trig, num_warps=4, launch_pdl=pdl)
    g = graph_of(f, 50); x.zero_(); g.replay(); torch.cuda.synchronize()
    res[f"count-{mode}"] = [float(x.min()), float(x.max())]
    x.zero_(); [f() for _ in range(50)]; torch.cuda.synchronize(); res[f"count-eager-{mode}"] = [float(x.min()), float(x.max())]
print(res, flush=True)

for name, make, calls, reps in (("floor", floor_call, 128, 200),):
    graphs = {m: graph_of(make(m), calls) for m in MODES}
    samples = {m: [] for m in MODES}
    for r in range(5):
        for m in MODES:
            samples[m] += replay_us(graphs[m], calls, reps)
    res[name] = {m: statistics.median(v) for m, v in samples.items()}
    print(name, res[name], flush=True)
    del graphs

# eager host cost of a PDL launch: 2000 back-to-back floor calls
for m in MODES:
    f = floor_call(m)
    for _ in range(200): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(2000): f()
    torch.cuda.synchronize(); res.setdefault("eager-floor", {})[m] = (time.perf_counter() - t) / 2000 * 1e6
print(res["eager-floor"], flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "pdl_probe.json"), "w"), indent=1)
