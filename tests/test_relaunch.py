"""A planned fused call at the addresses of an earlier call of its signature launches with the launcher's arguments
as they were (docs/tuning.md#direct-launch): what it reads and writes must still be this call's. Each call here
changes the contents of tensors that stay where they are, or lands its fresh outputs somewhere new, and is checked
against the same call on the native backend (PyTorch ops). On a GPU the third call onwards is such a relaunch; under
the interpreter every call takes the full path, and the checks hold the same."""

import pytest
import torch
import triton

import ropekit
from conftest import DEVICE, gpu_only

pytestmark = pytest.mark.backend("triton")  # the kernels (interpreted without a GPU); the native ops are the check

FP8 = torch.float8_e4m3fn
TOKENS, HQ, HK, D = 5, 4, 2, 16


def _decode_inputs(cache_dtype=torch.bfloat16):
    qkv = torch.randn(TOKENS, (HQ + 2 * HK) * D, device=DEVICE, dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(TOKENS, 1, HK, D)
    v = qkv[:, (HQ + HK) * D:].view(TOKENS, 1, HK, D)
    caches = [torch.randn(6, 4, HK, D, device=DEVICE).to(cache_dtype) for _ in range(2)]
    slots = torch.randperm(24, device=DEVICE)[:TOKENS]
    positions = torch.randint(0, 60, (TOKENS,), device=DEVICE)
    return qkv, q, k, v, caches, slots, positions


def _refill(*tensors):
    """New random contents, where the tensors already lie."""
    for t in tensors:
        t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))


def _same_bytes(a, b):
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)) if a.dtype == FP8 else \
        torch.allclose(a.cpu().double(), b.cpu().double(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("form", ["in place", "out of place", "float8 cache", "QK-norm"])
def test_rope_and_cache_called_again_where_its_tensors_lie_reads_their_new_contents(form):
    cos, sin = ropekit.cos_sin_table(64, D, device=DEVICE)
    qkv, q, k, v, caches, slots, positions = _decode_inputs(FP8 if form == "float8 cache" else torch.bfloat16)
    scales = dict(k_scale=torch.tensor([0.5], device=DEVICE), v_scale=torch.tensor([2.0], device=DEVICE)) \
        if form == "float8 cache" else {}
    weights = dict(q_weight=torch.randn(D, device=DEVICE), k_weight=torch.randn(D, device=DEVICE)) \
        if form == "QK-norm" else {}
    kept = []  # out of place: each call's output stays alive, so the next one lands elsewhere
    for _ in range(4):
        _refill(qkv)  # q, k and v change where they lie
        slots.copy_(torch.randperm(24, device=DEVICE)[:TOKENS])
        positions.copy_(torch.randint(0, 60, (TOKENS,), device=DEVICE))
        want_caches = [c.clone() for c in caches]
        want_q = q.clone()
        with ropekit.device.set_backend("native"):
            want_out, _ = ropekit.rope_and_cache(want_q, k.clone(), v.clone(), cos, sin, k_cache=want_caches[0],
                                                 v_cache=want_caches[1], slot_mapping=slots, positions=positions,
                                                 inplace=form != "out of place", **scales, **weights)
        out, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1],
                                        slot_mapping=slots, positions=positions, inplace=form != "out of place",
                                        **scales, **weights)
        kept.append(out)
        assert _same_bytes(out, want_out)
        assert all(_same_bytes(c, w) for c, w in zip(caches, want_caches))
    if form == "out of place":
        assert len({o.data_ptr() for o in kept}) == len(kept)


@pytest.mark.parametrize("inplace", [True, False])
def test_qk_norm_rope_called_again_where_its_tensors_lie_reads_their_new_contents(inplace):
    cos, sin = ropekit.cos_sin_table(64, D, device=DEVICE)
    qkv, q, k, _, _, _, positions = _decode_inputs()
    q_weight, k_weight = torch.randn(D, device=DEVICE), torch.randn(D, device=DEVICE)
    kept = []
    for _ in range(4):
        _refill(qkv, q_weight)
        positions.copy_(torch.randint(0, 60, (TOKENS,), device=DEVICE))
        with ropekit.device.set_backend("native"):
            want_q, want_k = ropekit.qk_norm_rope(q.clone(), k.clone(), cos, sin, q_weight, k_weight,
                                                  positions=positions, inplace=inplace)
        out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, q_weight, k_weight, positions=positions, inplace=inplace)
        kept.append(out_q)
        assert _same_bytes(out_q, want_q) and _same_bytes(out_k, want_k)


def test_mla_rope_and_cache_called_again_where_its_tensors_lie_reads_their_new_contents():
    rope_dim, latent, heads = 16, 32, 4
    cos, sin = ropekit.cos_sin_table(64, rope_dim, device=DEVICE)
    q_pe = torch.randn(TOKENS, heads, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    projection = torch.randn(TOKENS, latent + rope_dim, device=DEVICE, dtype=torch.bfloat16)
    kv_c, k_pe = projection[:, :latent], projection[:, latent:]
    cache = torch.randn(6, 4, latent + rope_dim, device=DEVICE, dtype=torch.bfloat16)
    slots = torch.randperm(24, device=DEVICE)[:TOKENS]
    positions = torch.randint(0, 60, (TOKENS,), device=DEVICE)
    for _ in range(4):
        _refill(q_pe, projection)
        slots.copy_(torch.randperm(24, device=DEVICE)[:TOKENS])
        want_cache, want_q = cache.clone(), q_pe.clone()
        with ropekit.device.set_backend("native"):
            ropekit.mla_rope_and_cache(want_q, k_pe.clone(), kv_c.clone(), want_cache, slots, positions, cos, sin)
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin)
        assert _same_bytes(q_pe, want_q) and _same_bytes(cache, want_cache)


@gpu_only
def test_a_launch_hook_sees_every_relaunch_of_a_fused_call():
    """A planned call at known addresses skips Triton's runner; a hook added to ``triton.knobs`` (a profiler's)
    sends it back through the runner, so the hook is called for every call, and no longer once it is removed."""
    hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
    if not hasattr(getattr(hooks, "launch_enter_hook", None), "add"):
        pytest.skip("this Triton keeps no chain of launch hooks")
    cos, sin = ropekit.cos_sin_table(64, D, device=DEVICE)
    _, q, k, v, caches, slots, positions = _decode_inputs()

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
