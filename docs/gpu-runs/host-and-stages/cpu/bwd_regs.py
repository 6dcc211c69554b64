"""Registers a thread and shared memory of the fused backward, compiled for sm_90 on a CPU (Triton as installed), at
16 token blocks and 2-5 stages: the Qwen3 QK-norm (8 q heads a program of 128 channels, bf16) and OLMo-2 (a norm over
all 32 heads) backward tiles, on a 64-token call with Llama-3-8B's heads (32 q, 8 kv; OLMo-2: 32 and 32)."""
import sys
root = sys.argv[1]
sys.path.insert(0, f"{root}/tools"); sys.path.insert(0, root)
import compile_sm90 as c  # noqa: F401  (ropekit imported as on a GPU)
import torch
from sass_fused import compile_record, sass
from ropekit.positions import resolve_positions
from ropekit.triton import launch, fused
from ropekit.triton.configs import FusedConfig
dt = torch.bfloat16
for name, hq, hk, over in (("qknorm", 32, 8, False), ("olmo2", 32, 32, True)):
    q, gq, dq = (torch.empty(1, 64, hq, 128, dtype=dt) for _ in range(3))
    k, gk, dk = (torch.empty(1, 64, hk, 128, dtype=dt) for _ in range(3))
    cos = torch.empty(4096, 64)
    pos = resolve_positions(batch=1, seqlen=64, positions=None)
    wq = torch.empty(hq * 128 if over else 128, dtype=dt); wk = torch.empty(hk * 128 if over else 128, dtype=dt)
    for stages in (2, 3, 4, 5):
        cfg = FusedConfig(1, hq if over else 8, 4, True, True, 16, stages)
        with launch.recorded_launches() as recs:
            fused.launch_fused(q, k, cos, cos, positions=pos, rotary_dim=128, out_q=dq, out_k=dk, q_weight=wq,
                               k_weight=wk, eps=1e-6, norm_over_heads=over, grad_q=gq, grad_k=gk, config=cfg)
        for rec in recs:
            compiled = compile_record(rec)
            regs, ops, text = sass(compiled)
            print(f"{name} {cfg.block_s}x{cfg.block_h} w{cfg.num_warps} g16 p{stages}: regs {regs} "
                  f"shared {compiled.metadata.shared} instr {len(ops)}", flush=True)
