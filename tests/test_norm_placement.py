"""Where the fused ops' RMSNorm lies: before the rotation (Qwen3, Gemma 3) or after it (Llama 4's weightless
``Llama4TextL2Norm`` of the rotated q and k), with weights or without. Checked against the float64 reference (the
norm, then the rotation, or the rotation, then the norm) in every layout, GQA, partial rotary, varlen, in place, the
cache write, against transformers' own Llama 4 modules, by gradcheck through the kernel, under torch.compile, on
both backends, and in validation."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.layouts import TO_BSHD
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE


def expected(x, weight, cos, sin, positions_bs, layout="bshd", *, norm, eps=1e-6, weight_offset=0.0,
             interleaved=False):
    """The float64 reference in x's layout: ``rope(N(x))`` (norm "before") or ``N(rope(x))`` ("after")."""
    x_bshd = x.permute(TO_BSHD[layout]) if layout in TO_BSHD else x

    def normed(v):
        return ref.rms_norm(v, weight, eps=eps, weight_offset=weight_offset)

    if norm == "before":
        out = ref.rope_table(normed(x_bshd), cos, sin, positions_bs, interleaved=interleaved)
    else:
        out = normed(ref.rope_table(x_bshd, cos, sin, positions_bs, interleaved=interleaved))
    return out.permute(TO_BSHD[layout]) if layout in TO_BSHD else out


def make(layout, batch, seqlen, heads, head_dim, dtype):
    x = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE).to(dtype)
    return x.permute(TO_BSHD[layout]).contiguous() if layout != "bshd" else x


CASES = [
    # id, layout, batch, seq, hq, hk, head_dim, rotary_dim, interleaved, dtype
    ("bshd-fp32-gqa", "bshd", 2, 3, 4, 2, 16, 16, False, torch.float32),
    ("sbhd-bf16-gptj", "sbhd", 2, 3, 2, 2, 16, 16, True, torch.bfloat16),
    ("bhsd-fp16-partial", "bhsd", 1, 4, 3, 1, 16, 8, False, torch.float16),
    ("bshd-fp32-gptj-partial-mqa", "bshd", 2, 3, 3, 1, 24, 12, True, torch.float32),
]


@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "weightless"])
@pytest.mark.parametrize("norm", ["before", "after"])
@pytest.mark.parametrize("layout,batch,seqlen,hq,hk,head_dim,rotary_dim,interleaved,dtype",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_qk_norm_rope_matches_the_reference(backend, layout, batch, seqlen, hq, hk, head_dim, rotary_dim,
                                            interleaved, dtype, norm, weighted):
    q, k = make(layout, batch, seqlen, hq, head_dim, dtype), make(layout, batch, seqlen, hk, head_dim, dtype)
    qw, kw = (torch.randn(head_dim, device=DEVICE), torch.randn(head_dim, device=DEVICE)) if weighted else (None,) * 2
    cos, sin = ropekit.cos_sin_table(32, rotary_dim, device=DEVICE)
    offsets = torch.tensor([3, 9][:batch], device=DEVICE)
    pos = ref.token_positions(batch, seqlen, offsets=offsets.cpu())
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, norm=norm, eps=1e-5, positions=offsets,
                                        layout=layout, interleaved=interleaved, rotary_dim=rotary_dim)
    for out, x, w in ((out_q, q, qw), (out_k, k, kw)):
        assert out.dtype == dtype and out.shape == x.shape
        assert_close_to_reference(out, expected(x, w, cos, sin, pos, layout, norm=norm, eps=1e-5,
                                                interleaved=interleaved))


def test_after_the_rotation_is_not_before_it():
    """A rotation keeps a head vector's mean square, so the weights are what tell the placements apart: with them the
    two differ (the reference test above then could not pass with the placement ignored)."""
    q = torch.randn(1, 3, 2, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    before = ropekit.qk_norm_rope(q, None, cos, sin, w, norm="before")[0]
    after = ropekit.qk_norm_rope(q, None, cos, sin, w, norm="after")[0]
    assert not torch.allclose(before, after)


def test_varlen_and_in_place_packed_slices(backend):
    """thd with cu_seqlens; q and k as column slices of one packed projection, normalised after the rotation where
    they lie (the tail past rotary_dim is normalised too, so it is written in place); v stays bit for bit."""
    tokens, hq, hk, d = 6, 4, 2, 16
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=DEVICE, dtype=torch.bfloat16)
    before = qkv.clone()
    q, k = qkv[:, :hq * d].view(tokens, hq, d), qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    cu = torch.tensor([0, 2, 6], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 8, device=DEVICE)
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, norm="after", rotary_dim=8, layout="thd", cu_seqlens=cu,
                                        max_seqlen=4, inplace=True)
    assert out_q is q and out_k is k
    pos = ref.varlen_positions(cu)
    assert_close_to_reference(q, expected(before[:, :hq * d].view(tokens, hq, d), None, cos, sin, pos, "thd",
                                          norm="after"))
    assert_close_to_reference(k, expected(before[:, hq * d:(hq + hk) * d].view(tokens, hk, d), None, cos, sin, pos,
                                          "thd", norm="after"))
    assert torch.equal(qkv[:, (hq + hk) * d:], before[:, (hq + hk) * d:])


def test_matches_transformers_llama4_rope_then_l2_norm(backend):
    """Llama 4: ``apply_rotary_emb`` (complex, pairs 2i and 2i + 1) then ``Llama4TextL2Norm(rms_norm_eps)`` on q and
    k, in bf16 within bf16's tolerance (transformers rounds to bf16 between the two)."""
    pytest.importorskip("transformers")
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm, apply_rotary_emb
    q = torch.randn(2, 5, 4, 32).to(torch.bfloat16)
    k = torch.randn(2, 5, 2, 32).to(torch.bfloat16)
    cos, sin = ropekit.cos_sin_table(16, 32, base=500000.0)
    pos = torch.arange(5)
    freqs_cis = torch.polar(torch.ones_like(cos[pos]), torch.atan2(sin[pos], cos[pos]))[None].expand(2, 5, 16)
    l2 = Llama4TextL2Norm(eps=1e-5)
    want_q, want_k = (l2(x) for x in apply_rotary_emb(q, k, freqs_cis))
    got_q, got_k = ropekit.qk_norm_rope(q.to(DEVICE), k.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), norm="after",
                                        eps=1e-5, interleaved=True)
    torch.testing.assert_close(got_q.cpu(), want_q)
    torch.testing.assert_close(got_k.cpu(), want_k)


# --- autograd ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 16), (True, 12)], ids=["neox-full", "gptj-partial"])
@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "weightless"])
@pytest.mark.parametrize("norm", ["before", "after"])
def test_gradcheck(norm, weighted, interleaved, rotary_dim):
    """On the process's default backend (the kernel on a GPU); the kernel under the interpreter: the next test."""
    cos, sin = ropekit.cos_sin_table(8, rotary_dim, device=DEVICE)
    cos, sin = cos.double(), sin.double()
    q = torch.randn(1, 3, 2, 16, device=DEVICE, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 16, device=DEVICE, dtype=torch.float64, requires_grad=True)
    weights = tuple(torch.randn(16, device=DEVICE, dtype=torch.float64, requires_grad=True) for _ in range(2))

    def f(q, k, *w):
        return ropekit.qk_norm_rope(q, k, cos, sin, *(w or (None, None)), norm=norm, rotary_dim=rotary_dim,
                                    interleaved=interleaved, weight_offset=0.5 if w else 0.0)

    assert torch.autograd.gradcheck(f, (q, k) + (weights if weighted else ()))


@pytest.mark.backend("triton")
@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "weightless"])
def test_gradcheck_through_the_kernel_after_the_rotation(weighted):
    cos, sin = ropekit.cos_sin_table(4, 6, device=DEVICE)
    cos, sin = cos.double(), sin.double()
    q = torch.randn(1, 2, 1, 8, device=DEVICE, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, device=DEVICE, dtype=torch.float64, requires_grad=True)

    def f(q, *w):
        return ropekit.qk_norm_rope(q, None, cos, sin, *(w or (None,)), norm="after", rotary_dim=6, interleaved=True,
                                    weight_offset=0.5 if w else 0.0)[0]

    assert torch.autograd.gradcheck(f, (q, w) if weighted else (q,))


def test_gradients_match_the_reference_after_the_rotation(backend):
    cos, sin = ropekit.cos_sin_table(16, 12, device=DEVICE)
    q = torch.randn(2, 3, 2, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    grad = torch.randn(2, 3, 2, 16, device=DEVICE)
    out = ropekit.qk_norm_rope(q, None, cos, sin, w, norm="after", weight_offset=1.0)[0]
    got = torch.autograd.grad(out, (q, w), grad)
    q64, w64 = q.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    want_out = ref.rms_norm(ref.rope_table(q64, cos, sin, ref.token_positions(2, 3)), w64, eps=1e-6,
                            weight_offset=1.0)
    want = torch.autograd.grad(want_out, (q64, w64), grad.double().cpu())
    for g, wg in zip(got, want):
        torch.testing.assert_close(g.double().cpu(), wg, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["before", "after"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_gradients_with_per_token_rows_whose_halves_differ(backend, norm, interleaved):
    """Per-token rows are any full-width cos/sin (HF's layout), their two halves free to differ: the forward map is
    then no rotation, and the backward must take its transpose; with the norm after it, the backward's own forward
    step must turn by the rows as given (float64 against the reference's autograd)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 2, 8, dtype=torch.float64, generator=g)
    cos, sin = ((torch.rand(1, 2, 8, dtype=torch.float64, generator=g) * 2 - 1).to(DEVICE) for _ in range(2))
    w = torch.rand(8, dtype=torch.float64, generator=g) + 0.5
    grad = torch.randn(1, 2, 2, 8, dtype=torch.float64, generator=g)
    leaves = [t.to(DEVICE).requires_grad_() for t in (x, w)]
    out = ropekit.qk_norm_rope(leaves[0], None, cos, sin, leaves[1], norm=norm, per_token=True,
                               interleaved=interleaved)[0]
    got = torch.autograd.grad(out, leaves, grad.to(DEVICE))
    x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()

    def rows(t):
        return ref.rope_from_cos_sin(t, cos.cpu()[:, :, None, :], sin.cpu()[:, :, None, :], interleaved=interleaved)

    want_out = ref.rms_norm(rows(x64), w64, eps=1e-6) if norm == "after" else rows(ref.rms_norm(x64, w64, eps=1e-6))
    want = torch.autograd.grad(want_out, (x64, w64), grad)
    for a, b in zip(got, want):
        assert_close_to_reference(a, b)


def test_torch_compile_fullgraph_forward_and_backward_after_the_rotation():
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    q = torch.randn(2, 3, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 3, 2, 16, device=DEVICE, requires_grad=True)
    offsets = torch.tensor([4, 0], device=DEVICE)

    def step(q, k, offsets):
        out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, norm="after", positions=offsets, eps=1e-5)
        return (out_q * 2).square().sum() + (out_k * out_k.detach()).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    loss = compiled(q, k, offsets)
    got = torch.autograd.grad(loss, (q, k))
    want_loss = step(q, k, offsets)
    want = torch.autograd.grad(want_loss, (q, k))
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


# --- the cache write --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weighted", [True, False], ids=["weights", "weightless"])
@pytest.mark.parametrize("norm", ["before", "after"])
def test_rope_and_cache_caches_the_normalised_rotated_k(backend, norm, weighted):
    tokens, hq, hk, d, block_size = 5, 4, 2, 16, 4
    q, k, v = (torch.randn(tokens, h, d, device=DEVICE) for h in (hq, hk, hk))
    qw, kw = (torch.randn(d, device=DEVICE), torch.randn(d, device=DEVICE)) if weighted else (None, None)
    cos, sin = ropekit.cos_sin_table(32, 8, device=DEVICE)
    positions = torch.tensor([0, 1, 9, 3, 30], device=DEVICE)
    k_cache, v_cache = (torch.zeros(3, block_size, hk, d, device=DEVICE) for _ in range(2))
    slots = torch.tensor([5, 6, -1, 0, 11], device=DEVICE)
    out_q, out_k = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          q_weight=qw, k_weight=kw, norm=norm, eps=1e-5, positions=positions,
                                          layout="thd", cu_seqlens=torch.tensor([0, tokens], device=DEVICE),
                                          max_seqlen=tokens, write_k=True, rotary_dim=8)
    pos = positions.cpu()
    want_k = expected(k, kw, cos, sin, pos, "thd", norm=norm, eps=1e-5)
    assert_close_to_reference(out_q, expected(q, qw, cos, sin, pos, "thd", norm=norm, eps=1e-5))
    assert_close_to_reference(out_k, want_k)
    written = slots.cpu() >= 0
    assert_close_to_reference(k_cache.view(-1, hk, d)[slots[written]], want_k[written])
    assert torch.equal(v_cache.view(-1, hk, d)[slots[written]], v[written])


def test_rope_and_cache_without_norm_or_weights_does_not_normalise():
    q, k = torch.randn(2, 2, 16, device=DEVICE), torch.randn(2, 1, 16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    k_cache = torch.zeros(1, 2, 1, 16, device=DEVICE)
    out_q, _ = ropekit.rope_and_cache(q[None], k[None], None, cos, sin, k_cache=k_cache, cache_offsets=0)
    assert_close_to_reference(out_q[0], ref.rope_table(q, cos, sin, torch.arange(2)))


# --- both backends ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["before", "after"])
def test_native_backend_gives_the_kernels_results(norm):
    q, k = torch.randn(2, 3, 2, 16, device=DEVICE), torch.randn(2, 3, 1, 16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 12, device=DEVICE)
    results = {}
    for backend in ropekit.device.BACKENDS:
        with ropekit.device.set_backend(backend):
            results[backend] = ropekit.qk_norm_rope(q, k, cos, sin, norm=norm, interleaved=True, rotary_dim=12)
    for a, b in zip(*results.values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# --- validation -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["qk_norm_rope", "rope_and_cache"])
@pytest.mark.parametrize("change,error,name", [
    (dict(norm="middle"), ValueError, "norm"),
    (dict(norm=True), ValueError, "norm"),
    (dict(norm="after", weight_offset=1.0), ValueError, "weight_offset"),
    (dict(norm="after", q_weight=torch.ones(16)), TypeError, "k_weight"),
    (dict(norm="after", k_weight=torch.ones(16)), TypeError, "q_weight"),
    (dict(norm="after", eps=0.0), ValueError, "eps"),
], ids=["unknown-place", "bool", "offset-without-weights", "q-weight-only", "k-weight-only", "eps"])
def test_errors_name_the_argument_and_write_nothing(backend, op, change, error, name):
    q, k = torch.randn(1, 2, 2, 16, device=DEVICE), torch.randn(1, 2, 1, 16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    k_cache = torch.zeros(1, 2, 1, 16, device=DEVICE)
    before = q.clone(), k.clone(), k_cache.clone()
    kwargs = {key: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for key, v in change.items()}
    with pytest.raises(error, match=name):
        if op == "qk_norm_rope":
            ropekit.qk_norm_rope(q, k, cos, sin, inplace=True, **kwargs)
        else:
            ropekit.rope_and_cache(q, k, None, cos, sin, k_cache=k_cache, cache_offsets=0, inplace=True,
                                   write_k=True, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip((q, k, k_cache), before))
