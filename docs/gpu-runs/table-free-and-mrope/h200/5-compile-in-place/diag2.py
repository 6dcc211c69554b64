"""In place under torch.compile (inductor) on the GPU, with the written tensors views of graph inputs taken inside
the compiled function: each op's compiled result against its eager result (bit for bit); then the MLA page-table
case's eager result in a fresh process against the float64 reference."""
import sys, torch, ropekit
sys.path.insert(0, "tests")
from ropekit import reference as ref
D = "cuda"
torch.manual_seed(0)
cos, sin = ropekit.cos_sin_table(64, 64, device=D)
qkv0 = torch.randn(5, (4 + 2 + 2) * 64, device=D, dtype=torch.bfloat16)
pos = torch.randint(0, 64, (5,), device=D)

def split(qkv):
    return qkv[:, :256].view(5, 4, 64), qkv[:, 256:384].view(5, 2, 64), qkv[:, 384:].view(5, 2, 64)

def run(name, fn, *inputs):
    eager_in = [x.clone() for x in inputs]
    want = fn(*eager_in)
    comp_in = [x.clone() for x in inputs]
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="inductor")(*comp_in)
    same_out = all(torch.equal(a, b) for a, b in zip(got, want))
    same_in = all(torch.equal(a, b) for a, b in zip(comp_in, eager_in))
    print(f"{name:55s} outputs equal {same_out}  mutated inputs equal {same_in}", flush=True)

def rac(qkv, cache):
    q, k, v = split(qkv)
    ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=cache[0], v_cache=cache[1],
                           slot_mapping=torch.arange(5, device=D), positions=pos[None], inplace=True, write_k=True)
    return (qkv.float() * 2,)
caches = torch.zeros(2, 2, 4, 2, 64, device=D, dtype=torch.bfloat16)
run("rope_and_cache in place, q k v views of qkv", rac, qkv0, caches)

def qkn(qkv):
    q, k, _ = split(qkv)
    ropekit.qk_norm_rope(q[None], k[None], cos, sin, positions=pos[None], inplace=True)
    return (qkv.float() * 2,)
run("qk_norm_rope in place, q k views of qkv", qkn, qkv0)

def ar(qkv):
    q, k, _ = split(qkv)
    ropekit.apply_rope(q[None], k[None], cos, sin, positions=pos[None], inplace=True)
    return (qkv.float() * 2,)
run("apply_rope in place, q k views of qkv", ar, qkv0)

csc = torch.cat((cos, sin), -1)
def vllm(qkv):
    q, k, _ = split(qkv)
    ropekit.rotary_embedding(pos, q.reshape(5, 256), k.reshape(5, 128), 64, csc, True)
    return (qkv.float() * 2,)
run("vLLM rotary_embedding, query key views of qkv", vllm, qkv0)

import test_fused_mla as T
for name in list(T.MLA_CAPTURED):
    q_pe, k_pe, kv_c, caches_m, by, positions, scale = T.mla_captured_case(name, 5, 2, 16, 32, 12, 4, 32)
    c, s = T.yarn_tables(16, 32, D)
    def mla(q_pe, k_pe, kv_c):
        out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches_m, positions=positions, cos=c, sin=s,
                                                  kv_cache_scale=scale, **by)
        return (out_q.float() * 2, out_k.float())
    q0 = q_pe.clone()
    run(f"mla_rope_and_cache {name}", mla, q_pe, k_pe, kv_c)
