"""SASS of fused forward launches (Llama-3-8B heads, bf16, paged), compiled for sm_90 on a CPU.
argv: root variant... ; variants: plain fp8 fp8q e5m2 nvfp4 fp8th int8th"""
import collections, os, re, sys
root = sys.argv[1]
OUTDIR = os.environ.get("OUTDIR", "/tmp")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, f"{root}/tools"); sys.path.insert(0, root)
import compile_sm90 as c  # noqa
import torch
from sass_fused import compile_record, sass  # noqa
from ropekit.positions import resolve_positions
from ropekit.triton import fused, launch
from ropekit.triton import fused_tiles as tiles
from ropekit.triton import choice, groups
choice.launch_dependency = lambda device, grid, num_warps: groups.Dependency.WAIT
cfg = fused.FusedConfig(2, 16, 4, True, True)
APART = "--apart" in sys.argv
for a in sys.argv:
    if a.startswith("--cfg="):
        s, h, w = map(int, a[6:].split(",")); cfg = fused.FusedConfig(s, h, w, True, True, **({"v_apart": True} if "--apart" in sys.argv else {}))
meta = dict(device="cpu")
dtype = torch.bfloat16
q = torch.empty(64, 1, 32, 128, dtype=dtype, **meta)
k, v = (torch.empty(64, 1, 8, 128, dtype=dtype, **meta) for _ in range(2))
cos = torch.empty(4096, 64, **meta)
offsets = torch.empty(64, dtype=torch.int64, **meta)
pos = resolve_positions(batch=64, seqlen=1, positions=offsets)
slots = torch.empty(64, dtype=torch.int64, **meta)
scale = torch.empty(1, **meta)
ths = torch.empty(16, 16, 8, **meta)
def call(variant):
    base = dict(q=q, k=k, cos=cos, sin=cos, positions=pos, rotary_dim=128, out_q=q, v=v, cache_mode=fused.CACHE_PAGED,
                slots=slots, block_size=16, cache_len=256, config=cfg, native=True)
    cache = lambda dt: dict(k_cache=torch.empty(16, 16, 8, 128, dtype=dt, **meta), v_cache=torch.empty(16, 16, 8, 128, dtype=dt, **meta))
    if variant == "plain":
        base.update(cache(dtype))
    elif variant in ("fp8", "e5m2"):
        base.update(cache(torch.uint8), quant=(tiles.E4M3 if variant == "fp8" else tiles.E5M2, tiles.PER_TENSOR), k_scale=scale, v_scale=scale)
    elif variant == "fp8q":
        base.update(cache(torch.uint8), quant=(tiles.E4M3, tiles.PER_TENSOR), k_scale=scale, v_scale=scale,
                    out_q=torch.empty(q.shape, dtype=torch.uint8, **meta), q_format=tiles.E4M3, q_scale=scale)
    elif variant in ("fp8th", "int8th"):
        dt = torch.uint8 if variant == "fp8th" else torch.int8
        base.update(cache(dt), quant=(tiles.E4M3 if variant == "fp8th" else tiles.INT8, tiles.PER_TOKEN_HEAD), k_scale=ths, v_scale=ths)
    elif variant in ("olmo2", "qknorm"):
        base.update(cache(dtype), q_weight=torch.empty(32 * 128 if variant == "olmo2" else 128, dtype=dtype, **meta),
                    k_weight=torch.empty(8 * 128 if variant == "olmo2" else 128, dtype=dtype, **meta), eps=1e-6,
                    norm_over_heads=variant == "olmo2")
    elif variant == "nvfp4":
        base.update(k_cache=torch.empty(16, 16, 8, 64, dtype=torch.uint8, **meta), v_cache=torch.empty(16, 16, 8, 64, dtype=torch.uint8, **meta),
                    quant=(tiles.NVFP4, tiles.PER_BLOCK), k_scale=torch.empty(16, 16, 8, 8, dtype=torch.uint8, **meta),
                    v_scale=torch.empty(16, 16, 8, 8, dtype=torch.uint8, **meta), k_global=scale, v_global=scale)
    return base
for variant in [a for a in sys.argv[2:] if not a.startswith("--")]:
    with launch.recorded_launches() as recs:
        c._fused_launch(call(variant))
    for i, rec in enumerate(recs):
        compiled = compile_record(rec)
        open(f"{OUTDIR}/{variant}.{i}.ttgir", "w").write(compiled.asm["ttgir"])
        regs, ops, text = sass(compiled)
        open(f"{OUTDIR}/{variant}.{i}.sass", "w").write(text)
        cnt = collections.Counter(ops)
        print(f"{variant} launch {i} regs {regs} instr {len(ops)}: " + ", ".join(f"{k} {v}" for k, v in cnt.most_common(16)), flush=True)
