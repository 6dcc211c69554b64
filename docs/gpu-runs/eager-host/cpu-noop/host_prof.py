"""Host time of the eager ops' planned path on a CPU: the first call plans (and runs under the interpreter), then
the launch is replaced by a no-op and N calls are timed."""
import os, sys, time, cProfile, pstats
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from ropekit.bench import eager
from ropekit.triton import launch as L
torch.set_grad_enabled(False)
case = eager.CASES[0]
N = int(os.environ.get("N", 20000))
want = sys.argv[1:]
real = L._launch
for op in eager._ops():
    if want and op.name not in want:
        continue
    if op.kind in ("peer",):
        continue
    try:
        L._launch = real
        call = op.make(None)(case, "cpu")
    except Exception as e:
        print(f"{op.name:50s} skipped: {type(e).__name__}: {str(e)[:80]}"); continue
    L._launch = lambda launch, values: None
    fn = call.fn
    for _ in range(200): fn()
    t = time.perf_counter()
    for _ in range(N): fn()
    us = (time.perf_counter() - t) / N * 1e6
    print(f"{op.name:50s} {us:7.2f} us a call (launch a no-op)", flush=True)
    if os.environ.get("PROF") == op.name:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(N): fn()
        pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
L._launch = real
