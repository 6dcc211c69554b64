"""What a kernel's parameters cost a decode-sized launch under graph replay: the launch-chain floor's kernel (64
programs: a position, then its table row, then a store) with N extra int32 parameters (values that Triton does not
specialise: not 1, not multiples of 16) or N extra pointers, at 1 and at 4 warps, and at 320 programs (the fused
decode's grid: 64 tokens x 5 head blocks). One process; every variant captured and replayed in interleaved rounds
(ropekit.bench's harness). Usage: python param_cost.py [--rounds 7]"""
import argparse, importlib.util, sys, tempfile
from pathlib import Path
import torch

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=7)
a = p.parse_args()

EXTRA = (0, 8, 16, 32, 48)
src = ["import triton", "import triton.language as tl", ""]
for n in EXTRA:
    ints = "".join(f", a{i}" for i in range(n))
    use = " + ".join(f"a{i}" for i in range(n)) or "0"
    src += ["@triton.jit",
            f"def ints{n}(positions_ptr, table_ptr, out_ptr{ints}, ROW: tl.constexpr, USE: tl.constexpr):",
            "    i = tl.program_id(0)",
            "    position = tl.load(positions_ptr + (i % 64))",
            "    columns = tl.arange(0, ROW)",
            "    row = tl.load(table_ptr + position * ROW + columns)",
            f"    if USE:",
            f"        row += ({use}) * 0.0",
            "    tl.store(out_ptr + i * ROW + columns, row)", ""]
    ptrs = "".join(f", p{i}" for i in range(n))
    src += ["@triton.jit",
            f"def ptrs{n}(positions_ptr, table_ptr, out_ptr{ptrs}, ROW: tl.constexpr):",
            "    i = tl.program_id(0)",
            "    position = tl.load(positions_ptr + (i % 64))",
            "    columns = tl.arange(0, ROW)",
            "    row = tl.load(table_ptr + position * ROW + columns)",
            "    tl.store(out_ptr + i * ROW + columns, row)", ""]
path = Path(tempfile.mkdtemp()) / "param_kernels.py"
path.write_text("\n".join(src))
spec = importlib.util.spec_from_file_location("param_kernels", path)
K = importlib.util.module_from_spec(spec); spec.loader.exec_module(K)

from ropekit.bench.timing import GpuTimer, Settings
timer = GpuTimer(Settings(graph_ms=20.0, graph_rounds=a.rounds))
dev = "cuda"
g = torch.Generator().manual_seed(0)
positions = torch.randint(0, 8192, (64,), generator=g).to(dev)
table = torch.randn(8192, 64, generator=g).to(dev)
out = torch.empty(320, 64, device=dev)
dummies = [torch.empty(16, device=dev) for _ in range(max(EXTRA))]
ints = [3 + 2 * i for i in range(max(EXTRA))]  # odd, not 1: passed as int32, not specialised

def call(kind, n, programs, warps, use=False):
    kernel = getattr(K, f"{kind}{n}")
    extra = ints[:n] if kind == "ints" else dummies[:n]
    kw = dict(ROW=64, num_warps=warps)
    if kind == "ints":
        kw["USE"] = use
    return lambda: kernel[(programs,)](positions, table, out, *extra, **kw)

rows = []
for programs, warps in ((64, 1), (64, 4), (320, 4)):
    for kind in ("ints", "ptrs"):
        for n in EXTRA:
            rows.append((f"{programs} programs, {warps} warps, {n:2d} extra {kind}", call(kind, n, programs, warps)))
for _, fn in rows:
    fn()
torch.cuda.synchronize()
graphs = [timer.capture([fn], 1.5) for _, fn in rows]
results = timer.replay_rounds(graphs)
print(torch.cuda.get_device_name(), flush=True)
base = {}
for (name, _), (median, spread, calls) in zip(rows, results):
    key = name.split(", ")[0] + name.split(", ")[1] + name.split(" extra ")[1]
    base.setdefault(key, median)
    print(f"{name:44s} {median:7.3f} us  (+{median - base[key]:6.3f})  spread {spread:.3f}", flush=True)
