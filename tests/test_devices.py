"""A call on a GPU that is not the current one. Triton compiles, loads and launches a kernel on the current CUDA device,
whatever device its tensors lie on; in a process whose model spreads over GPUs (transformers' ``device_map="auto"``)
a layer's tensors lie on ``cuda:1`` while ``cuda:0`` stays current. Every op runs on its tensors' GPU
(:func:`ropekit.device.on_device`), planned and at known addresses alike, and leaves the current device as it was."""

import pytest
import torch

import ropekit
from conftest import ON_GPU

TOKENS, HQ, HK, D = 6, 4, 2, 64

two_gpus = pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.mark.parametrize("device", [None, "cpu", "meta"])
def test_on_device_does_nothing_without_another_gpu(device):
    before = torch.cuda.current_device() if torch.cuda.is_available() else None
    with ropekit.device.on_device(device):
        pass
    assert (torch.cuda.current_device() if torch.cuda.is_available() else None) == before


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_on_device_of_the_current_gpu_keeps_it():
    current = torch.cuda.current_device()
    with ropekit.device.on_device(torch.device("cuda", current)):
        assert torch.cuda.current_device() == current
    with ropekit.device.on_device(current):
        assert torch.cuda.current_device() == current


def _close(got, want) -> bool:
    return torch.allclose(got.cpu().double(), want.cpu().double(), rtol=2e-2, atol=2e-2)


def _native(fn, *tensors, **kwargs):
    """The same call on the native backend, on CPU copies."""
    with ropekit.device.set_backend("native"):
        return fn(*(t.cpu().clone() if isinstance(t, torch.Tensor) else t for t in tensors),
                  **{n: v.cpu().clone() if isinstance(v, torch.Tensor) else v for n, v in kwargs.items()})


@two_gpus
@pytest.mark.parametrize("op", ["apply_rope", "apply_rope in place", "apply_rope backward", "rope_and_cache",
                                "rope_and_cache float8", "qk_norm_rope", "mla_rope_and_cache"])
def test_every_op_runs_on_its_tensors_gpu_while_another_is_current(op):
    gpu = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    cos, sin = ropekit.cos_sin_table(64, D, device=gpu)
    for step in range(3):  # the first call plans; later ones take the plan, at known addresses or new ones
        qkv = torch.randn(TOKENS, (HQ + 2 * HK) * D, device=gpu, dtype=torch.bfloat16)
        q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
        k = qkv[:, HQ * D:(HQ + HK) * D].view(TOKENS, 1, HK, D)
        v = qkv[:, (HQ + HK) * D:].view(TOKENS, 1, HK, D)
        positions = torch.randint(0, 60, (TOKENS, 1), device=gpu)
        if op.startswith("apply_rope"):
            want_q, want_k = _native(ropekit.apply_rope, q, k, cos, sin, positions=positions)
            if op == "apply_rope in place":
                got_q, got_k = ropekit.apply_rope(q, k, cos, sin, positions=positions, inplace=True)
            elif op == "apply_rope backward":
                leaf = q.detach().clone().requires_grad_()
                got_q, _ = ropekit.apply_rope(leaf, None, cos, sin, positions=positions)
                got_q.backward(want_q.to(gpu))
                # the backward rotates the output's gradient back: given the forward's output, that is q
                got_k, want_k = leaf.grad, q
            else:
                got_q, got_k = ropekit.apply_rope(q, k, cos, sin, positions=positions)
            assert _close(got_q, want_q) and _close(got_k, want_k), step
        elif op.startswith("rope_and_cache"):
            dtype = torch.float8_e4m3fn if op.endswith("float8") else torch.bfloat16
            caches = [torch.zeros(8, 4, HK, D, device=gpu).to(dtype) for _ in range(2)]
            slots = torch.randperm(32, device=gpu)[:TOKENS]
            scales = dict(k_scale=torch.tensor([0.5], device=gpu), v_scale=torch.tensor([2.0], device=gpu)) \
                if dtype != torch.bfloat16 else {}
            want = _native(ropekit.rope_and_cache, q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1],
                           slot_mapping=slots, positions=positions.flatten(), **scales)
            got = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1],
                                         slot_mapping=slots, positions=positions.flatten(), **scales)
            assert _close(got[0], want[0]), step
            with ropekit.device.set_backend("native"):
                want_caches = [c.cpu().clone() for c in caches]
                ropekit.rope_and_cache(q.cpu(), k.cpu(), v.cpu(), cos.cpu(), sin.cpu(), k_cache=want_caches[0],
                                       v_cache=want_caches[1], slot_mapping=slots.cpu(),
                                       positions=positions.flatten().cpu(),
                                       **{n: s.cpu() for n, s in scales.items()})
            for got_cache, want_cache in zip(caches, want_caches):
                assert torch.equal(got_cache.cpu().view(torch.uint8), want_cache.view(torch.uint8)), step
        elif op == "qk_norm_rope":
            weights = dict(q_weight=torch.randn(D, device=gpu), k_weight=torch.randn(D, device=gpu))
            want_q, want_k = _native(ropekit.qk_norm_rope, q, k, cos=cos, sin=sin, positions=positions, **weights)
            got_q, got_k = ropekit.qk_norm_rope(q, k, cos=cos, sin=sin, positions=positions, **weights)
            assert _close(got_q, want_q) and _close(got_k, want_k), step
        else:
            rope_dim, latent = D, 32
            q_pe = torch.randn(TOKENS, HQ, rope_dim, device=gpu, dtype=torch.bfloat16)
            projection = torch.randn(TOKENS, latent + rope_dim, device=gpu, dtype=torch.bfloat16)
            kv_c, k_pe = projection[:, :latent], projection[:, latent:]
            kv_cache = torch.zeros(8, 4, latent + rope_dim, device=gpu, dtype=torch.bfloat16)
            slots = torch.randperm(32, device=gpu)[:TOKENS]
            want_q, want_cache = q_pe.cpu().clone(), kv_cache.cpu().clone()
            with ropekit.device.set_backend("native"):
                ropekit.mla_rope_and_cache(want_q, k_pe.cpu().clone(), kv_c.cpu().clone(), cos=cos.cpu(),
                                           sin=sin.cpu(), kv_cache=want_cache, slot_mapping=slots.cpu(),
                                           positions=positions.flatten().cpu())
            ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cos=cos, sin=sin, kv_cache=kv_cache, slot_mapping=slots,
                                       positions=positions.flatten())
            assert _close(q_pe, want_q) and _close(kv_cache, want_cache), step
        assert torch.cuda.current_device() == 0, step
    torch.cuda.synchronize(gpu)
