"""Session 62: where the eager fused ops' host time goes on the GPU machine: wall clock of N back-to-back calls, then
cProfile of N calls (decode b64)."""
import os, sys, time, cProfile, pstats, io
import torch
from ropekit.bench import eager
torch.set_grad_enabled(False)
case = eager.CASES[0]
N = int(os.environ.get("N", 3000))
names = ["apply_rope", "apply_rope (in place)", "rope_and_cache", "rope_and_cache + QK-norm",
         "rope_and_cache, float8 cache", "qk_norm_rope", "mla_rope_and_cache"]
for op in eager._ops():
    if op.name not in names:
        continue
    call = op.make(None)(case, "cuda")
    fn = call.fn
    for _ in range(300): fn()
    torch.cuda.synchronize()
    walls = []
    for r in range(5):
        t = time.perf_counter()
        for _ in range(N): fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) / N * 1e6)
    walls.sort()
    print(f"=== {op.name}: {walls[2]:.1f} us a call (runs {walls[0]:.1f}-{walls[-1]:.1f})", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(N): fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14); print(s.getvalue()[-3500:], flush=True)
