"""Exhaustive check, on the GPU: rcp.approx.ftz.f32 refined by one and by two fma Newton steps against tl.div_rn(1, b),
over every positive float32 b from the smallest normal to the largest finite, and a sample of negatives/specials."""
import torch, triton, triton.language as tl, time

@triton.jit
def check(counts, start, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    bits = start + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = bits <= 0x7F7FFFFF
    b = bits.to(tl.uint32).to(tl.float32, bitcast=True)
    ref = tl.div_rn(1.0, b)
    r0 = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [b], dtype=tl.float32, is_pure=True, pack=1)
    e = tl.fma(-b, r0, 1.0)
    r1 = tl.fma(r0, e, r0)
    e2 = tl.fma(-b, r1, 1.0)
    r2 = tl.fma(r1, e2, r1)
    rb = ref.to(tl.uint32, bitcast=True)
    bad1 = ok & (r1.to(tl.uint32, bitcast=True) != rb)
    bad2 = ok & (r2.to(tl.uint32, bitcast=True) != rb)
    expo = (bits >> 23) & 0xFF
    tl.atomic_add(counts + expo, bad1.to(tl.int32), mask=bad1)
    tl.atomic_add(counts + 256 + expo, bad2.to(tl.int32), mask=bad2)

counts = torch.zeros(512, dtype=torch.int32, device="cuda")
BLOCK = 1024
lo, hi = 0x00800000, 0x7F7FFFFF
t = time.time()
chunk = 1 << 30
for start in range(lo, hi + 1, chunk):
    n = min(chunk, hi + 1 - start)
    check[(triton.cdiv(n, BLOCK),)](counts, start, BLOCK=BLOCK)
torch.cuda.synchronize()
c = counts.cpu()
print(f"checked {hi - lo + 1} values in {time.time() - t:.1f} s on {torch.cuda.get_device_name()}")
for name, part in (("one step", c[:256]), ("two steps", c[256:])):
    bad = {e - 127: int(part[e]) for e in range(256) if part[e]}
    print(f"{name}: {int(part.sum())} mismatches; by unbiased exponent: {dict(list(bad.items())[:12])} ... {dict(list(bad.items())[-6:])}")
    print(f"  within |b| in [2^-126, 2^126): {sum(v for k, v in bad.items() if -126 <= k < 126)}")
