"""Eager A/B: the eager benchmark's decode and small-prefill calls (ropekit.bench.eager.OPS) built by this tree and by
the exported base (.ab/ropekit_base), timed in interleaved rounds in one process: each round times 1000 back-to-back
calls of every (version, call), one synchronisation at its end. Median of the rounds, µs a call."""
import statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
import ropekit_base.bench.eager as EB
import ropekit.bench.eager as E

DEV = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
N, R = (1000 if DEV == "cuda" else 2), int(sys.argv[1]) if len(sys.argv) > 1 else 9
WANT = ("apply_rope", "apply_rope (in place)", "Liger rope", "rope_and_cache", "rope_and_cache + QK-norm",
        "apply_rope + index_copy_ (latent cache)",
        "rope_and_cache, float8 cache", "qk_norm_rope", "mla_rope_and_cache", "apply_rope + index_copy_ x2")
print(torch.cuda.get_device_name() if DEV == "cuda" else "cpu", flush=True)
with torch.no_grad():
    for case_new, case_base in zip(E.CASES, EB.CASES):
        fns = {}
        for mod, case, tag in ((EB, case_base, "base"), (E, case_new, "new")):
            for op in mod.OPS:
                if op.name in WANT and not (tag == "base" and op.name in ("Liger rope", "apply_rope + index_copy_ x2", "apply_rope + index_copy_ (latent cache)")):
                    try:
                        fns[tag, op.name] = op.make(".peers")(case, DEV).fn
                    except Exception as error:  # noqa: BLE001
                        print("not built:", tag, op.name, error)
        for fn in fns.values():
            for _ in range(100 if DEV == "cuda" else 1):
                fn()
        sync()
        samples = {k: [] for k in fns}
        for _ in range(R):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(N):
                    fn()
                sync()
                samples[k].append((time.perf_counter() - t0) / N * 1e6)
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"## {case_new.name}")
        for name in WANT:
            b, n = med.get(("base", name)), med.get(("new", name))
            if n is None:
                continue
            if b is None:
                print(f"{name:40s} {'':>12s}  new {n:7.2f}")
            else:
                print(f"{name:40s} base {b:7.2f}  new {n:7.2f}  new/base {n / b:.3f}", flush=True)
