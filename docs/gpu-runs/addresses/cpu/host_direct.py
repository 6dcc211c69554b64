"""Host time of the eager ops' planned path on a CPU, through the direct launch: the first call plans (and runs under
the interpreter); then the interpreter flag is cleared, every runner lookup finds a fake entry whose launcher is a
Python no-op that reads each tensor's data_ptr (as Triton's C launcher does), and N calls are timed."""
import os, sys, time, cProfile, pstats, statistics
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from ropekit import device as D
from ropekit.bench import eager
from ropekit.triton import launch as L
torch.set_grad_enabled(False)
case = eager.CASES[int(os.environ.get("CASE", 0))]
N = int(os.environ.get("N", 20000))
want = sys.argv[1:]

def fake_run(*a):
    for x in a[9:]:
        if x is not None and type(x) is not int and type(x) is not float and hasattr(x, "data_ptr"):
            x.data_ptr()

FAKE = [lambda *a, **k: None, False, (fake_run, None, None)]
class AnyEntry(dict):
    def get(self, key, default=None):
        return FAKE
ops = []
for op in eager._ops():
    if want and op.name not in want: continue
    if op.kind in ("peer",) or "+" in op.name and "QK-norm" not in op.name and "fused" not in op.name: continue
    if op.name.startswith(("F.", "apply_rope +")): continue
    try:
        call = op.make(None)(case, "cpu")
    except Exception as e:
        print(f"{op.name:40s} skipped: {type(e).__name__}: {str(e)[:80]}"); continue
    ops.append((op.name, call.fn))
D.INTERPRET = False
L._runners = AnyEntry()
L._current_stream = lambda: 0
res = {n: [] for n, _ in ops}
for n, fn in ops:
    for _ in range(300): fn()
for r in range(5):
    for n, fn in ops:
        t = time.perf_counter()
        for _ in range(N): fn()
        res[n].append((time.perf_counter() - t) / N * 1e6)
for n, _ in ops:
    print(f"{n:40s} {statistics.median(res[n]):7.2f} us a call ({min(res[n]):.2f}-{max(res[n]):.2f})", flush=True)
prof = os.environ.get("PROF")
for n, fn in ops:
    if prof == n:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(N): fn()
        pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(22)
