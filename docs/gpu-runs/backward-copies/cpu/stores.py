"""The fused prefill's load and store widths in its sm_90 SASS (compiled on a CPU) at 2 and 4 tokens x 16 heads:
Llama-3-8B's heads on a packed qkv, a paged cache of bf16 or float8 e4m3 (one scale a tensor), and a float8 q.
Run from the repository root: python docs/gpu-runs/backward-copies/cpu/stores.py"""
import collections, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]
import compile_sm90 as c  # noqa: E402  (answers torch.cuda.is_available while ropekit imports)
import torch, triton  # noqa: E402
from ropekit.positions import resolve_positions  # noqa: E402
from ropekit.triton import fused, launch  # noqa: E402
from ropekit.triton import fused_tiles as tiles  # noqa: E402
from ropekit.triton.configs import FusedConfig  # noqa: E402

fused.native_fp8 = lambda device: True  # the GPU's float8 conversion, as an sm_90 plan chooses it
print(f"Triton {triton.__version__}, sm_90")
for case in ("bf16", "float8 cache", "float8 cache + float8 q"):
    for tokens in (2, 4):
        qkv = torch.empty(1, 64, 48, 128, dtype=torch.bfloat16)
        scale = torch.empty(1)
        cache = torch.bfloat16 if case == "bf16" else torch.uint8
        store = {} if case == "bf16" else dict(quant=(tiles.E4M3, tiles.PER_TENSOR), k_scale=scale, v_scale=scale)
        q_out = dict(out_q=qkv[:, :, :32])
        if case.endswith("float8 q"):
            q_out = dict(out_q=torch.empty(1, 64, 32, 128, dtype=torch.uint8), q_format=tiles.E4M3, q_scale=scale)
        with launch.recorded_launches() as records:
            fused.launch_fused(qkv[:, :, :32], qkv[:, :, 32:40], torch.empty(4096, 64), torch.empty(4096, 64),
                               positions=resolve_positions(batch=1, seqlen=64, positions=torch.zeros(1, 64,
                                                                                                    dtype=torch.int64)),
                               rotary_dim=128, v=qkv[:, :, 40:], cache_mode=fused.CACHE_PAGED,
                               slots=torch.empty(64, dtype=torch.int64), block_size=16, cache_len=256,
                               k_cache=torch.empty(16, 16, 8, 128, dtype=cache),
                               v_cache=torch.empty(16, 16, 8, 128, dtype=cache),
                               config=FusedConfig(tokens, 16, 4, True, True), **store, **q_out)
        _, text = c.sass(c.compile_record(records[0], hints=True))
        widths = collections.Counter(re.findall(r"\b((?:LDG|STG)[.A-Z0-9]*)", text))
        print(f"{case}, {tokens} x 16: " + ", ".join(f"{op} {n}" for op, n in sorted(widths.items())))
