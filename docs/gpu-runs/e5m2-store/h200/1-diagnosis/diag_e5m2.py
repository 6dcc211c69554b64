"""Where does rope_quantize_fp8's e5m2 GQA q get -inf? Each sequence of calls runs in this process; argv picks it."""
import os, sys, torch, ropekit, triton
sys.path.insert(0, "tests")
import test_engines as E
from ropekit.triton import launch as L
DEVICE = "cuda"
seq = sys.argv[1]
hook = "hook" in sys.argv
clear = "clear" in sys.argv
side = "side" in sys.argv
if hook:
    triton.knobs.runtime.launch_enter_hook = lambda *a: None
torch.manual_seed(0)
parts = E.quantise_parts(64, 32, 8, 64, 64, False)
csc = E.cache_like_vllm(8192, 64, torch.float32)
pos = torch.randint(0, 8192, (64,), device=DEVICE)
D = {"4": torch.float8_e4m3fn, "5": torch.float8_e5m2}
stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
for i, step in enumerate(seq.split(",")):
    dtype, given = D[step[0]], step[1] == "g"
    for x in parts.values():
        x.copy_(torch.randn_like(x) * 4)
    pos.copy_(torch.randint(0, 8192, (64,), device=DEVICE))
    outs = [torch.empty(x.shape, device=DEVICE, dtype=dtype) for x in parts.values()] if given else [None] * 4
    if clear:
        L.plans.clear()
    with torch.cuda.stream(stream):
        got = ropekit.rope_quantize_fp8(*parts.values(), csc, pos, True, dtype, quant_scale_q=4.0, quant_scale_kv=8.0,
                                        q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    torch.cuda.synchronize()
    with ropekit.device.set_backend("native"):
        want = ropekit.rope_quantize_fp8(*parts.values(), csc, pos, True, dtype, quant_scale_q=4.0, quant_scale_kv=8.0)
    q = got[0].view(torch.uint8)
    bad = (q != want[0].view(torch.uint8))
    print(f"{seq} {' '.join(sys.argv[2:])} call {i} {step}: equal",
          [torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want)],
          "q inf", int(got[0].float().isinf().sum()), "bad q bytes", int(bad.sum()),
          "bad channels", sorted(set(bad.nonzero()[:, -1].tolist()))[:8],
          "bad values", sorted(set(q[bad].tolist()))[:6], flush=True)
