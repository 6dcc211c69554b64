"""Graph-replay time of the launch-chain floor kernel (64 programs: position -> table row -> store) against the bytes
of kernel parameters it is passed: extra int32 arguments the kernel reads into one masked store (so none is dead)."""
import sys, torch, triton, triton.language as tl
from ropekit.bench.timing import GpuTimer, Settings

@triton.jit
def chain(POS, TAB, OUT, extra, N_EXTRA: tl.constexpr):
    i = tl.program_id(0)
    p = tl.load(POS + i)
    cols = tl.arange(0, 64)
    row = tl.load(TAB + p * 64 + cols)
    acc = 0
    for j in tl.static_range(N_EXTRA):
        acc += extra[j]
    tl.store(OUT + i * 64 + cols, row + (acc == -7).to(tl.float32))

dev = "cuda"
pos = torch.randint(0, 8192, (64,), device=dev)
tab = torch.randn(8192, 64, device=dev)
out = torch.empty(64, 64, device=dev)
timer = GpuTimer(Settings())
fns = []
for n in (0, 4, 8, 16, 24, 32, 48):
    extra = tuple(1000003 + 7 * j for j in range(n))  # distinct, not 1, not divisible by 16: real parameters
    f = (lambda extra=extra, n=n: chain[(64,)](pos, tab, out, extra, N_EXTRA=n))
    f()
    fns.append((n, f))
caps = [timer.capture([f], 1.0) for _, f in fns]
res = timer.replay_rounds(caps)
for (n, _), (median, spread, calls) in zip(fns, res):
    print(f"extra int32 {n:3d} (+{4*n:4d} B): {median:.3f} us  spread {spread:.3f}  calls {calls}")
