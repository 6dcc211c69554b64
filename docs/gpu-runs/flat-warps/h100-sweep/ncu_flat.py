"""Launch the flat kernel on Llama-3-8B prefill shapes at two configurations, twice each (for ncu)."""
import sys
import torch
import ropekit  # noqa
from ropekit.positions import resolve_positions
from ropekit.triton.launch import FlatConfig, rope_v4
dtype = torch.float32 if "fp32" in sys.argv else torch.bfloat16
q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=dtype)
k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=dtype)
inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128)
ang = torch.arange(4096, device="cuda").float()[:, None] * inv
cos, sin = ang.cos(), ang.sin()
spec = resolve_positions(batch=4, seqlen=4096, positions=None)
configs = [FlatConfig(int(b), int(w)) for b, w in (c.split("x") for c in sys.argv[1].split(","))]
oq, ok = torch.empty_like(q), torch.empty_like(k)
for config in configs:
    for _ in range(2):
        rope_v4(q, k, cos, sin, out_q=oq, out_k=ok, positions=spec, rotary_dim=128, config=config)
torch.cuda.synchronize()
print("launched", configs)
