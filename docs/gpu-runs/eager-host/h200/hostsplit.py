"""Where an eager decode call's host time goes on the GPU's host: the eager benchmark's decode calls taken apart.
Each row: the median of 7 rounds of 1000 back-to-back calls, one synchronisation at a round's end, µs a call."""
import cProfile, io, pstats, statistics, sys, time
import torch, triton, triton.language as tl
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
    return statistics.median(samples), min(samples)

rows = []
def row(name, fn, note=""):
    try:
        med, best = clock(fn)
    except Exception as e:  # noqa
        print(f"{name}: failed: {type(e).__name__}: {e}", flush=True); return
    rows.append((name, med, best, note))
    print(f"{name:58s} {med:7.2f} (best {best:6.2f}) {note}", flush=True)

case = eager.CASES[0]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, sys.version.split()[0], case.name, flush=True)
with torch.no_grad():
    calls = {}
    for op in eager.OPS:
        if op.name in ("apply_rope", "apply_rope (in place)", "Liger rope", "rope_and_cache", "qk_norm_rope",
                       "apply_rope + index_copy_ x2"):
            try:
                calls[op.name] = op.make(".peers")(case, "cuda").fn
            except Exception as e:  # noqa
                print("no", op.name, e)
    for name, fn in calls.items():
        row(name, fn)
    # the launch the in-place call makes, recorded once, then replayed without the Python path
    seen = []
    real = L._launch
    L._launch = lambda l, v: (seen.append((l, v)), real(l, v))
    calls["apply_rope (in place)"](); calls["apply_rope"]()
    L._launch = real
    (lin, vin), (lout, vout) = seen[-2], seen[-1]
    print("runtime arguments: in place", len(lin.runtime(*vin)), "out of place", len(lout.runtime(*vout)),
          "per-call values", len(vin), len(vout), flush=True)
    row("launch alone (_run_direct), in place's", lambda: L._run_direct(lin, vin))
    row("launch alone (_run_direct), out of place's", lambda: L._run_direct(lout, vout))
    entry = L._runners[(lin.key, L._specialisation(vin))]
    runner, conv = entry
    args = (lin.everything if conv else lin.runtime)(*vin)
    stream = L._current_stream
    row("compiled runner alone, arguments assembled", lambda: runner(*args, stream=stream()))
    row("argument assembly alone (launch.runtime)", lambda: lin.runtime(*vin))
    L._launch = lambda l, v: None
    row("apply_rope, launch replaced by nothing", calls["apply_rope"])
    row("apply_rope (in place), launch replaced by nothing", calls["apply_rope (in place)"])
    row("rope_and_cache, launch replaced by nothing", calls["rope_and_cache"])
    L._launch = real
    q = vin[0] if isinstance(vin[0], torch.Tensor) else None
    qs = [v for v in vin if isinstance(v, torch.Tensor) and v.dim() == 4]
    qq, kk = qs[0], qs[1]
    row("torch.empty x2 (q's and k's shapes)", lambda: (torch.empty(qq.shape, dtype=qq.dtype, device=qq.device),
                                                       torch.empty(kk.shape, dtype=kk.dtype, device=kk.device)))
    row("torch.empty_like x2 (contiguous_format)", lambda: (
        torch.empty_like(qq, memory_format=torch.contiguous_format),
        torch.empty_like(kk, memory_format=torch.contiguous_format)))
    import ropekit.api as api
    old = api.new_output
    api.new_output = lambda x: torch.empty_like(x, memory_format=torch.contiguous_format)
    row("apply_rope, outputs by empty_like", calls["apply_rope"])
    api.new_output = old
    row("apply_rope, outputs by torch.empty (again)", calls["apply_rope"])
    row("q.mul_(1.0) (one ATen kernel launch)", lambda: qq.mul_(1.0))

    @triton.jit
    def nop(X, n):
        pass
    x = torch.zeros(1, device="cuda")
    c = nop[(64,)](x, 1)
    try:
        r0 = c[(64, 1, 1)]
        r0(x, 1, stream=stream()); torch.cuda.synchronize()
        row("empty Triton kernel, 2 arguments, compiled runner", lambda: r0(x, 1, stream=stream()))
        wide = (x,) * 24 + (1,) * 24
        @triton.jit
        def nop48(A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16, A17, A18, A19, A20, A21,
                  A22, A23, B0, B1, B2, B3, B4, B5, B6, B7, B8, B9, B10, B11, B12, B13, B14, B15, B16, B17, B18, B19, B20,
                  B21, B22, B23):
            pass
        c48 = nop48[(64,)](*wide)
        r48 = c48[(64, 1, 1)]
        row("empty Triton kernel, 24 pointers + 24 ints, compiled runner", lambda: r48(*wide, stream=stream()))
    except Exception as e:  # noqa
        print("runner probe failed:", e)
    row("empty Triton kernel, 2 arguments, JIT entry", lambda: nop[(64,)](x, 1))
    for name in ("apply_rope", "apply_rope (in place)"):
        pr = cProfile.Profile(); pr.enable()
        for _ in range(3000):
            calls[name]()
        pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14); print(name, s.getvalue()[-3500:])
