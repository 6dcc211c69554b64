import sys; sys.path.insert(0, "/tmp/rv")
exec(open("/tmp/rv/pool.py").read().split("T, HQ")[0])
T, HQ, HK, Dm = 6, 4, 2, 16
cos, sin = ropekit.cos_sin_table(64, Dm)
def mk():
    q = torch.randn(T, HQ, Dm).bfloat16(); k = torch.randn(T, HK, Dm).bfloat16(); v = torch.randn(T, HK, Dm).bfloat16()
    return q, k, v
# thd varlen into a contiguous cache with offsets tensor
sets = []
for _ in range(2):
    q, k, v = mk()
    cache = [torch.randn(3, 32, HK, Dm).bfloat16() for _ in range(2)]
    sets.append((q, k, v, cache, torch.tensor([0, 2, 5, 6]), torch.tensor([1, 4, 0])))
go("thd contiguous offsets", lambda s: ropekit.rope_and_cache(s[0], s[1], s[2], cos, sin, k_cache=s[3][0], v_cache=s[3][1], cache_offsets=s[5], positions=s[5], layout="thd", cu_seqlens=s[4], max_seqlen=3, inplace=True), sets)
# 5-D paged HND cache, v None
sets = []
for _ in range(2):
    q, k, v = mk()
    sets.append((q[None], k[None], torch.randn(6, 2, HK, 4, Dm).bfloat16(), torch.randperm(24)[:T], torch.randint(0, 60, (1,))))
try:
    go("5-D HND", lambda s: ropekit.rope_and_cache(s[0], s[1], s[1], cos, sin, k_cache=s[2], slot_mapping=s[3], positions=s[4], kv_layout="HND", inplace=True), sets)
except Exception as e:
    print("5-D err", e); D.INTERPRET = True; L.plans.clear()
