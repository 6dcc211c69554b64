import sys; sys.path.insert(0, "/tmp/rv")
from probe import *
import importlib; KV, QN, ML = (importlib.import_module("ropekit.fused." + m) for m in ("kv_cache", "qk_norm_rope", "mla"))
from ropekit.outputs import new_output as real_new
pool = {}
def pooled(x):
    key = (tuple(x.shape), x.dtype)
    if key not in pool:
        pool[key] = real_new(x)
    return pool[key]
def pooled_q(q, q_dtype):
    if q_dtype is None: return pooled(q)
    key = (tuple(q.shape), q_dtype)
    if key not in pool: pool[key] = torch.empty(q.shape, dtype=q_dtype)
    return pool[key]
KV.new_output = QN.new_output = ML.new_output = pooled
KV._new_q = pooled_q
T, HQ, HK, Dm = 5, 4, 2, 16
FP8 = torch.float8_e4m3fn
cos, sin = ropekit.cos_sin_table(64, Dm)
def mk(cache_dtype=torch.bfloat16):
    qkv = torch.randn(T, (HQ + 2 * HK) * Dm).bfloat16()
    q = qkv[:, :HQ*Dm].view(T, 1, HQ, Dm); k = qkv[:, HQ*Dm:(HQ+HK)*Dm].view(T, 1, HK, Dm); v = qkv[:, (HQ+HK)*Dm:].view(T, 1, HK, Dm)
    caches = [torch.randn(6, 4, HK, Dm).to(cache_dtype) for _ in range(2)]
    return dict(q=q, k=k, v=v, k_cache=caches[0], v_cache=caches[1], slot_mapping=torch.randperm(24)[:T], positions=torch.randint(0, 60, (T,)))
for form in ["oop", "fp8 oop", "fp8 q", "oop write_k", "scale caches int8", "nvfp4?"]:
    sets = []
    for _ in range(2):
        d = mk(FP8 if "fp8" in form else torch.bfloat16)
        kw = dict(inplace=False)
        if "fp8" in form: kw.update(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([2.0]))
        if form == "fp8 q": kw.update(q_dtype=FP8, q_scale=torch.tensor([1.0]))
        if "write_k" in form: kw.update(write_k=True)
        if form == "scale caches int8":
            d["k_cache"] = d["k_cache"].float().to(torch.int8); d["v_cache"] = d["v_cache"].float().to(torch.int8)
            kw.update(kv_cache_dtype="int8_per_token_head", k_scale_cache=torch.empty(6, 4, HK), v_scale_cache=torch.empty(6, 4, HK))
        if form == "nvfp4?":
            continue
        sets.append((d, kw))
    if not sets: continue
    try:
        go(f"rope_and_cache {form}", lambda s: ropekit.rope_and_cache(s[0]["q"], s[0]["k"], s[0]["v"], cos, sin, **{k: v for k, v in s[0].items() if k not in "qkv"}, **s[1]), sets)
    except Exception as e:
        print(form, "error", type(e).__name__, str(e)[:200]); L.plans.clear(); D.INTERPRET=True
q = torch.randn(T, 1, HQ, Dm).bfloat16(); k = torch.randn(T, 1, HK, Dm).bfloat16(); pos = torch.randint(0, 60, (T,))
go("qk_norm_rope oop", lambda s: ropekit.qk_norm_rope(q, k, cos, sin, s, s, positions=pos, inplace=False), [torch.randn(Dm), torch.randn(Dm)])
go("qk_norm_rope oop no k", lambda s: ropekit.qk_norm_rope(q, None, cos, sin, s, None, positions=pos, inplace=False), [torch.randn(Dm), torch.randn(Dm)])
