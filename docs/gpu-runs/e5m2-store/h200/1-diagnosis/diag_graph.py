"""The failing test, step by step, outside pytest: which call first gives -inf in q's e5m2 output."""
import sys, torch, ropekit
sys.path.insert(0, "tests")
import test_engines as E
from capture import cuda_graph_of
DEVICE = "cuda"
dtype = {"4": torch.float8_e4m3fn, "5": torch.float8_e5m2}[sys.argv[1]]
torch.manual_seed(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
tokens, hq, hk, rope_dim, nope_dim = 64, 32, 8, 64, 64
parts = E.quantise_parts(tokens, hq, hk, rope_dim, nope_dim, False)
csc = E.cache_like_vllm(8192, rope_dim, torch.float32)
pos_ids = torch.randint(0, 8192, (tokens,), device=DEVICE)

def outputs():
    return [torch.empty(x.shape, device=DEVICE, dtype=dtype) for x in parts.values()]

graphed = outputs()
calls = []

def step(outs=graphed):
    got = ropekit.rope_quantize_fp8(*parts.values(), csc, pos_ids, True, dtype, quant_scale_q=4.0, quant_scale_kv=8.0,
                                    q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    if not torch.cuda.is_current_stream_capturing():
        report("call %d" % len(calls), got)
    calls.append(1)
    return got

def report(what, got):
    torch.cuda.synchronize()
    with ropekit.device.set_backend("native"):
        want = ropekit.rope_quantize_fp8(*parts.values(), csc, pos_ids, True, dtype, quant_scale_q=4.0,
                                         quant_scale_kv=8.0)
    out = []
    for name, a, b in zip(("q", "k", "qn", "kn"), got, want):
        a8, b8 = a.view(torch.uint8), b.view(torch.uint8)
        bad = a8 != b8
        diff = (a.float() - b.float()).abs()
        out.append(f"{name}: bad {int(bad.sum())} inf {int(a.float().isinf().sum())}/{int(b.float().isinf().sum())}"
                   f" ch {sorted(set(bad.nonzero()[:, -1].tolist()))[:6]} maxdiff {float(diff[~diff.isnan()].max()) if bad.any() else 0}")
    print(sys.argv[1:], what, "|", " | ".join(out), flush=True)

graph = cuda_graph_of(step)
for i in range(3):
    pos_ids.copy_(torch.randint(0, 8192, (tokens,), device=DEVICE))
    for x in parts.values():
        x.copy_(torch.randn_like(x) * 4)
    eager = step(outputs())
    graph.replay()
    torch.cuda.synchronize()
    report("replay %d" % i, graphed)
