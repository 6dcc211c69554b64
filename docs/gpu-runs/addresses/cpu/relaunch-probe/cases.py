import sys; sys.path.insert(0, "/tmp/rv")
from probe import *
T, HQ, HK, Dm = 5, 4, 2, 16
FP8 = torch.float8_e4m3fn
cos, sin = ropekit.cos_sin_table(64, Dm)
def mk(cache_dtype=torch.bfloat16):
    qkv = torch.randn(T, (HQ + 2 * HK) * Dm).bfloat16()
    q = qkv[:, :HQ*Dm].view(T, 1, HQ, Dm); k = qkv[:, HQ*Dm:(HQ+HK)*Dm].view(T, 1, HK, Dm); v = qkv[:, (HQ+HK)*Dm:].view(T, 1, HK, Dm)
    caches = [torch.randn(6, 4, HK, Dm).to(cache_dtype) for _ in range(2)]
    slots = torch.randperm(24)[:T]; pos = torch.randint(0, 60, (T,))
    return dict(q=q, k=k, v=v, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots, positions=pos)
# two sets of tensors at different addresses, alternate -> relaunches at two address sets
for form in ["inplace", "oop", "fp8", "fp8 oop", "qknorm", "write_k", "fp8 q"]:
    sets = []
    for _ in range(2):
        d = mk(FP8 if "fp8" in form else torch.bfloat16)
        kw = dict(inplace=("oop" not in form and "fp8 q" not in form))
        if "fp8" in form:
            kw.update(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([2.0]))
        if form == "qknorm":
            kw.update(q_weight=torch.randn(Dm), k_weight=torch.randn(Dm))
        if form == "write_k": kw.update(write_k=True)
        if form == "fp8 q": kw.update(q_dtype=FP8, q_scale=torch.tensor([1.0]))
        sets.append((d, kw))
    go(f"rope_and_cache {form}", lambda s: ropekit.rope_and_cache(s[0]["q"], s[0]["k"], s[0]["v"], cos, sin, **{k: v for k, v in s[0].items() if k not in "qkv"}, **s[1]), sets)
# a bf16 cache with k_scale given (unread) that moves
d = mk(); scales = [torch.tensor([0.5]), torch.tensor([3.0])]
go("scale unread moves", lambda s: ropekit.rope_and_cache(d["q"], d["k"], d["v"], cos, sin, k_cache=d["k_cache"], v_cache=d["v_cache"], slot_mapping=d["slot_mapping"], positions=d["positions"], k_scale=s, v_scale=s, inplace=True), scales)
# qk_norm_rope
q = torch.randn(T, 1, HQ, Dm).bfloat16(); k = torch.randn(T, 1, HK, Dm).bfloat16(); pos = torch.randint(0, 60, (T,))
for inplace in (True, False):
    go(f"qk_norm_rope inplace={inplace}", lambda s: ropekit.qk_norm_rope(q, k, cos, sin, s, s, positions=pos, inplace=inplace), [torch.randn(Dm), torch.randn(Dm)])
# MLA
rd, lat, H = 16, 32, 4
csc = torch.cat(ropekit.cos_sin_table(64, rd), 1)
def mla_set(sep=False, fp8=False):
    q_pe = torch.randn(T, H, rd).bfloat16(); proj = torch.randn(T, lat + rd).bfloat16()
    cache = torch.randn(6, 4, lat + rd).to(FP8 if fp8 else torch.bfloat16)
    if sep: cache = (torch.randn(6, 4, lat).bfloat16(), torch.randn(6, 4, rd).bfloat16())
    return q_pe, proj[:, lat:], proj[:, :lat], cache, torch.randperm(24)[:T], torch.randint(0, 60, (T + 2,))
for sep, fp8, inplace, tables in [(False, False, True, "cs"), (True, False, False, "cs"), (False, True, True, "csc"), (False, False, False, "csc")]:
    sets = [mla_set(sep, fp8) for _ in range(2)]
    def call(s):
        q_pe, k_pe, kv_c, cache, slots, p = s
        t = dict(cos_sin_cache=csc) if tables == "csc" else dict(cos=cos[:, :rd//2].contiguous(), sin=sin[:, :rd//2].contiguous())
        return ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, p, inplace=inplace, kv_cache_scale=torch.tensor([0.5]) if fp8 else None, **t)
    go(f"mla sep={sep} fp8={fp8} inplace={inplace} {tables}", call, sets)
