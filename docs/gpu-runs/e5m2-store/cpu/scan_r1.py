"""Compile fused forward variants (float8/int8/NVFP4 stores, q output, caches) over many tiles for sm_90 and flag any
SASS that reads R1 (the stack pointer) in a kernel without local memory: ptxas's miscompile of an unpacked float8x2
conversion."""
import re, sys, torch, itertools
sys.path.insert(0, "tools")
import compile_sm90 as C
from ropekit.triton import fused as F, fused_tiles as T
from ropekit.triton.configs import FusedConfig
from ropekit.positions import resolve_positions
F.native_fp8 = lambda device: True
bad = total = 0
pos = resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64))
cos = torch.empty(8192, 32)
slots = torch.empty(64, dtype=torch.int64)
scale = torch.empty(1)
for fmt, hk, (bs, bh, nw) in itertools.product((T.E5M2, T.E4M3, T.INT8, T.NVFP4), (1, 8),
                                              [(1, 32, 4), (1, 16, 4), (1, 8, 1), (1, 8, 2), (4, 8, 4), (1, 4, 4),
                                               (2, 1, 2), (1, 1, 4), (8, 2, 8)]):
    q = torch.empty(1, 64, 32, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 64, hk, 64, dtype=torch.bfloat16)
    v = torch.empty(1, 64, hk, 64, dtype=torch.bfloat16)
    if fmt == T.NVFP4:
        caches = [torch.empty(64, 1, hk, 32, dtype=torch.uint8) for _ in range(2)]
        scales = [torch.empty(64, 1, hk, 4, dtype=torch.uint8) for _ in range(2)]
        extra = dict(k_scale=scales[0], v_scale=scales[1], k_global=scale, v_global=scale, quant=(T.NVFP4, T.PER_BLOCK))
        qfmt = T.E4M3
    else:
        caches = [torch.empty(64, 1, hk, 64, dtype=torch.int8 if fmt == T.INT8 else torch.uint8) for _ in range(2)]
        extra = dict(k_scale=scale, v_scale=scale, quant=(fmt, T.PER_TENSOR))
        qfmt = fmt if fmt != T.INT8 else T.E4M3
    out_q = torch.empty(1, 64, 32, 64, dtype=torch.uint8)
    launch = F.plan_fused(q, k, cos, cos, positions=pos, rotary_dim=64, out_q=out_q, v=v, k_cache=caches[0],
                          v_cache=caches[1], cache_mode=F.CACHE_PAGED, slots=slots, block_size=1, q_format=qfmt,
                          q_scale=scale, config=FusedConfig(bs, bh, nw), **extra)
    compiled = C.compile_record(launch, hints=True)
    regs, text = C.sass(compiled)
    lines = [l for l in text.splitlines() if re.search(r"\bR1\b", l) and "LDC R1, c[0x0][0x28]" not in l
             and not re.search(r"F2FP\.\S+ R\d+, R1\b", l)]
    local = re.search(r"\b(STL|LDL)\b", text)
    total += 1
    if lines and not local:
        bad += 1
        print("R1 READ", fmt, hk, (bs, bh, nw), lines[0].strip()[:90], flush=True)
print(f"{bad} of {total} variants read R1")
