"""The QK-norm backward compiled for sm_90 on a CPU (Triton's compiler and cuobjdump): for each tile, a thread's
registers and the widths of the copies (LDGSTS: the pipeline's cp.async) and stores (STG) in its SASS. Qwen3's
per-head norm (32 q heads, 8 k heads, 128 bf16 channels) and OLMo-2's norm over all heads (32 and 32).
Run from the repository root: python docs/gpu-runs/backward-copies/cpu/copies.py"""
import collections, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "tools")); sys.path.insert(0, str(ROOT))
import compile_sm90 as c  # noqa: E402  (answers torch.cuda.is_available while ropekit imports)
import torch, triton  # noqa: E402
from ropekit.positions import resolve_positions  # noqa: E402
from ropekit.triton import fused, launch  # noqa: E402
from ropekit.triton.configs import FusedConfig  # noqa: E402


print(f"Triton {triton.__version__}, sm_90")
for name, hq, hk, over in (("qwen3", 32, 8, False), ("olmo2", 32, 32, True)):
    tiles = [(8, 3), (8, 4), (16, 4)] if not over else [(32, 3), (32, 4)]
    for heads, stages in tiles:
        q, gq, dq = (torch.empty(1, 64, hq, 128, dtype=torch.bfloat16) for _ in range(3))
        k, gk, dk = (torch.empty(1, 64, hk, 128, dtype=torch.bfloat16) for _ in range(3))
        w_q, w_k = (torch.empty((h if over else 1) * 128, dtype=torch.bfloat16) for h in (hq, hk))
        cos = torch.empty(4096, 64)
        config = FusedConfig(1, heads, 4, True, True, 16, stages)
        with launch.recorded_launches() as records:
            fused.launch_fused(q, k, cos, cos, positions=resolve_positions(batch=1, seqlen=64, positions=None),
                               rotary_dim=128, out_q=dq, out_k=dk, q_weight=w_q, k_weight=w_k, eps=1e-6,
                               norm_over_heads=over, grad_q=gq, grad_k=gk, config=config)
        registers, text = c.sass(c.compile_record(records[0], hints=True))
        widths = collections.Counter(re.findall(r"\b((?:LDGSTS|STG)[.A-Z0-9]*)", text))
        print(f"{name} 1 x {heads} heads, 4 warps, {stages} stages: {registers} registers a thread; "
              + ", ".join(f"{op} {n}" for op, n in sorted(widths.items())))
