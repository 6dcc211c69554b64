import re, sys, torch
root = sys.argv[1]
sys.path.insert(0, root + "/tools")
import compile_sm90 as C
from ropekit.triton import fused as F, fused_tiles as T
from ropekit.triton.configs import FusedConfig
from ropekit.positions import resolve_positions
assert F.__file__.startswith(root), F.__file__
F.native_fp8 = lambda device: True
pos = resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64))
cos = torch.empty(8192, 32); slots = torch.empty(64, dtype=torch.int64); scale = torch.empty(1)
for hk, cfg in [(8, (1, 8, 1)), (8, (4, 8, 4)), (8, (1, 32, 4)), (8, (2, 16, 4)), (8, (4, 16, 8))]:
    q = torch.empty(1, 64, 32, 128, dtype=torch.bfloat16); k = torch.empty(1, 64, hk, 128, dtype=torch.bfloat16)
    caches = [torch.empty(64, 1, hk, 128, dtype=torch.uint8) for _ in range(2)]
    launch = F.plan_fused(q, k, cos, cos, positions=pos, rotary_dim=128, out_q=torch.empty(1, 64, 32, 128, dtype=torch.uint8),
                          v=torch.empty_like(k), k_cache=caches[0], v_cache=caches[1], cache_mode=F.CACHE_PAGED, slots=slots,
                          block_size=1, q_format=T.E5M2, q_scale=scale, k_scale=scale, v_scale=scale,
                          quant=(T.E5M2, T.PER_TENSOR), config=FusedConfig(*cfg))
    regs, text = C.sass(C.compile_record(launch, hints=True))
    n = len([l for l in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)])
    print(hk, cfg, "regs", regs, "instructions", n)
