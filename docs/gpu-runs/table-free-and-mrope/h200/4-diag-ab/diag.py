"""Diagnose two GPU-only test failures: the compiled in-place MLA step (which of compiled and eager departs from the
float64 reference) and rope_quantize_fp8 with an e5m2 GQA q (which output holds infinities, against the native
backend)."""
import sys, torch, ropekit
sys.path.insert(0, "tests")
from ropekit import reference as ref
import test_fused_mla as T
import test_engines as E
DEVICE = "cuda"
for name in list(T.MLA_CAPTURED):
    q_pe, k_pe, kv_c, caches, by, positions, scale = T.mla_captured_case(name, 5, 2, 16, 32, 12, 4, 32)
    cos, sin = T.yarn_tables(16, 32, DEVICE)
    q0 = q_pe.clone()
    pair = isinstance(caches, tuple)
    eager = (q_pe.clone(), k_pe.clone(), tuple(c.clone() for c in caches) if pair else caches.clone())
    def step(q_pe, k_pe, kv_c, caches, by, positions, scale):
        out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, positions=positions, cos=cos, sin=sin,
                                                  kv_cache_scale=scale, **by)
        return out_q.float() * 2
    want = step(eager[0], eager[1], kv_c, eager[2], by, positions, scale)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="inductor")(q_pe, k_pe, kv_c, caches, by, positions, scale)
    truth = ref.rope_table(q0, cos, sin, positions[:5].cpu(), interleaved=True) * 2
    print(name, "compiled==eager", torch.equal(got, want), "compiled-ref", float((got.double().cpu() - truth).abs().max()),
          "eager-ref", float((want.double().cpu() - truth).abs().max()), "q_pe mutated==eager", torch.equal(q_pe, eager[0]),
          "q_pe-ref", float((q_pe.double().cpu() * 2 - truth).abs().max()), "returned==2*q0", torch.equal(got, q0.float() * 2),
          flush=True)
# rope_quantize_fp8, GQA, e5m2
for dtype in (torch.float8_e5m2, torch.float8_e4m3fn):
    parts = E.quantise_parts(64, 32, 8, 64, 64, False)
    for x in parts.values():
        x.copy_(torch.randn_like(x) * 4)
    csc = E.cache_like_vllm(8192, 64, torch.float32)
    pos = torch.randint(0, 8192, (64,), device=DEVICE)
    outs = {}
    for backend in ("triton", "native"):
        with ropekit.device.set_backend(backend):
            outs[backend] = ropekit.rope_quantize_fp8(*parts.values(), csc, pos, True, dtype, quant_scale_q=4.0,
                                                      quant_scale_kv=8.0)
    for i, nm in enumerate(("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")):
        a, b = outs["triton"][i], outs["native"][i]
        print(dtype, nm, a.dtype, b.dtype, "equal", torch.equal(a.view(torch.uint8), b.view(torch.uint8)),
              "inf", int(a.float().isinf().sum()), int(b.float().isinf().sum()), "max", float(a.float().abs().max()),
              flush=True)
