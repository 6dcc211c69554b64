"""Registers and whether the forward walk compiles for sm_90: OLMo-2 prefill shape (32 heads x 128, norm over heads),
paged bf16, at token blocks / stages, compiled on a CPU (tools/compile_sm90.py). argv: root, a tree with
../h200/3-forward-walk/change.patch applied (the forward walk is not in the package)."""
import sys
root = sys.argv[1]
sys.path.insert(0, f"{root}/tools"); sys.path.insert(0, root)
import compile_sm90 as C
import torch, triton
from ropekit.positions import resolve_positions
from ropekit.triton import launch, fused
from ropekit.triton.configs import FusedConfig
dt = torch.bfloat16
qkv = torch.empty(1, 64, 96, 128, dtype=dt)
q, k, v = qkv[:, :, :32], qkv[:, :, 32:64], qkv[:, :, 64:]
cos = torch.empty(4096, 64)
pos = resolve_positions(batch=1, seqlen=64, positions=torch.zeros(1, 64, dtype=torch.int64))
w = torch.empty(4096, dtype=dt)
caches = dict(k_cache=torch.empty(16, 16, 32, 128, dtype=dt), v_cache=torch.empty(16, 16, 32, 128, dtype=dt))
out = []
for g, p in ((1, 1), (4, 2), (8, 3), (16, 3), (16, 4)):
    with launch.recorded_launches() as recs:
        fused.launch_fused(q, k, cos, cos, positions=pos, rotary_dim=128, out_q=q, v=v, cache_mode=fused.CACHE_PAGED,
                           slots=torch.empty(64, dtype=torch.int64), block_size=16, cache_len=256,
                           config=FusedConfig(1, 32, 4, True, True, token_blocks=g, stages=p), q_weight=w, k_weight=w,
                           eps=1e-6, norm=1, norm_over_heads=True, **caches)
    regs, text = C.sass(C.compile_record(recs[0], hints=True))
    out.append(f"g{g} p{p}: {regs} regs, {text.count('LDGSTS')} LDGSTS")
print(f"triton {triton.__version__}: " + "; ".join(out))
