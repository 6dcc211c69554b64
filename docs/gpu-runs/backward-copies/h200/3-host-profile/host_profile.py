"""The eager ops' host path on the GPU's host: each op's call from the eager benchmark (decode b64), timed over
back-to-back calls and then profiled (cProfile, by own time). argv: op names (default: four)."""
import cProfile, pstats, statistics, sys, time
import torch
from ropekit.bench import eager
torch.set_grad_enabled(False)
want = sys.argv[1:] or ["apply_rope (in place)", "qk_norm_rope", "rope_and_cache", "mla_rope_and_cache",
                        "apply_rope + index_copy_ (latent cache)"]
case = eager.CASES[0]
calls = {}
for op in eager._ops():
    if op.name in want:
        calls[op.name] = op.make(None)(case, "cuda").fn
print(case.name, list(calls))
for name, fn in calls.items():
    for _ in range(300): fn()
torch.cuda.synchronize()
times = {n: [] for n in calls}
for r in range(7):
    for n, fn in calls.items():
        t = time.perf_counter()
        for _ in range(2000): fn()
        torch.cuda.synchronize()
        times[n].append((time.perf_counter() - t) / 2000 * 1e6)
for n in calls:
    print(f"{n:30s} {statistics.median(times[n]):6.2f} us a call ({min(times[n]):.2f}-{max(times[n]):.2f})")
for n, fn in calls.items():
    pr = cProfile.Profile(); pr.enable()
    for _ in range(5000): fn()
    torch.cuda.synchronize(); pr.disable()
    print(f"==== {n}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
