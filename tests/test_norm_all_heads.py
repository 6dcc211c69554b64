"""A QK-norm across all heads of q and of k (``norm_over="heads"``): OLMo-2's ``q_norm = RMSNorm(num_heads *
head_dim)`` and ``k_norm`` over the whole projection before it is split into heads, then RoPE, as the video diffusion
transformers also normalise. Checked against the float64 reference (forward, and the backward by float64 autograd and
gradcheck through the kernel), for head counts that fill no power of two, GQA, every layout, partial rotary, varlen;
against transformers' own Olmo2 attention; the cache write; the per-head mode left as it was; validation; the launch
choice holding every head of a token in one program; torch.compile; the fuzzer. (CUDA-graph capture of both extents:
tests/test_fused_qk_norm_rope.py; the sanitizer driver's variants: tests/test_reliability_sanitize.py.)"""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.layouts import TO_BSHD, to_bshd
from ropekit.testing import assert_close_to_reference
from ropekit.triton.configs import FusedConfig, FusedShape
from ropekit.triton.fused import forced_fused_config
from ropekit.triton.model import DeviceFacts, is_valid_fused, model_fused
from conftest import DEVICE, gpu_only


def expected(x, weight, cos, sin, positions, layout="bshd", *, norm="before", eps=1e-6, weight_offset=0.0,
             interleaved=False):
    """The float64 reference in x's layout: the RMSNorm over each token's (heads, head_dim) together, before or
    after the rotation (``to_bshd`` is its own inverse)."""
    def normed(v):
        return ref.rms_norm(v, weight, eps=eps, weight_offset=weight_offset, over_heads=True)

    def turned(v):
        return ref.rope_table(v, cos, sin, positions, interleaved=interleaved)

    x = to_bshd(x, layout)
    return to_bshd(turned(normed(x)) if norm == "before" else normed(turned(x)), layout)


def make(layout, batch, seqlen, heads, head_dim, dtype, requires_grad=False):
    x = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE, dtype=torch.float64).to(dtype)
    x = x.permute(TO_BSHD[layout]).contiguous() if layout != "bshd" else x
    return x.requires_grad_(requires_grad)


def weights(hq, hk, head_dim, dtype=torch.float32, requires_grad=False):
    return tuple((torch.rand(h * head_dim, device=DEVICE, dtype=dtype) + 0.5).requires_grad_(requires_grad)
                 for h in (hq, hk))


CASES = {  # (batch and seq apart: a (batch,) offsets tensor is not read as position ids)
    "olmo2-32x128-gqa8-bf16": dict(layout="bshd", batch=1, seqlen=2, hq=32, hk=8, head_dim=128, rotary_dim=128,
                                   interleaved=False, dtype=torch.bfloat16),
    "wan-40x128-fp32": dict(layout="bshd", batch=1, seqlen=1, hq=40, hk=40, head_dim=128, rotary_dim=128,
                            interleaved=False, dtype=torch.float32),
    "5x80-sbhd-gptj-partial-fp16": dict(layout="sbhd", batch=2, seqlen=3, hq=5, hk=5, head_dim=80, rotary_dim=48,
                                        interleaved=True, dtype=torch.float16),
    "3x16-bhsd-mqa-fp32": dict(layout="bhsd", batch=1, seqlen=3, hq=3, hk=1, head_dim=16, rotary_dim=16,
                               interleaved=False, dtype=torch.float32),
}


@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "weightless"])
@pytest.mark.parametrize("norm", ["before", "after"])
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_the_reference(backend, case, norm, weighted):
    layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, dtype = CASES[case].values()
    q, k = make(layout, batch, seqlen, hq, head_dim, dtype), make(layout, batch, seqlen, hk, head_dim, dtype)
    qw, kw = weights(hq, hk, head_dim) if weighted else (None, None)
    cos, sin = ropekit.cos_sin_table(64, rotary_dim, base=5e5, device=DEVICE)
    offsets = torch.tensor([3, 41][:batch], device=DEVICE)
    pos = ref.token_positions(batch, seqlen, offsets=offsets.cpu())
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm=norm, norm_over="heads", eps=1e-5,
                                        positions=offsets, layout=layout, interleaved=interleaved,
                                        rotary_dim=rotary_dim, weight_offset=0.0)
    for out, x, w in ((out_q, q, qw), (out_k, k, kw)):
        assert out.dtype == dtype and out.shape == x.shape
        assert_close_to_reference(out, expected(x, w, cos, sin, pos, layout, norm=norm, eps=1e-5,
                                                interleaved=interleaved))


def test_across_heads_is_not_per_head(backend):
    """One mean square a token, not one a head: with heads of different scales the two modes differ (the reference
    test above could not pass with the extent ignored), and with one head they coincide."""
    q = torch.randn(1, 2, 3, 16, device=DEVICE) * torch.tensor([0.1, 1.0, 10.0], device=DEVICE)[:, None]
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    per_head = ropekit.qk_norm_rope(q, None, cos, sin)[0]
    across = ropekit.qk_norm_rope(q, None, cos, sin, norm_over="heads")[0]
    assert not torch.allclose(per_head, across, atol=1e-2)
    one = q[:, :, :1].contiguous()
    torch.testing.assert_close(ropekit.qk_norm_rope(one, None, cos, sin, norm_over="heads")[0],
                               ropekit.qk_norm_rope(one, None, cos, sin)[0])


def test_varlen_and_in_place_packed_slices(backend):
    """thd with cu_seqlens (an empty sequence among them); q and k as column slices of one packed projection,
    normalised across their heads and rotated where they lie; v stays bit for bit."""
    tokens, hq, hk, d = 7, 3, 2, 16
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=DEVICE)
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    before = qkv.clone()
    qw, kw = weights(hq, hk, d)
    cos, sin = ropekit.cos_sin_table(32, 8, device=DEVICE)
    cu = torch.tensor([0, 4, 4, 7], device=DEVICE)
    ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm_over="heads", layout="thd", cu_seqlens=cu, max_seqlen=4,
                         rotary_dim=8, inplace=True)
    pos = ref.varlen_positions(cu.cpu())
    for x, h, w, start in ((q, hq, qw, 0), (k, hk, kw, hq * d)):
        original = before[:, start:start + h * d].view(tokens, h, d)
        assert_close_to_reference(x, expected(original, w, cos, sin, pos, "thd"))
    assert torch.equal(qkv[:, (hq + hk) * d:], before[:, (hq + hk) * d:])


def test_the_per_head_mode_is_unchanged(backend):
    """``norm_over="head"`` is the default, bit for bit, and still takes (head_dim,) weights."""
    q, k = torch.randn(2, 3, 4, 16, device=DEVICE), torch.randn(2, 3, 2, 16, device=DEVICE)
    qw, kw = torch.randn(16, device=DEVICE), torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    default = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm="after")
    named = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm="after", norm_over="head")
    assert all(torch.equal(a, b) for a, b in zip(default, named))
    pos = ref.token_positions(2, 3)
    assert_close_to_reference(named[0], ref.rms_norm(ref.rope_table(q, cos, sin, pos), qw, eps=1e-6))


def test_matches_transformers_olmo2_attention(backend):
    """transformers' ``Olmo2Attention``: q_norm / k_norm over the whole projections, the view into heads, then
    ``apply_rotary_pos_emb`` with ``Olmo2RotaryEmbedding``'s cos/sin (given per token, ``per_token=True``)."""
    pytest.importorskip("transformers")
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention, Olmo2RotaryEmbedding, apply_rotary_pos_emb
    config = Olmo2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                         max_position_embeddings=64)
    attention, rotary = Olmo2Attention(config, layer_idx=0).eval(), Olmo2RotaryEmbedding(config)
    with torch.no_grad():
        for norm in (attention.q_norm, attention.k_norm):
            norm.weight.copy_(torch.rand(norm.weight.shape) + 0.5)
        hidden = torch.randn(2, 5, 64)
        position_ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
        cos, sin = rotary(hidden, position_ids)
        head_dim = attention.head_dim
        want_q = attention.q_norm(attention.q_proj(hidden)).view(2, 5, -1, head_dim).transpose(1, 2)
        want_k = attention.k_norm(attention.k_proj(hidden)).view(2, 5, -1, head_dim).transpose(1, 2)
        want_q, want_k = apply_rotary_pos_emb(want_q, want_k, cos, sin)
        q = attention.q_proj(hidden).view(2, 5, -1, head_dim)
        k = attention.k_proj(hidden).view(2, 5, -1, head_dim)
        got_q, got_k = ropekit.qk_norm_rope(
            q.to(DEVICE), k.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), attention.q_norm.weight.to(DEVICE),
            attention.k_norm.weight.to(DEVICE), eps=config.rms_norm_eps, norm_over="heads", per_token=True)
    torch.testing.assert_close(got_q.cpu(), want_q.transpose(1, 2))
    torch.testing.assert_close(got_k.cpu(), want_k.transpose(1, 2))


# --- the launch choice ------------------------------------------------------------------------------------------------

H100 = DeviceFacts("NVIDIA H100 80GB HBM3", 132, 3000.0, 700.0, "assumed")


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("tokens", [64, 16384], ids=["decode", "prefill"])
@pytest.mark.parametrize("heads,width", [(32, 128), (40, 128), (5, 80), (3, 16), (24, 128), (128, 256)],
                         ids=["32x128", "40x128", "5x80", "3x16", "24x128", "128x256"])
def test_the_model_puts_every_head_of_a_token_in_one_program(heads, width, tokens, backward):
    shape = FusedShape(tokens, heads, width, 2, norm=True, backward=backward, norm_over_heads=True)
    config = model_fused(H100, shape)
    assert config.block_h >= heads and is_valid_fused(config, shape)


@pytest.mark.backend("triton")
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dw", "deterministic-dw"])
def test_a_forced_configuration_of_fewer_heads_still_normalises_across_all(deterministic):
    """A configuration forced with fewer heads a program than the call has is widened by the plan: the norm's group
    is never split between programs."""
    q, k = make("bshd", 1, 3, 5, 16, torch.float64, True), make("bshd", 1, 3, 2, 16, torch.float64, True)
    qw, kw = weights(5, 2, 16, torch.float64, True)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(8, 16, device=DEVICE))
    torch.use_deterministic_algorithms(deterministic)
    try:
        with forced_fused_config(FusedConfig(1, 1, 4, token_blocks=2)):
            out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm_over="heads")
            grads = torch.autograd.grad((out_q, out_k), (q, k, qw, kw), (torch.ones_like(out_q),
                                                                         torch.ones_like(out_k)))
    finally:
        torch.use_deterministic_algorithms(False)
    pos = ref.token_positions(1, 3)
    leaves = [t.detach().cpu().requires_grad_() for t in (q, k, qw, kw)]
    want = [expected(x, w, cos, sin, pos) for x, w in ((leaves[0], leaves[2]), (leaves[1], leaves[3]))]
    assert_close_to_reference(out_q, want[0].detach())
    want_grads = torch.autograd.grad(want, leaves, [torch.ones_like(w) for w in want])
    for got, wanted in zip(grads, want_grads):
        torch.testing.assert_close(got.cpu(), wanted, rtol=1e-10, atol=1e-10)


# --- autograd ---------------------------------------------------------------------------------------------------------

GRAD_CASES = [
    # id, layout, hq, hk, head_dim, rotary_dim, interleaved
    ("gqa-neox-full", "bshd", 3, 1, 16, 16, False),
    ("mha-gptj-partial-sbhd", "sbhd", 2, 2, 16, 12, True),
    ("gqa-neox-partial-bhsd", "bhsd", 5, 2, 24, 16, False),
]


@pytest.mark.parametrize("weight_offset", [0.0, 1.0], ids=["qwen-weights", "gemma-weights"])
@pytest.mark.parametrize("norm", ["before", "after"])
@pytest.mark.parametrize("layout,hq,hk,head_dim,rotary_dim,interleaved", [c[1:] for c in GRAD_CASES],
                         ids=[c[0] for c in GRAD_CASES])
def test_gradients_match_float64_autograd(backend, layout, hq, hk, head_dim, rotary_dim, interleaved, norm,
                                          weight_offset):
    """dq, dk and the (heads * head_dim,) weight gradients against autograd through the float64 reference."""
    q = make(layout, 2, 3, hq, head_dim, torch.float64, True)
    k = make(layout, 2, 3, hk, head_dim, torch.float64, True)
    qw, kw = weights(hq, hk, head_dim, torch.float64, True)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(16, rotary_dim, device=DEVICE))
    offsets = torch.tensor([2, 9], device=DEVICE)
    kw_args = dict(norm=norm, norm_over="heads", positions=offsets, layout=layout, rotary_dim=rotary_dim,
                   interleaved=interleaved, weight_offset=weight_offset)
    out = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, **kw_args)
    grad_out = [torch.randn_like(o) for o in out]
    got = torch.autograd.grad(out, (q, k, qw, kw), grad_out)
    pos = ref.token_positions(2, 3, offsets=offsets.cpu())
    leaves = [t.detach().cpu().requires_grad_() for t in (q, k, qw, kw)]
    want_out = [expected(x, w, cos, sin, pos, layout, norm=norm, weight_offset=weight_offset,
                         interleaved=interleaved) for x, w in ((leaves[0], leaves[2]), (leaves[1], leaves[3]))]
    want = torch.autograd.grad(want_out, leaves, [g.cpu() for g in grad_out])
    for name, g, w in zip(("q", "k", "q_weight", "k_weight"), got, want):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.backend("triton")
@pytest.mark.parametrize("norm,weighted", [("before", True), ("after", False)], ids=["before-weights",
                                                                                      "after-weightless"])
def test_gradcheck_through_the_kernel(norm, weighted):
    """Small (each of gradcheck's evaluations is a launch in the interpreter): 3 q heads in a tile of 4, partial
    GPT-J rotary."""
    def leaf(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=DEVICE).requires_grad_()
    q, k = leaf(1, 1, 3, 6), leaf(1, 1, 2, 6)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(8, 4, device=DEVICE))

    def f(q, k, *w):
        return ropekit.qk_norm_rope(q, k, cos, sin, *(w or (None, None)), norm=norm, norm_over="heads",
                                    rotary_dim=4, interleaved=True, weight_offset=0.5 if w else 0.0,
                                    positions=torch.tensor([5], device=DEVICE))

    assert torch.autograd.gradcheck(f, (q, k) + ((leaf(18), leaf(12)) if weighted else ()))


def test_torch_compile_fullgraph_forward_and_backward():
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    q = torch.randn(2, 3, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 3, 2, 16, device=DEVICE, requires_grad=True)
    qw, kw = weights(4, 2, 16, requires_grad=True)
    offsets = torch.tensor([4, 0], device=DEVICE)

    def step(q, k, qw, kw, offsets):
        out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm_over="heads", positions=offsets)
        return (out_q * 2).square().sum() + (out_k * out_k.detach()).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    loss = compiled(q, k, qw, kw, offsets)
    got = torch.autograd.grad(loss, (q, k, qw, kw))
    want_loss = step(q, k, qw, kw, offsets)
    want = torch.autograd.grad(want_loss, (q, k, qw, kw))
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_torch_compile_fullgraph_cache_write():
    q, k, v = torch.randn(4, 3, 16, device=DEVICE), torch.randn(4, 1, 16, device=DEVICE), \
        torch.randn(4, 1, 16, device=DEVICE)
    qw, kw = weights(3, 1, 16)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    slots = torch.tensor([3, 0, 6, 5], device=DEVICE)
    positions = torch.tensor([0, 1, 2, 3], device=DEVICE)

    def step(q, k, v, k_cache, v_cache):
        return ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                      q_weight=qw, k_weight=kw, norm_over="heads", positions=positions,
                                      layout="thd", cu_seqlens=torch.tensor([0, 4], device=DEVICE), max_seqlen=4)[0]

    caches = [torch.zeros(2, 4, 1, 16, device=DEVICE) for _ in range(4)]
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    torch.testing.assert_close(compiled(q, k, v, *caches[:2]), step(q, k, v, *caches[2:]))
    for a, b in zip(caches[:2], caches[2:]):
        torch.testing.assert_close(a, b)


@gpu_only
@pytest.mark.parametrize("heads,head_dim", [(32, 128), (40, 128), (128, 128)], ids=["32x128", "40x128", "128x128"])
def test_large_projections_forward_and_backward_on_gpu(heads, head_dim):
    """Prefill-sized projections, up to a tile of one token larger than the usual register bound."""
    q = torch.randn(1, 1024, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    qw = weights(heads, 1, head_dim)[0]
    cos, sin = ropekit.cos_sin_table(4096, head_dim, device="cuda")
    ids = torch.randint(0, 4096, (1, 1024), device="cuda")
    out, _ = ropekit.qk_norm_rope(q, None, cos, sin, qw, None, positions=ids, norm_over="heads")
    assert_close_to_reference(out, expected(q, qw, cos, sin, ids.cpu()))
    q32 = q.float().requires_grad_()
    w32 = qw.clone().requires_grad_()
    out, _ = ropekit.qk_norm_rope(q32, None, cos, sin, w32, None, positions=ids, norm_over="heads")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q32, w32), grad)
    leaves = [q32.detach().double().cpu().requires_grad_(), qw.detach().double().cpu().requires_grad_()]
    want = torch.autograd.grad(expected(leaves[0], leaves[1], cos, sin, ids.cpu()), leaves, grad.double().cpu())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double().cpu(), w, rtol=1e-4, atol=1e-3)


# --- the cache write --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn], ids=["fp32-cache", "e4m3-cache"])
@pytest.mark.parametrize("norm", [None, "before", "after"], ids=["default-place", "before", "after"])
def test_rope_and_cache_caches_the_normalised_rotated_k(backend, norm, cache_dtype):
    tokens, hq, hk, d, block_size = 5, 3, 2, 16, 4
    q, k, v = (torch.randn(tokens, h, d, device=DEVICE) for h in (hq, hk, hk))
    qw, kw = weights(hq, hk, d)
    cos, sin = ropekit.cos_sin_table(32, 8, device=DEVICE)
    positions = torch.tensor([0, 1, 9, 3, 30], device=DEVICE)
    k_cache, v_cache = (torch.zeros(3, block_size, hk, d, device=DEVICE).to(cache_dtype) for _ in range(2))
    scale = torch.tensor([0.01], device=DEVICE) if cache_dtype != torch.float32 else None
    slots = torch.tensor([5, 6, -1, 0, 11], device=DEVICE)
    out_q, out_k = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          k_scale=scale, v_scale=scale, q_weight=qw, k_weight=kw, norm=norm,
                                          norm_over="heads", eps=1e-5, positions=positions, layout="thd",
                                          cu_seqlens=torch.tensor([0, tokens], device=DEVICE), max_seqlen=tokens,
                                          write_k=True, rotary_dim=8)
    pos = positions.cpu()
    place = norm or "before"
    want_k = expected(k, kw, cos, sin, pos, "thd", norm=place, eps=1e-5)
    assert_close_to_reference(out_q, expected(q, qw, cos, sin, pos, "thd", norm=place, eps=1e-5))
    assert_close_to_reference(out_k, want_k)
    written = slots.cpu() >= 0
    cached = k_cache.view(-1, hk, d)[slots[written]].double().cpu()
    if scale is None:
        assert_close_to_reference(cached, want_k[written])
    else:  # the reader's round trip: stored x scale within half an e4m3 step of the float64 truth
        truth = want_k[written] / 0.01
        assert bool(((cached - truth).abs() <= truth.abs() * 2 ** -4 + 2 ** -9).all())


# --- validation -------------------------------------------------------------------------------------------------------

VALIDATION = [
    # id, op, change, error, name in the message
    ("per-head-weight-across-heads", "qk_norm_rope", dict(norm_over="heads", q_weight=16, k_weight=16), ValueError,
     "q_weight"),
    ("k-weight-of-q-heads", "qk_norm_rope", dict(norm_over="heads", q_weight=48, k_weight=48), ValueError,
     "k_weight"),
    ("across-heads-weight-per-head", "qk_norm_rope", dict(q_weight=48, k_weight=16), ValueError,
     "q_weight.*norm_over='heads'"),
    ("unknown-extent", "qk_norm_rope", dict(norm_over="all"), ValueError, "norm_over"),
    ("extent-not-a-string", "qk_norm_rope", dict(norm_over=True), ValueError, "norm_over"),
    ("cache-per-head-weight-across-heads", "rope_and_cache", dict(norm_over="heads", q_weight=16, k_weight=16),
     ValueError, "q_weight"),
    ("cache-extent-without-a-norm", "rope_and_cache", dict(norm_over="heads"), ValueError, "norm_over"),
    ("cache-unknown-extent", "rope_and_cache", dict(norm_over="token", q_weight=16, k_weight=16), ValueError,
     "norm_over"),
]


@pytest.mark.parametrize("op,change,error,name", [c[1:] for c in VALIDATION], ids=[c[0] for c in VALIDATION])
def test_errors_name_the_argument_and_write_nothing(backend, op, change, error, name):
    """q has 3 heads and k 1 of 16 channels: across all heads their weights are (48,) and (16,)."""
    written = dict(q=torch.randn(1, 2, 3, 16, device=DEVICE), k=torch.randn(1, 2, 1, 16, device=DEVICE),
                   k_cache=torch.zeros(1, 2, 1, 16, device=DEVICE))
    before = {name: t.clone() for name, t in written.items()}
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    kwargs = {key: torch.ones(v, device=DEVICE) if key.endswith("weight") else v for key, v in change.items()}
    calls = {  # in place, so that a write before the error would show
        "qk_norm_rope": lambda q, k, k_cache: ropekit.qk_norm_rope(q, k, cos, sin, inplace=True, **kwargs),
        "rope_and_cache": lambda q, k, k_cache: ropekit.rope_and_cache(
            q, k, None, cos, sin, k_cache=k_cache, cache_offsets=0, inplace=True, write_k=True, **kwargs)}
    with pytest.raises(error, match=name):
        calls[op](**written)
    assert all(torch.equal(written[name], before[name]) for name in written)


# --- the fuzzer and the sanitizer -------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["qk_norm_rope", "rope_and_cache"])
def test_the_fuzzer_draws_both_extents(target):
    from ropekit.reliability import fuzz
    chosen = {target: fuzz.targets()[target]}
    extents = {fuzz.draw_case(0, index, DEVICE, chosen).spec.get("norm_over") for index in range(200)}
    assert {"head", "heads"} <= extents



@pytest.mark.parametrize("name", ["decode-b64-olmo2", "prefill-b4-s4096-olmo2", "olmo2-backward-b4-s4096"])
def test_the_fused_benchmark_checks_every_implementation_of_the_olmo2_cases(name):
    """At tiny shapes: the fused call, the unfused pipelines (``F.rms_norm`` of the whole projection) and the
    compiled chain each pass the benchmark's float64 check (the backward writes no cache: one unfused row)."""
    from ropekit.bench import fused, fused_cases
    case = fused_cases.tiny({c.name: c for c in fused_cases.CASES}[name])
    assert case.norm_over == "heads" and case.qk_norm
    rows = fused.run_case(case, fused.impls("aot_eager"), None, DEVICE, log=lambda line: None)
    assert [r["impl"] for r in rows] == list(fused.IMPL_NAMES)
    for row in rows:
        assert (row["status"] == "ok" and row["ok"]) or (case.kind == "backward" and row["status"] == "skipped"), row
