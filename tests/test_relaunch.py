"""A planned fused call at the addresses of an earlier call of its signature launches with the launcher's arguments
as they were (docs/tuning.md#direct-launch): what it reads and writes must still be this call's. The calls here run
in a sequence that repeats a base call and, between repeats, swaps one tensor the launch reads for another of the
same signature (a second slot mapping, table, cache, scale or weight), while the inputs change their contents where
they lie; out of place, the outputs are dropped (the caching allocator hands their memory out again) or kept (each
call lands somewhere new). Every call is checked against the same call on the native backend (PyTorch ops). On a
GPU a repeat of the base call is a relaunch, and a swap must not be: a plan that left one tensor's address out of
the key it keeps its launches by would relaunch the base call there. Under the interpreter every call takes the full
path, and the checks hold the same."""

import pytest
import torch
import triton

import ropekit
from conftest import DEVICE, gpu_only

pytestmark = pytest.mark.backend("triton")  # the kernels (interpreted without a GPU); the native ops are the check

FP8 = torch.float8_e4m3fn
TOKENS, HQ, HK, D = 5, 4, 2, 16


def _sequence(names) -> list:
    """The base call twice, then each swap followed by the base call again: [None, None, a, None, b, None, ...]."""
    return [None, None] + [step for name in names for step in (name, None)]


def _pick(tensors: dict, swapped) -> dict:
    """Each input's first tensor, but the swapped one's second."""
    return {name: pair[1] if name == swapped else pair[0] for name, pair in tensors.items()}


def _refill(*tensors):
    """New random contents, where the tensors already lie."""
    for t in tensors:
        t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))


def _same(a, b) -> bool:
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)) if a.dtype == FP8 else \
        torch.allclose(a.cpu().double(), b.cpu().double(), rtol=2e-2, atol=2e-2)


def _tables(base):
    return ropekit.cos_sin_table(64, D, base=base, device=DEVICE)


@pytest.mark.parametrize("form", ["in place", "out of place", "out of place, outputs kept", "float8 cache",
                                  "QK-norm"])
def test_rope_and_cache_at_known_addresses_reads_this_calls_tensors(form):
    cache_dtype = FP8 if form == "float8 cache" else torch.bfloat16
    qkv = torch.randn(TOKENS, (HQ + 2 * HK) * D, device=DEVICE, dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(TOKENS, 1, HK, D)
    v = qkv[:, (HQ + HK) * D:].view(TOKENS, 1, HK, D)
    (cos, sin), (cos2, sin2) = _tables(10000.0), _tables(500000.0)

    def two(make):
        return make(), make()
    tensors = dict(cos=(cos, cos2), sin=(sin, sin2),
                   k_cache=two(lambda: torch.randn(6, 4, HK, D, device=DEVICE).to(cache_dtype)),
                   v_cache=two(lambda: torch.randn(6, 4, HK, D, device=DEVICE).to(cache_dtype)),
                   slot_mapping=two(lambda: torch.randperm(24, device=DEVICE)[:TOKENS]),
                   positions=two(lambda: torch.randint(0, 60, (TOKENS,), device=DEVICE)))
    if form == "float8 cache":
        tensors.update(k_scale=(torch.tensor([0.5], device=DEVICE), torch.tensor([0.25], device=DEVICE)),
                       v_scale=(torch.tensor([2.0], device=DEVICE), torch.tensor([1.5], device=DEVICE)))
    if form == "QK-norm":
        tensors.update(q_weight=two(lambda: torch.randn(D, device=DEVICE)),
                       k_weight=two(lambda: torch.randn(D, device=DEVICE)))
    inplace = not form.startswith("out of place")
    kept = []
    for swapped in _sequence(tensors):
        _refill(qkv)  # q, k and v change where they lie
        chosen = _pick(tensors, swapped)
        want = dict(chosen, k_cache=chosen["k_cache"].clone(), v_cache=chosen["v_cache"].clone())
        with ropekit.device.set_backend("native"):
            want_q, _ = ropekit.rope_and_cache(q.clone(), k.clone(), v.clone(), inplace=inplace, **want)
        out, _ = ropekit.rope_and_cache(q, k, v, inplace=inplace, **chosen)
        assert _same(out, want_q), swapped
        assert _same(chosen["k_cache"], want["k_cache"]) and _same(chosen["v_cache"], want["v_cache"]), swapped
        if form == "out of place, outputs kept":
            kept.append(out)
    assert len({o.data_ptr() for o in kept}) == len(kept)


@pytest.mark.parametrize("inplace", [True, False])
def test_qk_norm_rope_at_known_addresses_reads_this_calls_tensors(inplace):
    qkv = torch.randn(TOKENS, (HQ + HK) * D, device=DEVICE, dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
    k = qkv[:, HQ * D:].view(TOKENS, 1, HK, D)
    (cos, sin), (cos2, sin2) = _tables(10000.0), _tables(500000.0)
    tensors = dict(cos=(cos, cos2), sin=(sin, sin2),
                   q_weight=(torch.randn(D, device=DEVICE), torch.randn(D, device=DEVICE)),
                   k_weight=(torch.randn(D, device=DEVICE), torch.randn(D, device=DEVICE)),
                   positions=(torch.randint(0, 60, (TOKENS,), device=DEVICE),
                              torch.randint(0, 60, (TOKENS,), device=DEVICE)))
    for swapped in _sequence(tensors):
        _refill(qkv)
        chosen = _pick(tensors, swapped)
        with ropekit.device.set_backend("native"):
            want_q, want_k = ropekit.qk_norm_rope(q.clone(), k.clone(), inplace=inplace, **chosen)
        out_q, out_k = ropekit.qk_norm_rope(q, k, inplace=inplace, **chosen)
        assert _same(out_q, want_q) and _same(out_k, want_k), swapped


@pytest.mark.parametrize("tables", ["cos/sin", "cos_sin_cache"])
def test_mla_rope_and_cache_at_known_addresses_reads_this_calls_tensors(tables):
    rope_dim, latent, heads = D, 32, 4
    q_pe = torch.randn(TOKENS, heads, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    projection = torch.randn(TOKENS, latent + rope_dim, device=DEVICE, dtype=torch.bfloat16)
    kv_c, k_pe = projection[:, :latent], projection[:, latent:]
    (cos, sin), (cos2, sin2) = _tables(10000.0), _tables(500000.0)
    tensors = dict(kv_cache=tuple(torch.randn(6, 4, latent + rope_dim, device=DEVICE, dtype=torch.bfloat16)
                                  for _ in range(2)),
                   slot_mapping=tuple(torch.randperm(24, device=DEVICE)[:TOKENS] for _ in range(2)),
                   positions=tuple(torch.randint(0, 60, (TOKENS,), device=DEVICE) for _ in range(2)))
    if tables == "cos/sin":
        tensors.update(cos=(cos, cos2), sin=(sin, sin2))
    else:
        tensors.update(cos_sin_cache=(torch.cat((cos, sin), -1), torch.cat((cos2, sin2), -1)))
    for swapped in _sequence(tensors):
        _refill(q_pe, projection)
        chosen = _pick(tensors, swapped)
        want = dict(chosen, kv_cache=chosen["kv_cache"].clone())
        want_q = q_pe.clone()
        with ropekit.device.set_backend("native"):
            ropekit.mla_rope_and_cache(want_q, k_pe.clone(), kv_c.clone(), **want)
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, **chosen)
        assert _same(q_pe, want_q) and _same(chosen["kv_cache"], want["kv_cache"]), swapped


def test_a_fused_key_is_the_signature_and_the_addresses_of_its_tensors():
    """The one pass a planned fused call makes over its tensors gives what the plan key and the overlap rule's
    addresses give apart."""
    from ropekit.fused.plan import keyed
    from ropekit.triton.launch import signature, tensor_key
    from ropekit.validate import addresses
    base = torch.randn(4, 6, device=DEVICE)
    weight = torch.nn.Parameter(torch.randn(6, device=DEVICE))
    tensors = (base, None, base[:, 2:], base.t(), None, torch.arange(3, device=DEVICE), 7, weight, None)
    flags = (1e-6, "bshd", True, None, 3)
    assert keyed("op", tensors, flags) == (signature("op", tensors, flags), addresses(tensors))
    assert keyed("op", tensors, flags)[0] != keyed("op", tensors[:-1] + (base,), flags)[0]
    assert keyed("op", tensors, (True,))[0] != keyed("op", tensors, (1,))[0]
    # a tensor on another device is another key, a device without an index (CPU, meta) included, and the three
    # places that write a tensor's key agree
    for other in ("meta", "cpu") + (("cuda:0",) if torch.cuda.is_available() else ()):
        moved = tensors[:5] + (tensors[5].to(other),) + tensors[6:]
        assert (keyed("op", moved, flags)[0] == keyed("op", tensors, flags)[0]) == (other == str(tensors[5].device))
        assert keyed("op", moved, flags)[0] == signature("op", moved, flags)
        assert signature("op", moved, flags)[6] == tensor_key(moved[5])
    on_cpu, on_meta = base.to("cpu"), base.to("meta")
    assert tensor_key(on_cpu) != tensor_key(on_meta)
    assert keyed("op", (on_cpu,), ())[0] != keyed("op", (on_meta,), ())[0]
    assert signature("op", (on_cpu,), ()) != signature("op", (on_meta,), ())


def test_a_planned_call_with_a_tensor_on_another_device_is_validated():
    """A call that repeats a planned one but for a tensor's device (a meta weight: where the plan's tensors are on
    the CPU, both devices have index -1) does not reach that plan: validation refuses it, naming the tensor, before
    anything is written."""
    q, k = torch.randn(1, 4, 2, 16, device=DEVICE), torch.randn(1, 4, 1, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    with ropekit.device.set_backend("triton"), torch.no_grad():
        for _ in range(2):  # the second call takes the plan
            ropekit.qk_norm_rope(q, k, cos, sin, w, w, inplace=True)
        before = q.clone(), k.clone()
        with pytest.raises((ValueError, TypeError), match="k_weight"):
            ropekit.qk_norm_rope(q, k, cos, sin, w, w.to("meta"), inplace=True)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


@gpu_only
def test_a_launch_hook_sees_every_relaunch_of_a_fused_call():
    """A planned call at known addresses skips Triton's runner; a hook added to ``triton.knobs`` (a profiler's)
    sends it back through the runner, so the hook is called for every call, and no longer once it is removed."""
    hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
    if not hasattr(getattr(hooks, "launch_enter_hook", None), "add"):
        pytest.skip("this Triton keeps no chain of launch hooks")
    cos, sin = _tables(10000.0)
    qkv = torch.randn(TOKENS, (HQ + 2 * HK) * D, device=DEVICE, dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(TOKENS, 1, HK, D)
    v = qkv[:, (HQ + HK) * D:].view(TOKENS, 1, HK, D)
    caches = [torch.randn(6, 4, HK, D, device=DEVICE, dtype=torch.bfloat16) for _ in range(2)]
    slots = torch.randperm(24, device=DEVICE)[:TOKENS]
    positions = torch.randint(0, 60, (TOKENS,), device=DEVICE)

    def call():
        ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots,
                               positions=positions, inplace=True)
    for _ in range(3):
        call()
    seen = []

    def hook(metadata):
        seen.append(metadata)

    hooks.launch_enter_hook.add(hook)
    try:
        for _ in range(3):
            call()
    finally:
        hooks.launch_enter_hook.remove(hook)
    call()
    torch.cuda.synchronize()
    assert len(seen) == 3
