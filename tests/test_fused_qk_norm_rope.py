"""ropekit.qk_norm_rope: per-head RMSNorm + RoPE in one launch, against the float64 reference (norm, then rotation),
in every layout, pairing, position form, partial rotary, in place, packed qkv slices; its fused backward (gradcheck in
float64 through the kernel), torch.compile without graph breaks, and its validation."""

import numpy as np
import pytest
import torch

from ropekit.layouts import TO_BSHD

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from ropekit.triton.configs import FusedShape
from ropekit.triton.fused import fused_config_for
from conftest import DEVICE, gpu_only



def expected(x, weight, cos, sin, positions_bs, layout="bshd", *, eps=1e-6, weight_offset=0.0, interleaved=False,
             over_heads=False):
    """The float64 reference in x's layout: RMSNorm over head_dim (``over_heads``: over all heads together), then the
    table's rotation."""
    x_bshd = x.permute(TO_BSHD[layout]) if layout in TO_BSHD else x
    normed = ref.rms_norm(x_bshd, weight, eps=eps, weight_offset=weight_offset, over_heads=over_heads)
    out = ref.rope_table(normed, cos, sin, positions_bs, interleaved=interleaved)
    return out.permute(TO_BSHD[layout]) if layout in TO_BSHD else out


def tensors(layout, batch, seqlen, hq, hk, head_dim, dtype):
    def make(heads):
        x = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE).to(dtype)
        return x.permute(TO_BSHD[layout]).contiguous() if layout != "bshd" else x
    weights = [torch.randn(head_dim, device=DEVICE).to(dtype) for _ in range(2)]
    return make(hq), make(hk), *weights


CASES = [
    # id, layout, batch, seq, hq, hk, head_dim, rotary_dim, interleaved, positions, dtype, weight_offset
    ("bshd-fp32-offsets", "bshd", 2, 3, 4, 2, 16, 16, False, "offsets", torch.float32, 0.0),
    ("sbhd-bf16-gemma", "sbhd", 2, 3, 4, 2, 16, 16, False, "int", torch.bfloat16, 1.0),
    ("bhsd-fp16-gptj-partial", "bhsd", 1, 4, 2, 1, 16, 8, True, "ids", torch.float16, 0.0),
    ("bshd-fp32-partial-neox", "bshd", 2, 2, 3, 3, 16, 12, False, None, torch.float32, 1.0),
]


@pytest.mark.parametrize("layout,batch,seqlen,hq,hk,head_dim,rotary_dim,interleaved,pos_kind,dtype,offset",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_reference(layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, pos_kind, dtype, offset):
    q, k, qw, kw = tensors(layout, batch, seqlen, hq, hk, head_dim, dtype)
    cos, sin = ropekit.cos_sin_table(32, rotary_dim, device=DEVICE)
    positions, pos_bs = {
        None: (None, ref.token_positions(batch, seqlen)),
        "int": (5, ref.token_positions(batch, seqlen, offsets=5)),
        "offsets": (torch.tensor([3, 9][:batch], device=DEVICE),
                    ref.token_positions(batch, seqlen, offsets=torch.tensor([3, 9][:batch]))),
        "ids": (torch.tensor([[7, 1, 30, 2]], device=DEVICE)[:, :seqlen].expand(batch, seqlen),
                torch.tensor([[7, 1, 30, 2]])[:, :seqlen].expand(batch, seqlen)),
    }[pos_kind]
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=positions, layout=layout,
                                        interleaved=interleaved, rotary_dim=rotary_dim, weight_offset=offset)
    assert out_q.shape == q.shape and out_k.dtype == dtype
    assert_close_to_reference(out_q, expected(q, qw, cos, sin, pos_bs, layout, weight_offset=offset,
                                              interleaved=interleaved))
    assert_close_to_reference(out_k, expected(k, kw, cos, sin, pos_bs, layout, weight_offset=offset,
                                              interleaved=interleaved))


def test_packed_qkv_slices_in_place():
    """q and k as strided column slices of one (tokens, (Hq + 2 Hkv) D) projection, rotated where they lie; v and
    everything else in the buffer stay bit for bit."""
    tokens, hq, hk, d = 5, 4, 2, 16
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=DEVICE, dtype=torch.bfloat16)
    before = qkv.clone()
    q = qkv[:, :hq * d].view(1, tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(1, tokens, hk, d)
    qw, kw = torch.randn(d, device=DEVICE), torch.randn(d, device=DEVICE)  # float32 weights, bf16 activations
    cos, sin = ropekit.cos_sin_table(64, d, device=DEVICE)
    ids = torch.tensor([[4, 0, 63, 7, 7]], device=DEVICE)
    want_q = expected(before[:, :hq * d].view(1, tokens, hq, d), qw, cos, sin, ids.cpu())
    want_k = expected(before[:, hq * d:(hq + hk) * d].view(1, tokens, hk, d), kw, cos, sin, ids.cpu())
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=ids, inplace=True)
    assert out_q is q and out_k is k
    assert_close_to_reference(q, want_q)
    assert_close_to_reference(k, want_k)
    assert torch.equal(qkv[:, (hq + hk) * d:], before[:, (hq + hk) * d:])


def test_varlen_thd_and_table():
    cu = torch.tensor([0, 3, 4, 8], device=DEVICE)
    q, k = torch.randn(8, 2, 16, device=DEVICE), torch.randn(8, 1, 16, device=DEVICE)
    qw, kw = torch.randn(16, device=DEVICE), torch.randn(16, device=DEVICE)
    table = ropekit.RopeTable(16, max_positions=4, device=DEVICE)  # grows for the host-known offset
    out_q, out_k = ropekit.qk_norm_rope(q, k, None, None, qw, kw, table=table, positions=10, layout="thd",
                                        cu_seqlens=cu, max_seqlen=4)
    pos = ref.varlen_positions(cu, offsets=10)
    assert_close_to_reference(out_q, expected(q, qw, table.cos, table.sin, pos, "thd"))
    assert_close_to_reference(out_k, expected(k, kw, table.cos, table.sin, pos, "thd"))


def test_per_token_rows_like_transformers():
    """M-RoPE / HF style: full-width cos/sin per token; the norm then x * cos + rotate_half(x) * sin."""
    q, k = torch.randn(2, 3, 2, 8, device=DEVICE), torch.randn(2, 3, 1, 8, device=DEVICE)
    qw, kw = torch.randn(8, device=DEVICE), torch.randn(8, device=DEVICE)
    angle = torch.rand(2, 3, 4, device=DEVICE) * 6
    cos, sin = torch.cat((angle.cos(),) * 2, -1), torch.cat((angle.sin(),) * 2, -1)
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, per_token=True)
    for out, x, w in ((out_q, q, qw), (out_k, k, kw)):
        normed = ref.rms_norm(x, w, eps=1e-6)
        assert_close_to_reference(out, ref.rope_from_cos_sin(normed, cos[:, :, None].cpu(), sin[:, :, None].cpu()))


def test_matches_transformers_qwen3_norm_and_rope():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
    q, k = torch.randn(1, 6, 4, 32), torch.randn(1, 6, 2, 32)
    norm_q, norm_k = Qwen3RMSNorm(32, eps=1e-6), Qwen3RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm_q.weight.copy_(torch.randn(32))
        norm_k.weight.copy_(torch.randn(32))
    cos, sin = ropekit.cos_sin_table(16, 32)
    pos = torch.arange(6)
    hf_cos, hf_sin = torch.cat((cos[pos],) * 2, -1)[None], torch.cat((sin[pos],) * 2, -1)[None]
    with torch.no_grad():
        want_q, want_k = apply_rotary_pos_emb(norm_q(q).transpose(1, 2), norm_k(k).transpose(1, 2), hf_cos, hf_sin)
        got_q, got_k = ropekit.qk_norm_rope(q.to(DEVICE), k.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE),
                                            norm_q.weight.to(DEVICE), norm_k.weight.to(DEVICE), eps=1e-6)
    assert transformers.__version__
    torch.testing.assert_close(got_q.cpu(), want_q.transpose(1, 2))
    torch.testing.assert_close(got_k.cpu(), want_k.transpose(1, 2))


# --- autograd --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved,rotary_dim,offset", [(False, 6, 1.0), (True, 8, 0.0)])
def test_gradcheck_through_the_kernel(interleaved, rotary_dim, offset):
    def leaf(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=DEVICE).requires_grad_()
    q, k, qw, kw = leaf(1, 2, 1, 8), leaf(1, 2, 1, 8), leaf(8), leaf(8)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(16, rotary_dim, device=DEVICE))

    def f(q, k, qw, kw):
        return ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=3, rotary_dim=rotary_dim,
                                    interleaved=interleaved, weight_offset=offset)
    assert torch.autograd.gradcheck(f, (q, k, qw, kw), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_the_reference(dtype):
    q = torch.randn(2, 3, 4, 16, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(2, 3, 2, 16, device=DEVICE).to(dtype)[..., :12].requires_grad_()  # (non-contiguous rows)
    qw = torch.randn(16, device=DEVICE).requires_grad_()
    kw = torch.randn(12, device=DEVICE).requires_grad_()
    q = q[..., :12]
    cos, sin = ropekit.cos_sin_table(16, 8, device=DEVICE)
    offsets = torch.tensor([2, 7], device=DEVICE)
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw[:12], kw, positions=offsets, rotary_dim=8)
    gq, gk = torch.randn_like(out_q), torch.randn_like(out_k)
    got = torch.autograd.grad((out_q * gq).float().sum() + (out_k * gk).float().sum(), (q, k, qw, kw))
    pos = ref.token_positions(2, 3, offsets=offsets.cpu())
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, qw, kw)]
    want_q = expected(leaves[0], leaves[2][:12], cos, sin, pos)
    want_k = expected(leaves[1], leaves[3], cos, sin, pos)
    want = torch.autograd.grad((want_q * gq.double().cpu()).sum() + (want_k * gk.double().cpu()).sum(), leaves)
    for name, g, w in zip(("q", "k", "q_weight", "k_weight"), got, want):
        # bf16 gradients: one bf16 rounding of fp32 math; the weights' sums are fp32
        torch.testing.assert_close(g.double().cpu(), w, rtol=2e-2 if dtype == torch.bfloat16 else 1e-4,
                                   atol=2e-2 if dtype == torch.bfloat16 else 1e-4, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_match_the_reference_at_qwen3s_heads(dtype):
    """Qwen3-8B's heads (32 q, 8 k, 128 channels), 40 tokens of two sequences at table positions: on a GPU the
    library's backward step takes 16 heads of q (16 bytes of each half a thread; 8 heads of float32 tensors) and k's
    8 in programs of their own, its walk 16 token blocks long and four stages deep (without a GPU, the native
    backward). The gradients of q and k (one rounding to their dtype) and of both weights (float32 sums over the
    tokens and heads) against float64 autograd of the reference."""
    gen = torch.Generator(device="cpu").manual_seed(3)
    q, k = (torch.randn(2, 20, heads, 128, generator=gen).to(DEVICE, dtype).requires_grad_() for heads in (32, 8))
    qw, kw = ((1 + 0.1 * torch.randn(128, generator=gen)).to(DEVICE).requires_grad_() for _ in range(2))
    cos, sin = ropekit.cos_sin_table(4096, 128, device=DEVICE)
    ids = torch.randint(0, 4096, (2, 20), generator=gen)
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=ids.to(DEVICE))
    gq, gk = (torch.randn(out.shape, generator=gen).to(DEVICE, dtype) for out in (out_q, out_k))
    got = torch.autograd.grad((out_q * gq).float().sum() + (out_k * gk).float().sum(), (q, k, qw, kw))
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, qw, kw)]
    want_q, want_k = (expected(x, w, cos, sin, ids) for x, w in ((leaves[0], leaves[2]), (leaves[1], leaves[3])))
    want = torch.autograd.grad((want_q * gq.double().cpu()).sum() + (want_k * gk.double().cpu()).sum(), leaves)
    if DEVICE == "cuda":
        shape = FusedShape(40, 32, 128, q.element_size(), norm=True, backward=True)
        assert fused_config_for(shape, DEVICE)[:2] == (1, 16 if dtype == torch.bfloat16 else 8)
    for name, g, w in zip(("q", "k"), got, want):
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(g.double().cpu(), w, rtol=tolerance, atol=tolerance, msg=name)
    for name, g, w in zip(("q_weight", "k_weight"), got[2:], want[2:]):  # float32 sums of 640 and 160 vectors' terms
        torch.testing.assert_close(g.double().cpu(), w, rtol=1e-4, atol=1e-4 * w.abs().amax().item(), msg=name)


def test_inplace_refuses_autograd():
    q = torch.randn(1, 2, 1, 8, device=DEVICE, requires_grad=True)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    with pytest.raises(ValueError, match="inplace"):
        ropekit.qk_norm_rope(q, None, cos, sin, torch.ones(8, device=DEVICE), inplace=True)


# --- torch.compile ---------------------------------------------------------------------------------------------------

def test_torch_compile_fullgraph_forward_and_backward():
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    q = torch.randn(2, 3, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 3, 2, 16, device=DEVICE)
    qw = torch.randn(16, device=DEVICE, requires_grad=True)
    kw = torch.randn(16, device=DEVICE)
    offsets = torch.tensor([4, 0], device=DEVICE)

    def step(q, k, qw, kw, offsets):
        out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=offsets, weight_offset=1.0)
        return (out_q * 2).square().sum() + out_k.sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    loss = compiled(q, k, qw, kw, offsets)
    got = torch.autograd.grad(loss, (q, qw))
    want_loss = step(q, k, qw, kw, offsets)
    want = torch.autograd.grad(want_loss, (q, qw))
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_torch_compile_in_place():
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    q, w = torch.randn(1, 2, 2, 16, device=DEVICE), torch.randn(16, device=DEVICE)

    def step(q):
        ropekit.qk_norm_rope(q, None, cos, sin, w, inplace=True)
        return q * 1

    want = ropekit.qk_norm_rope(q.clone(), None, cos, sin, w)[0]
    got = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")(q)
    torch.testing.assert_close(got, want)


# --- validation -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,error,name", [
    (dict(q_weight=torch.ones(15)), ValueError, "q_weight"),
    (dict(k_weight=torch.ones(16, dtype=torch.int32)), TypeError, "k_weight"),
    (dict(k_weight=None), TypeError, "k_weight"),
    (dict(q_weight=torch.ones(1, 16)), ValueError, "q_weight"),
    (dict(eps=0.0), ValueError, "eps"),
    # eps is added in float32: 1e-50 is 0 there (a zero head would be NaN), 1e-39 a subnormal, 1e39 infinite
    (dict(eps=1e-50), ValueError, "eps"),
    (dict(eps=1e-39), ValueError, "eps"),
    (dict(eps=1e39), ValueError, "eps"),
    (dict(eps="1e-6"), TypeError, "eps"),
    (dict(eps=True), TypeError, "eps"),
    (dict(weight_offset=float("nan")), TypeError, "weight_offset"),
    (dict(rotary_dim=18), ValueError, "rotary_dim"),
])
def test_errors_name_the_argument_and_write_nothing(change, error, name):
    q, k = torch.randn(1, 2, 2, 16, device=DEVICE), torch.randn(1, 2, 1, 16, device=DEVICE)
    before = q.clone(), k.clone()
    kwargs = dict(q_weight=torch.ones(16), k_weight=torch.ones(16), eps=1e-6, weight_offset=0.0)
    kwargs.update(change)
    kwargs = {key: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for key, v in kwargs.items()}
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    with pytest.raises(error, match=name):
        ropekit.qk_norm_rope(q, k, cos, sin, inplace=True, **kwargs)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


@pytest.mark.parametrize("eps,weight_offset", [
    (np.float32(1e-6), np.float32(1.0)),  # what a config read with numpy holds
    (np.float64(1e-6), np.int64(0)),
    (float(torch.finfo(torch.float32).tiny), 0.0),  # the smallest eps accepted: a zero head stays 0, not NaN
], ids=["numpy-float32", "numpy-float64-and-int", "smallest-normal-float32"])
def test_eps_and_weight_offset_take_host_real_numbers(eps, weight_offset):
    q = torch.randn(1, 2, 2, 16, device=DEVICE)
    q[0, 1, 0] = 0.0  # a padding head
    w = torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    out, _ = ropekit.qk_norm_rope(q, None, cos, sin, w, eps=eps, weight_offset=weight_offset)
    want = expected(q, w, cos, sin, ref.token_positions(1, 2), eps=float(eps), weight_offset=float(weight_offset))
    assert_close_to_reference(out, want)
    assert torch.equal(out[0, 1, 0], torch.zeros_like(out[0, 1, 0]))


def test_meta_tensors_infer_shapes():
    q, k = torch.empty(2, 3, 4, 16, device="meta"), torch.empty(2, 3, 2, 16, device="meta")
    cos, sin = torch.empty(8, 8, device="meta"), torch.empty(8, 8, device="meta")
    w = torch.empty(16, device="meta")
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, w, w)
    assert out_q.shape == q.shape and out_k.shape == k.shape and out_q.device.type == "meta"


# --- the real sizes, on a GPU -----------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("tokens", [1, 4096])
def test_qwen3_8b_shapes_on_gpu(tokens):
    """Qwen3-8B heads (32 q / 8 kv x 128, bf16) as slices of the packed qkv projection, prefill and decode-sized."""
    hq, hk, d = 32, 8, 128
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device="cuda", dtype=torch.bfloat16)
    q, k = qkv[:, :hq * d].view(1, tokens, hq, d), qkv[:, hq * d:(hq + hk) * d].view(1, tokens, hk, d)
    qw, kw = torch.randn(d, device="cuda", dtype=torch.bfloat16), torch.randn(d, device="cuda", dtype=torch.bfloat16)
    cos, sin = ropekit.cos_sin_table(8192, d, base=1e6, device="cuda")
    ids = torch.randint(0, 8192, (1, tokens), device="cuda")
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=ids)
    assert_close_to_reference(out_q, expected(q, qw, cos, sin, ids.cpu()))
    assert_close_to_reference(out_k, expected(k, kw, cos, sin, ids.cpu()))
    # the backward at the same size against the reference's
    q32 = q.float().requires_grad_()
    out, _ = ropekit.qk_norm_rope(q32, None, cos, sin, qw.float().requires_grad_(), None, positions=ids)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, q32, grad)
    leaf = q32.detach().double().cpu().requires_grad_()
    (want,) = torch.autograd.grad(expected(leaf, qw.float(), cos, sin, ids.cpu()), leaf, grad.double().cpu())
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-4)


def test_gradients_without_k():
    """q alone (k None): the backward returns q's and q_weight's gradients only."""
    q = torch.randn(1, 3, 2, 8, device=DEVICE, dtype=torch.float64, requires_grad=True)
    qw = torch.randn(8, device=DEVICE, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(8, 8, device=DEVICE))
    out_q, out_k = ropekit.qk_norm_rope(q, None, cos, sin, qw)
    assert out_k is None
    got = torch.autograd.grad(out_q.sum(), (q, qw))
    leaves = [t.detach().cpu().requires_grad_() for t in (q, qw)]
    want = torch.autograd.grad(expected(leaves[0], leaves[1], cos, sin, ref.token_positions(1, 3)).sum(), leaves)
    for g, w in zip(got, want):
        assert_close_to_reference(g, w)


@gpu_only
@pytest.mark.parametrize("norm_over", ["head", "heads"])
def test_cuda_graph_replays_with_new_positions(norm_over):
    """Qwen3-8B's decode shapes (32 q / 8 kv heads x 128), per head; across all heads (OLMo-2's norm), a program
    holds a token's 32 q heads."""
    over_heads = norm_over == "heads"
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    qw, kw = (torch.randn(h * 128 if over_heads else 128, device="cuda") for h in (32, 8))
    cos, sin = ropekit.cos_sin_table(8192, 128, device="cuda")
    offsets = torch.randint(0, 8000, (64,), device="cuda")
    out = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=offsets, norm_over=norm_over)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["q"], out["k"] = ropekit.qk_norm_rope(q, k, cos, sin, qw, kw, positions=offsets, norm_over=norm_over)
    for _ in range(3):
        offsets.copy_(torch.randint(0, 8000, (64,), device="cuda"))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        pos = ref.token_positions(64, 1, offsets=offsets.cpu())
        assert_close_to_reference(out["q"], expected(q, qw, cos, sin, pos, over_heads=over_heads))
        assert_close_to_reference(out["k"], expected(k, kw, cos, sin, pos, over_heads=over_heads))


def test_hostile_values_follow_the_reference():
    """A NaN makes its head NaN; an infinity zeroes its head's finite channels and makes its own pair NaN."""
    q = torch.randn(1, 2, 2, 8, device=DEVICE)
    q[0, 0, 0, 3] = float("inf")
    q[0, 1, 1, 2] = float("nan")
    w = torch.randn(8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    out, _ = ropekit.qk_norm_rope(q, None, cos, sin, w)
    assert_close_to_reference(out, expected(q, w, cos, sin, ref.token_positions(1, 2)))
    assert bool(out[0, 1, 1].isnan().all()) and bool(out[0, 0, 1].isfinite().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_head_whose_sum_of_squares_overflows_float32_comes_out_as_zeros(dtype):
    """docs/fused.md: mean(x^2) is a float32 sum, as in transformers' RMSNorm. A channel of 1.8e19 still squares
    below float32's largest (3.4e38) and its head is normalised as the float64 reference says; one of 1.9e19
    overflows the sum to inf, rsqrt(inf) = 0, and the whole head, the large channel included, comes out as zeros.
    Other heads are untouched by it."""
    q = torch.randn(1, 1, 3, 16, device=DEVICE)
    q[0, 0, 0, 5], q[0, 0, 1, 5] = 1.8e19, 1.9e19
    q = q.to(dtype)
    w = torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    out, _ = ropekit.qk_norm_rope(q, None, cos, sin, w, positions=3)
    want = expected(q, w, cos, sin, ref.token_positions(1, 1, offsets=3))
    assert_close_to_reference(out[:, :, [0, 2]], want[:, :, [0, 2]])
    assert torch.equal(out[0, 0, 1], torch.zeros_like(out[0, 0, 1]))


def with_probes(shape, probes, gen):
    """Random float32 values of ``shape`` on the GPU whose channels at ``probes`` hold ±1 or ±2: a product with such a
    value is exact, so a factor it meets shows in the result unrounded."""
    x = torch.randn(shape, device="cuda", generator=gen)
    signs = torch.randint(0, 2, (*shape[:-1], int(probes.sum())), device="cuda", generator=gen) * 2 - 1
    powers = torch.randint(0, 2, signs.shape, device="cuda", generator=gen)
    x[..., probes] = (signs * 2.0 ** powers).float()
    return x


@gpu_only
@pytest.mark.parametrize("tokens", [64, 4096])
@pytest.mark.parametrize("norm_over", ["head", "heads"])
def test_one_factor_scales_every_channel_of_a_norm_group(norm_over, tokens):
    """The norm scales every channel of its group (a head vector, or all heads of a token) by one factor r, so
    the lanes that share a reduction must agree on its sum (fused_tiles.channel_dot: a compiler that fuses a lane's
    own product into the cross-lane sum, and not its partner's, leaves them with sums an ulp apart). Probe channels
    hold ±1 and ±2, one in every four channels, so that lanes on both sides of the butterfly's first step (lanes 16
    apart) hold probes. At position 0 the rotation leaves a channel as it is, and the weightless norm after it
    multiplies it by r exactly: out / x at a probe is r itself, and must be one value across the group. The shape is
    the sanitizer driver's (80 channels, 48 of them rotated, 3 q heads and 1 k head). Where the lanes read r back
    from shared memory (a norm over all heads), they agree whatever they stored, and the disagreement is what
    racecheck sees: the sanitize run covers that."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    cos, sin = ropekit.cos_sin_table(64, 48, device="cuda")
    probes = torch.arange(80, device="cuda") % 4 == 0

    q, k = with_probes((tokens, 3, 80), probes, gen), with_probes((tokens, 1, 80), probes, gen)
    k_cache = torch.zeros(tokens // 8 + 1, 8, 1, 80, device="cuda")
    out_q, out_k = ropekit.rope_and_cache(
        q, k, None, cos, sin, k_cache=k_cache, slot_mapping=torch.randperm(tokens, device="cuda", generator=gen),
        positions=torch.zeros(tokens, dtype=torch.int64, device="cuda"), layout="thd",
        cu_seqlens=torch.tensor([0, tokens], dtype=torch.int32, device="cuda"), max_seqlen=tokens, norm="after",
        norm_over=norm_over, eps=1e-5, write_k=True)
    for name, x, out in (("q", q, out_q), ("k", k, out_k)):
        factors = out[..., probes] / x[..., probes]  # (tokens, heads, probes): each an exact r
        factors = factors.flatten(1) if norm_over == "heads" else factors
        spread = (factors.amax(-1) != factors.amin(-1)).sum().item()
        assert spread == 0, f"{name}: {spread} of {factors[..., 0].numel()} norm groups scaled by two factors"


@gpu_only
@pytest.mark.parametrize("shape", ["qwen3", "driver"])
@pytest.mark.parametrize("norm_over", ["head", "heads"])
def test_the_backward_scales_every_channel_of_a_norm_group_by_one_factor(norm_over, shape):
    """The backward of the norm before the rotation is dx = r * w * h - c * x, h the incoming gradient turned by -θ,
    c = r^3 * mean(h * w * x) over the group: one c a group, so the lanes that share its reductions (the mean square
    and the dot product, fused_tiles.channel_dot) must agree on them. The weights are 1; at probe channels, one in
    every four (so that lanes on both sides of the butterfly's first step hold probes; a channel's NeoX partner is a
    probe too), the gradient is 0 and x is ±1 or ±2: h is 0 there at any angle, dx = -c * x exactly, and -dx / x is
    c itself, one value across the group. Qwen3's heads (128 channels, 8 q heads, 2 k heads), and the sanitizer
    driver's (80 channels, 48 of them rotated, 3 q heads, 1 k head); float32."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    tokens = 4096
    dim, rotary, hq, hk = (128, 128, 8, 2) if shape == "qwen3" else (80, 48, 3, 1)
    cos, sin = ropekit.cos_sin_table(tokens, rotary, device="cuda")
    probes = torch.arange(dim, device="cuda") % 4 == 0

    def make(heads):
        x = with_probes((1, tokens, heads, dim), probes, gen)
        grad = torch.randn(x.shape, device="cuda", generator=gen)
        grad[..., probes] = 0.0
        return x.requires_grad_(), grad

    (q, g_q), (k, g_k) = make(hq), make(hk)
    w_q = torch.ones((hq if norm_over == "heads" else 1) * dim, device="cuda")
    w_k = torch.ones((hk if norm_over == "heads" else 1) * dim, device="cuda")
    out_q, out_k = ropekit.qk_norm_rope(q, k, cos, sin, w_q, w_k, positions=torch.zeros(1, dtype=torch.int64,
                                        device="cuda"), eps=1e-6, norm_over=norm_over)
    torch.autograd.backward((out_q, out_k), (g_q, g_k))
    for name, x in (("q", q), ("k", k)):
        factors = -x.grad[..., probes] / x.detach()[..., probes]  # (1, tokens, heads, probes): each an exact c
        factors = factors.flatten(2) if norm_over == "heads" else factors
        assert (factors != 0).all(), f"{name}: a probe's gradient is 0: c is not seen"
        spread = (factors.amax(-1) != factors.amin(-1)).sum().item()
        assert spread == 0, f"{name}: {spread} of {factors[..., 0].numel()} norm groups with two factors in dx"


def test_a_table_of_no_rows_gives_nan_on_every_backend(backend):
    """Positions in a device tensor are not read on the host; with a table of no rows every one of them lies outside
    it, and the rotated channels come out NaN (docs/api.md#tokens-outside-the-table) on the native backend as in the
    kernel, for apply_rope, qk_norm_rope and rope_and_cache alike."""
    q, k = torch.randn(1, 2, 2, 16, device=DEVICE), torch.randn(1, 2, 1, 16, device=DEVICE)
    cos = sin = torch.zeros(0, 8, device=DEVICE)
    positions = torch.zeros(1, 2, dtype=torch.long, device=DEVICE)
    outs = [ropekit.apply_rope(q, k, cos, sin, positions=positions)[0],
            ropekit.qk_norm_rope(q, k, cos, sin, positions=positions)[0],
            ropekit.rope_and_cache(q, k, None, cos, sin, positions=positions, cache_offsets=0,
                                   k_cache=torch.zeros(1, 4, 1, 16, device=DEVICE))[0]]
    for out in outs:
        assert bool(out.isnan().all())
