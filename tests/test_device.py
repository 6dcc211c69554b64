"""ropekit.device: where a call runs. A call on a GPU that is not the current one: Triton compiles, loads and launches
a kernel on the current CUDA device, whatever device its tensors lie on; in a process whose model spreads over GPUs
(transformers' ``device_map="auto"``) a layer's tensors lie on ``cuda:1`` while ``cuda:0`` stays current. Every op
runs on its tensors' GPU and on that GPU's current stream (:func:`ropekit.device.on_device`), planned and at known
addresses alike, and leaves the current device as it was."""

import contextlib

import pytest
import torch

import ropekit
from conftest import DEVICE, ON_GPU

TOKENS, HQ, HK, D = 6, 4, 2, 64

two_gpus = pytest.mark.skipif(not ON_GPU or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _current():
    return torch.cuda.current_device() if torch.cuda.is_available() else None


@pytest.mark.parametrize("device", [None, "cpu", "meta"])
def test_on_device_does_nothing_without_a_gpu_to_switch_to(device):
    before = _current()
    with ropekit.device.on_device(device):
        assert _current() == before
    assert _current() == before


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_on_device_of_the_current_gpu_keeps_it():
    current = torch.cuda.current_device()
    for device in (torch.device("cuda", current), current):
        with ropekit.device.on_device(device):
            assert torch.cuda.current_device() == current
        assert torch.cuda.current_device() == current


@two_gpus
def test_on_device_makes_another_gpu_current_and_restores_the_one_before():
    torch.cuda.set_device(0)
    for device in (1, "cuda:1", torch.device("cuda", 1)):
        with ropekit.device.on_device(device):
            assert torch.cuda.current_device() == 1
        assert torch.cuda.current_device() == 0


def _close(got, want, dtype=None) -> bool:
    # a float8 cache holds 3 mantissa bits: within a spacing of the native ops' rounding (the GPU may fuse the
    # rotation's multiply-adds, the CPU rounds each)
    rtol = 0.13 if dtype == torch.float8_e4m3fn else 2e-2
    return torch.allclose(got.float().cpu().double(), want.float().cpu().double(), rtol=rtol, atol=2e-2)


def _calls(op, gpu, on_the_side, synchronize, steps=3):
    """``op`` on tensors of ``gpu``, ``steps`` times on the same tensors (the first call plans, the later ones take the
    plan at known addresses), each with new inputs written inside ``on_the_side()`` (the context the call runs in),
    checked against the native ops on CPU copies taken there before the call."""
    latent = 32
    cos, sin = ropekit.cos_sin_table(64, D, device=gpu)
    qkv = torch.empty(TOKENS, (HQ + 2 * HK) * D, device=gpu, dtype=torch.bfloat16)
    q = qkv[:, :HQ * D].view(TOKENS, 1, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(TOKENS, 1, HK, D)
    v = qkv[:, (HQ + HK) * D:].view(TOKENS, 1, HK, D)
    positions = torch.randint(0, 60, (TOKENS, 1), device=gpu)  # (batch, seq): a token a sequence
    dtype = torch.float8_e4m3fn if op.endswith("float8") else torch.bfloat16
    caches = [torch.zeros(8, 4, HK, D, device=gpu).to(dtype) for _ in range(2)]
    slots = torch.randperm(32, device=gpu)[:TOKENS]
    scales = dict(k_scale=torch.tensor([0.5], device=gpu), v_scale=torch.tensor([2.0], device=gpu)) \
        if dtype != torch.bfloat16 else {}
    weights = dict(q_weight=torch.randn(D, device=gpu), k_weight=torch.randn(D, device=gpu))
    q_pe = torch.empty(TOKENS, HQ, D, device=gpu, dtype=torch.bfloat16)
    projection = torch.empty(TOKENS, latent + D, device=gpu, dtype=torch.bfloat16)
    kv_c, k_pe = projection[:, :latent], projection[:, latent:]
    kv_cache = torch.zeros(8, 4, latent + D, device=gpu, dtype=torch.bfloat16)
    synchronize()
    for step in range(steps):
        with on_the_side():
            for t in (qkv, q_pe, projection):
                t.copy_(torch.randn(t.shape, device=gpu).to(t.dtype))
            before = [t.clone() for t in (qkv, q_pe, projection)]  # what the call reads, as it reads it
            leaf = q.detach().requires_grad_() if op == "apply_rope autograd" else q
            if op.startswith("apply_rope"):
                got = ropekit.apply_rope(leaf, k, cos, sin, positions=positions, inplace=op.endswith("in place"))
            elif op.startswith("rope_and_cache"):
                got = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1],
                                             slot_mapping=slots, positions=positions[:, 0], **scales)
            elif op == "qk_norm_rope":
                got = ropekit.qk_norm_rope(q, k, cos=cos, sin=sin, positions=positions, **weights)
            else:
                ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cos=cos, sin=sin, kv_cache=kv_cache,
                                           slot_mapping=slots, positions=positions[:, 0])
                got = (q_pe, kv_cache)
            if op == "apply_rope autograd":
                got[0].backward(torch.ones_like(got[0]))
        synchronize()
        qkv0, q_pe0, projection0 = (t.cpu() for t in before)
        q0, k0, v0 = (qkv0[:, a:b].view(TOKENS, 1, -1, D) for a, b in ((0, HQ * D), (HQ * D, (HQ + HK) * D),
                                                                       ((HQ + HK) * D, None)))
        tables = dict(cos=cos.cpu(), sin=sin.cpu())
        with ropekit.device.set_backend("native"):
            if op.startswith("apply_rope"):
                leaf0 = q0.clone().requires_grad_()
                want = ropekit.apply_rope(leaf0, k0, **tables, positions=positions.cpu())
                assert _close(got[0], want[0]) and _close(got[1], want[1]), step
                if op == "apply_rope autograd":
                    want[0].sum().backward()
                    assert _close(leaf.grad, leaf0.grad), step
            elif op.startswith("rope_and_cache"):
                want_caches = [torch.zeros(8, 4, HK, D).to(dtype) for _ in range(2)]
                want = ropekit.rope_and_cache(q0, k0, v0, **tables, k_cache=want_caches[0], v_cache=want_caches[1],
                                              slot_mapping=slots.cpu(), positions=positions[:, 0].cpu(),
                                              **{n: s.cpu() for n, s in scales.items()})
                assert _close(got[0], want[0]), step
                assert all(_close(c, w, dtype) for c, w in zip(caches, want_caches)), step
            elif op == "qk_norm_rope":
                want = ropekit.qk_norm_rope(q0, k0, **tables, positions=positions.cpu(),
                                            **{n: w.cpu() for n, w in weights.items()})
                assert _close(got[0], want[0]) and _close(got[1], want[1]), step
            else:
                want_cache = torch.zeros(8, 4, latent + D, dtype=torch.bfloat16)
                ropekit.mla_rope_and_cache(q_pe0, projection0[:, latent:], projection0[:, :latent], **tables,
                                           kv_cache=want_cache, slot_mapping=slots.cpu(),
                                           positions=positions[:, 0].cpu())
                assert _close(got[0], q_pe0) and _close(got[1], want_cache), step


OPS = ["apply_rope", "apply_rope in place", "apply_rope autograd", "rope_and_cache", "rope_and_cache float8",
       "qk_norm_rope", "mla_rope_and_cache"]


def _side_stream(stream):
    """A context in which ``stream`` is current and sleeps first: what runs in it after the sleep waits for it."""
    @contextlib.contextmanager
    def on_the_side():
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)  # (tens of milliseconds: longer than any call's host path)
            yield
    return on_the_side


@pytest.mark.backend("triton")
@pytest.mark.parametrize("op", OPS)
def test_every_op_matches_the_native_ops_on_the_same_tensors_call_after_call(op):
    """The helper the GPU tests below run, on this machine's device with nothing around the calls."""
    _calls(op, torch.device(DEVICE), contextlib.nullcontext, lambda: None)


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("op", OPS)
def test_every_op_runs_on_the_current_stream(op):
    """A side stream that sleeps before it writes the inputs: a launch on any other stream reads other values."""
    gpu = torch.device("cuda", torch.cuda.current_device())
    _calls(op, gpu, _side_stream(torch.cuda.Stream(gpu)), torch.cuda.synchronize)


@two_gpus
@pytest.mark.parametrize("op", OPS)
def test_every_op_runs_on_its_tensors_gpu_and_stream_while_another_gpu_is_current(op):
    """The calls run with cuda:0 current, on cuda:1's current stream: a side stream that sleeps before it writes the
    inputs, so a launch on cuda:0, or on cuda:1's default stream, reads other values."""
    gpu = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    side = _side_stream(torch.cuda.Stream(gpu))

    @contextlib.contextmanager
    def on_the_side():
        with side(), torch.cuda.device(0):  # (the side stream's context made cuda:1 current)
            assert torch.cuda.current_device() == 0
            yield
            assert torch.cuda.current_device() == 0  # the calls left it current

    def synchronize():
        torch.cuda.synchronize(gpu)
        torch.cuda.synchronize(0)
    _calls(op, gpu, on_the_side, synchronize)
    assert torch.cuda.current_device() == 0
