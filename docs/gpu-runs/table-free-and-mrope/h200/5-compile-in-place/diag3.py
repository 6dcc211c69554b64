"""The MLA page-table bf16 case alone, eager, in a fresh process: q_pe against the float64 reference."""
import sys, torch, ropekit
sys.path.insert(0, "tests")
from ropekit import reference as ref
import test_fused_mla as T
for name in reversed(list(T.MLA_CAPTURED)):
    q_pe, k_pe, kv_c, caches, by, positions, scale = T.mla_captured_case(name, 5, 2, 16, 32, 12, 4, 32)
    cos, sin = T.yarn_tables(16, 32, "cuda")
    q0 = q_pe.clone()
    out_q, _ = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, positions=positions, cos=cos, sin=sin,
                                          kv_cache_scale=scale, **by)
    truth = ref.rope_table(q0, cos, sin, positions[:5].cpu(), interleaved=True)
    print(name, "eager-ref", float((out_q.double().cpu() - truth).abs().max()), flush=True)
