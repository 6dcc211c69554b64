"""Where an eager decode call's host time goes on the GPU's host, every fused op beside apply_rope: the whole call,
its Python path with the launch replaced by assembling its arguments, the launch alone (_run_direct, the call's
recorded values), the compiled runner alone. Median of 7 rounds of 1000 calls, one sync a round, us a call."""
import cProfile, io, pstats, statistics, sys, time
import torch, triton
import ropekit
from ropekit.bench import eager
from ropekit.triton import launch as L

N, R = 1000, 7
def clock(fn):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(R):
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / N * 1e6)
    return statistics.median(samples)

case = eager.CASES[int(sys.argv[1]) if len(sys.argv) > 1 else 0]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, sys.version.split()[0], case.name, flush=True)
names = ["apply_rope", "apply_rope (in place)", "Liger rope", "rope_and_cache", "rope_and_cache + QK-norm",
         "rope_and_cache, float8 cache", "qk_norm_rope", "mla_rope_and_cache", "apply_rope + index_copy_ x2",
         "apply_rope + index_copy_ (latent cache)"]
real = L._launch
with torch.no_grad():
    calls = {op.name: op.make(".peers")(case, "cuda").fn for op in eager.OPS if op.name in names}
    for name, fn in calls.items():
        whole = clock(fn)
        seen = []
        L._launch = lambda l, v: seen.append((l, v))
        fn()
        L._launch = lambda l, v: l.runtime(*v)
        python = clock(fn) if seen else float("nan")
        L._launch = real
        parts = ""
        for l, v in seen:
            direct = clock(lambda: L._run_direct(l, v))
            entry = l.runners.get(L._specialisation(v))
            if entry is None or entry[1] in (None, "jit"):
                parts += f" | {l.kernel.__name__}: direct {direct:.2f}"
                continue
            runner, conv = entry
            args = (l.everything if conv else l.runtime)(*v)
            stream = L._current_stream
            alone = clock(lambda: runner(*args, stream=stream()))
            parts += (f" | {l.kernel.__name__} ({len(args)} args, {sum(isinstance(a, tuple) for a in args)} tuples):"
                      f" direct {direct:.2f}, runner {alone:.2f}")
        print(f"{name:42s} whole {whole:6.2f}  python(no launch) {python:6.2f}{parts}", flush=True)
    for name in ("rope_and_cache", "mla_rope_and_cache"):
        pr = cProfile.Profile(); pr.enable()
        for _ in range(3000):
            calls[name]()
        pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(name, s.getvalue()[-5000:])
