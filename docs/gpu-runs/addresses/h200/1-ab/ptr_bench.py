"""What Triton's compiled launcher costs a pointer argument: a kernel of 10 pointer arguments launched directly
(compiled.run, no hooks, the current stream), given the tensors against their data pointers as ints; 20000
back-to-back launches, one sync, 7 interleaved runs, medians."""
import statistics, time, torch, triton, triton.language as tl

@triton.jit
def k10(a, b, c, d, e, f, g, h, i, j, n):
    pid = tl.program_id(0)
    x = tl.load(a + pid)
    tl.store(b + pid, x)

ts = [torch.randn(1024, device="cuda") for _ in range(10)]
compiled = k10[(1,)](*ts, 1024)
torch.cuda.synchronize()
runner = compiled[(1, 1, 1)]
run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
stream = torch.cuda.current_stream().cuda_stream
ints = [t.data_ptr() for t in ts]
def with_tensors():
    run(1, 1, 1, stream, fn, meta, None, None, None, *ts, 1024)
def with_ints():
    run(1, 1, 1, stream, fn, meta, None, None, None, *ints, 1024)
def data_ptrs_then_ints():
    run(1, 1, 1, stream, fn, meta, None, None, None, *[t.data_ptr() for t in ts], 1024)
fns = dict(tensors=with_tensors, ints=with_ints, data_ptrs_then_ints=data_ptrs_then_ints)
N = 20000
res = {k: [] for k in fns}
for f in fns.values():
    for _ in range(2000): f()
torch.cuda.synchronize()
for r in range(7):
    for k, f in fns.items():
        t = time.perf_counter()
        for _ in range(N): f()
        torch.cuda.synchronize()
        res[k].append((time.perf_counter() - t) / N * 1e6)
print(torch.cuda.get_device_name(), "triton", triton.__version__)
for k, v in res.items():
    print(f"{k:22s} {statistics.median(v):6.3f} us a launch (runs {min(v):.3f}-{max(v):.3f})")
m = {k: statistics.median(v) for k, v in res.items()}
print(f"per pointer, tensors - ints: {(m['tensors'] - m['ints']) / 10 * 1000:.0f} ns; "
      f"tensors - (data_ptr in Python, then ints): {(m['tensors'] - m['data_ptrs_then_ints']) / 10 * 1000:.0f} ns")
