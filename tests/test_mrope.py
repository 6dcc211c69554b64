"""M-RoPE chosen inside the kernel, as a specification: ``apply_rope(q, k, cos, sin, positions=<(3, batch, seq) or
(3, tokens)>, mrope_section=[t, h, w], mrope_interleaved=False)`` rotates pair ``i`` of every token by the angle of
the position of the pair's axis (temporal, height, width), read from the same half-width table a text call reads,
with no per-token rows: Qwen2-VL's and Qwen2.5-VL's consecutive sections, and Qwen3-VL's interleaved ones (against
transformers' Qwen-VL modules: tests/test_hf.py). Every layout, GQA, partial rotary, GPT-J pairing, in place,
table-free angles, autograd and torch.compile, on the Triton kernel and the native backend; validation names the
argument before anything is written."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.frequencies import inverse_frequencies
from ropekit.layouts import TO_BSHD
from ropekit.testing import assert_close_to_reference
from ropekit.triton.launch import FlatConfig, forced_config, plans, recorded_launches
from conftest import DEVICE, gpu_only
from rope_cases import make, table

triton_backend = pytest.mark.backend("triton")

# (id, mrope_section, mrope_interleaved) for rotary_dim 32: Qwen2-VL's [16, 24, 24] and Qwen3-VL's [24, 20, 20]
# scaled down to 16 pairs
VARIANTS = [("contiguous", [4, 6, 6], False), ("interleaved", [6, 5, 5], True)]
VARIANT_IDS = [v[0] for v in VARIANTS]


def mrope_ids(batch, seqlen, rows=64):
    """(3, batch, seq) temporal, height and width position ids, each axis its own values."""
    return torch.randint(0, rows, (3, batch, seqlen))


def expected(x, layout, ids, section, mrope_interleaved, **kwargs):
    """The float64 reference in x's layout, from (3, batch, seq) ids."""
    order = TO_BSHD[layout]
    return ref.mrope(x.permute(order), ids, section, mrope_interleaved=mrope_interleaved, **kwargs).permute(order)


# --- the reference: the engines' formulas ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_reference_is_vllms_half_width_gather(variant, section, interleaved):
    """vLLM's ``MRotaryEmbedding.forward_native``: the half-width cos of each axis' position, recombined by
    ``cat(m[i] for i, m in enumerate(cos.split(section)))`` or by ``apply_interleaved_rope``."""
    ids = mrope_ids(2, 7, 100)
    theta = ref.angles(ids, inverse_frequencies(32))  # (3, batch, seq, 16): every axis at every pair
    if interleaved:
        pairs = torch.arange(16)
        height = (pairs % 3 == 1) & (pairs < 3 * section[1])
        width = (pairs % 3 == 2) & (pairs < 3 * section[2])
        want = torch.where(width, theta[2], torch.where(height, theta[1], theta[0]))
    else:
        want = torch.cat([m[i] for i, m in enumerate(theta.split(section, dim=-1))], dim=-1)
    pair_positions = ref.mrope_pair_positions(ids, section, mrope_interleaved=interleaved)
    torch.testing.assert_close(pair_positions.double() * inverse_frequencies(32).double(), want, rtol=0, atol=0)


# --- every case apply_rope takes ------------------------------------------------------------------------------------

# (id, layout, batch, seq, hq, hk, head_dim, rotary_dim, pairing interleaved, dtype)
CASES = [
    ("bshd-neox-fp32", "bshd", 2, 5, 4, 2, 32, 32, False, torch.float32),
    ("sbhd-gptj-bf16", "sbhd", 2, 4, 4, 4, 32, 32, True, torch.bfloat16),
    ("bhsd-neox-mqa-fp16", "bhsd", 3, 4, 4, 1, 32, 32, False, torch.float16),
    ("bshd-neox-partial-fp32", "bshd", 2, 3, 2, 2, 48, 32, False, torch.float32),
    ("bshd-gptj-partial-fp64", "bshd", 1, 3, 2, 1, 40, 32, True, torch.float64),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference_for_every_layout_and_pairing(backend, case, variant, section, interleaved, inplace):
    """GQA/MQA, partial rotary (the tail copied out of place, untouched in place), GPT-J pairing, every dtype."""
    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, pairing, dtype = case
    q, k = make(layout, batch, seqlen, hq, head_dim, dtype), make(layout, batch, seqlen, hk, head_dim, dtype)
    q_before, k_before = q.clone(), k.clone()
    ids = mrope_ids(batch, seqlen)
    cos, sin = table(64, rotary_dim)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=ids.to(DEVICE), layout=layout, interleaved=pairing,
                                      inplace=inplace, mrope_section=section, mrope_interleaved=interleaved)
    assert (out_q is q) == inplace and (out_k is k) == inplace
    kw = dict(interleaved=pairing, rotary_dim=rotary_dim)
    assert_close_to_reference(out_q, expected(q_before, layout, ids, section, interleaved, **kw))
    assert_close_to_reference(out_k, expected(k_before, layout, ids, section, interleaved, **kw))
    assert torch.equal(out_q[..., rotary_dim:], q_before[..., rotary_dim:])


@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_varlen_thd_takes_three_ids_per_packed_token(backend, variant, section, interleaved):
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    q, k = torch.randn(9, 4, 32, device=DEVICE), torch.randn(9, 2, 32, device=DEVICE)
    ids = torch.randint(0, 64, (3, 9))
    cos, sin = table(64, 32)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=ids.to(DEVICE), layout="thd", cu_seqlens=cu,
                                      max_seqlen=5, mrope_section=section, mrope_interleaved=interleaved)
    assert_close_to_reference(out_q, ref.mrope(q, ids, section, mrope_interleaved=interleaved))
    assert_close_to_reference(out_k, ref.mrope(k, ids, section, mrope_interleaved=interleaved))


def test_ids_shared_by_the_batch_and_strided_ids_are_read_where_they_lie(backend):
    q = make("bshd", 3, 5, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    shared = torch.randint(0, 64, (3, 1, 5))
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=shared.to(DEVICE), mrope_section=[4, 6, 6])
    assert_close_to_reference(out, ref.mrope(q, shared.expand(3, 3, 5), [4, 6, 6]))
    wide = torch.randint(0, 64, (3, 3, 10))  # every other token of a wider buffer: strides (30, 10, 2)
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=wide.to(DEVICE)[..., ::2], mrope_section=[4, 6, 6])
    assert_close_to_reference(out, ref.mrope(q, wide[..., ::2], [4, 6, 6]))


@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_text_positions_are_the_ordinary_rotation(backend, variant, section, interleaved):
    """With the three axes equal M-RoPE is the ordinary rotation: three equal rows give a text call's bits, and
    every other position form (None, an int, offsets, (batch, seq) ids) is a text call."""
    q = make("bshd", 2, 5, 4, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    plain, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids)
    same_axes, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids.expand(3, 2, 5), mrope_section=section,
                                      mrope_interleaved=interleaved)
    assert torch.equal(same_axes, plain)
    for positions in (None, 7, torch.tensor([3, 9], device=DEVICE), ids):
        text, _ = ropekit.apply_rope(q, None, cos, sin, positions=positions, mrope_section=section,
                                     mrope_interleaved=interleaved)
        assert torch.equal(text, ropekit.apply_rope(q, None, cos, sin, positions=positions)[0])


def test_the_layouts_differ_and_the_section_matters(backend):
    q = make("bshd", 1, 6, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = mrope_ids(1, 6).to(DEVICE)
    outs = [ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=section, mrope_interleaved=inter)[0]
            for section, inter in (([4, 6, 6], False), ([4, 6, 6], True), ([8, 4, 4], False))]
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])


@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_table_free_angles_at_each_axis_position(backend, variant, section, interleaved):
    """With ``inv_freq`` instead of a table, each pair's angle is computed at its axis' position."""
    q = make("bshd", 2, 4, 2, 32, torch.float32)
    ids = torch.randint(0, 9_000_000, (3, 2, 4))
    out, _ = ropekit.apply_rope(q, None, inv_freq=inverse_frequencies(32).to(DEVICE), positions=ids.to(DEVICE),
                                mrope_section=section, mrope_interleaved=interleaved)
    assert_close_to_reference(out, ref.mrope(q, ids, section, mrope_interleaved=interleaved))


@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_the_materialised_rows_give_the_same_result(backend, variant, section, interleaved):
    """``ropekit.mrope_cos_sin`` (per-token rows gathered on the host side, the path this replaces) and the kernel's
    own choice agree: the same table values reach the same pairs."""
    q, k = make("bshd", 2, 5, 4, 32, torch.float32), make("bshd", 2, 5, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 5).to(DEVICE)
    rows = ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)
    materialised = ropekit.apply_rope(q, k, *rows, per_token=True)
    in_kernel = ropekit.apply_rope(q, k, cos, sin, positions=ids, mrope_section=section, mrope_interleaved=interleaved)
    for a, b in zip(in_kernel, materialised):
        assert torch.equal(a, b)


@triton_backend
@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_the_kernel_and_the_native_backend_agree_bit_for_bit(variant, section, interleaved):
    q = make("bshd", 2, 6, 4, 32, torch.bfloat16)
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 6).to(DEVICE)
    kw = dict(positions=ids, mrope_section=section, mrope_interleaved=interleaved)
    assert torch.equal(ropekit.apply_rope(q, None, cos, sin, backend="triton", **kw)[0],
                       ropekit.apply_rope(q, None, cos, sin, backend="native", **kw)[0])


def test_an_axis_position_outside_the_table_spoils_only_its_pairs(backend):
    """A position past the table is never read: the pairs of that axis come out NaN, the token's other pairs
    are rotated."""
    q = make("bshd", 1, 3, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = torch.randint(0, 64, (3, 1, 3))
    ids[1, 0, 1] = 64  # the height position of token 1
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids.to(DEVICE), mrope_section=[4, 6, 6])
    height = torch.zeros(32, dtype=torch.bool)
    height[4:10] = height[20:26] = True  # pairs 4..9, both channels (NeoX)
    nan = torch.isnan(out[0]).cpu()
    assert nan[1].equal(height.expand(2, 32)) and not nan[0].any() and not nan[2].any()


def test_check_mode_refuses_positions_outside_the_table(backend, monkeypatch):
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    q = make("bshd", 1, 3, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = torch.randint(0, 64, (3, 1, 3), device=DEVICE)
    ids[2, 0, 0] = 70
    with pytest.raises(ValueError, match="positions reach 70"):
        ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=[4, 6, 6])


def test_a_rope_table_grows_to_the_sequence(backend):
    q = make("bshd", 1, 40, 2, 32, torch.float32)
    growing = ropekit.RopeTable(32, 8, device=DEVICE)
    ids = torch.stack((torch.arange(40), torch.arange(40) // 2, torch.arange(40) % 7))[:, None]
    out, _ = ropekit.apply_rope(q, None, table=growing, positions=ids.to(DEVICE), mrope_section=[4, 6, 6])
    assert len(growing) >= 40
    assert_close_to_reference(out, ref.mrope(q, ids, [4, 6, 6]))


# --- autograd and torch.compile -------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_backward_is_the_conjugate_rotation(backend, variant, section, interleaved):
    q = make("bshd", 2, 4, 4, 32, torch.float32).requires_grad_()
    k = make("bshd", 2, 4, 2, 32, torch.float32).requires_grad_()
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 4)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=ids.to(DEVICE), mrope_section=section,
                                      mrope_interleaved=interleaved)
    grad_q, grad_k = torch.randn_like(out_q), torch.randn_like(out_k)
    torch.autograd.backward((out_q, out_k), (grad_q, grad_k))
    assert_close_to_reference(q.grad, ref.mrope(grad_q, ids, section, mrope_interleaved=interleaved, conjugate=True))
    assert_close_to_reference(k.grad, ref.mrope(grad_k, ids, section, mrope_interleaved=interleaved, conjugate=True))


def test_gradcheck_in_float64(backend):
    q = torch.randn(1, 3, 2, 12, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 3, 1, 12, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = ropekit.cos_sin_table(32, 8, dtype=torch.float64, device=DEVICE)
    ids = torch.randint(0, 32, (3, 1, 3), device=DEVICE)

    def f(q, k):
        return ropekit.apply_rope(q, k, cos, sin, positions=ids, rotary_dim=8, mrope_section=[2, 1, 1],
                                  mrope_interleaved=True)

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-6)


def test_torch_compile_fullgraph_no_graph_break(backend):
    cos, sin = table(64, 32)

    def step(q, k, ids):
        q2, k2 = ropekit.apply_rope(q, k, cos, sin, positions=ids, mrope_section=[6, 5, 5], mrope_interleaved=True)
        return (q2 * 2).sum(-1), k2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    q = make("bshd", 2, 3, 4, 32, torch.float32).requires_grad_()
    k = make("bshd", 2, 3, 2, 32, torch.float32)
    ids = mrope_ids(2, 3).to(DEVICE)
    got_q, got_k = compiled(q, k, ids)
    want_q, want_k = step(q, k, ids)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    got_q.sum().backward()
    assert_close_to_reference(q.grad, ref.mrope(torch.full_like(q, 2.0), ids.cpu(), [6, 5, 5],
                                                mrope_interleaved=True, conjugate=True))

    def rotate_in_place(x, ids):
        ropekit.apply_rope(x, None, cos, sin, positions=ids, mrope_section=[4, 6, 6], inplace=True)
        return x

    x = make("bshd", 2, 3, 4, 32, torch.float32)
    got = torch.compile(rotate_in_place, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")(
        x.clone(), ids)
    assert_close_to_reference(got, ref.mrope(x, ids.cpu(), [4, 6, 6]))


@gpu_only
def test_cuda_graph_replays_with_new_positions():
    cos, sin = ropekit.cos_sin_table(8192, 128, device="cuda")
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 8192, (3, 64, 1), device="cuda")
    kw = dict(positions=ids, mrope_section=[24, 20, 20], mrope_interleaved=True)
    out = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            ropekit.apply_rope(q, k, cos, sin, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["q"], out["k"] = ropekit.apply_rope(q, k, cos, sin, **kw)
    for _ in range(3):
        ids.copy_(torch.randint(0, 8192, (3, 64, 1), device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out["q"], ref.mrope(q, ids.cpu(), [24, 20, 20], mrope_interleaved=True))
        assert_close_to_reference(out["k"], ref.mrope(k, ids.cpu(), [24, 20, 20], mrope_interleaved=True))


@gpu_only
@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_the_rows_build_is_captured_in_a_cuda_graph(variant, section, interleaved):
    """``mrope_cos_sin`` copies no host data to the device (each pair's axis is device arithmetic), so a CUDA graph
    captures the build; replayed with new ids it gives the eager call's rows."""
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 5).to(DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)
    for seed in range(2):
        ids.copy_(torch.randint(0, 64, ids.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(rows, ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)):
            assert torch.equal(got, want)


# --- validation: every error names the argument, before anything is written -----------------------------------------

def _ids(*shape):
    return torch.randint(0, 16, shape, device=DEVICE)


BAD_CALLS = [
    ("section-sum", ValueError, "mrope_section", dict(mrope_section=[4, 6, 5], positions=_ids(3, 2, 3))),
    ("section-two-entries", ValueError, "mrope_section", dict(mrope_section=[8, 8], positions=_ids(3, 2, 3))),
    ("section-negative", ValueError, "mrope_section", dict(mrope_section=[-2, 12, 6], positions=_ids(3, 2, 3))),
    ("section-float", ValueError, "mrope_section", dict(mrope_section=[4.0, 6, 6], positions=_ids(3, 2, 3))),
    ("section-bool", ValueError, "mrope_section", dict(mrope_section=[True, 9, 6], positions=_ids(3, 2, 3))),
    ("section-not-a-list", TypeError, "mrope_section", dict(mrope_section=16, positions=_ids(3, 2, 3))),
    ("section-for-partial-rotary", ValueError, "mrope_section",
     dict(mrope_section=[4, 6, 6], rotary_dim=16, positions=_ids(3, 2, 3))),
    ("interleaved-alone", ValueError, "mrope_interleaved", dict(mrope_interleaved=True, positions=_ids(3, 2, 3))),
    ("interleaved-not-bool", TypeError, "mrope_interleaved",
     dict(mrope_section=[4, 6, 6], mrope_interleaved=1, positions=_ids(3, 2, 3))),
    ("positions-two-axes", ValueError, "positions", dict(mrope_section=[4, 6, 6], positions=_ids(2, 2, 3))),
    ("positions-wrong-tokens", ValueError, "positions", dict(mrope_section=[4, 6, 6], positions=_ids(3, 2, 4))),
    ("positions-float", TypeError, "positions",
     dict(mrope_section=[4, 6, 6], positions=_ids(3, 2, 3).float())),
    ("positions-other-device", ValueError, "positions",
     dict(mrope_section=[4, 6, 6], positions=torch.zeros(3, 2, 3, dtype=torch.int64, device="meta"))),
    ("cuda-backend", ValueError, "mrope_section", dict(mrope_section=[4, 6, 6], positions=_ids(3, 2, 3),
                                                       backend="cuda")),
    ("per-token", ValueError, "mrope_section", dict(mrope_section=[4, 6, 6], per_token=True)),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name, error, argument, kwargs", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_errors_name_the_argument_before_any_write(backend, name, error, argument, kwargs, inplace):
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    before_q, before_k = q.clone(), k.clone()
    cos, sin = table(16, 32)
    if kwargs.get("per_token"):
        cos, sin = torch.ones(2, 3, 32, device=DEVICE), torch.zeros(2, 3, 32, device=DEVICE)
    with pytest.raises(error, match=argument):
        ropekit.apply_rope(q, k, cos, sin, inplace=inplace, **kwargs)
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


def test_varlen_positions_of_another_token_count_are_refused(backend):
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    q = torch.randn(5, 2, 32, device=DEVICE)
    cos, sin = table(16, 32)
    with pytest.raises(ValueError, match="positions"):
        ropekit.apply_rope(q, None, cos, sin, positions=_ids(3, 4), layout="thd", cu_seqlens=cu, max_seqlen=3,
                           mrope_section=[4, 6, 6])


def test_in_place_refuses_positions_inside_q(backend):
    q = make("bshd", 1, 2, 4, 32, torch.float32)
    ids = q.view(torch.int32).view(-1)[:6].view(3, 1, 2)
    cos, sin = table(16, 32)
    with pytest.raises(ValueError, match="positions"):
        ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=[4, 6, 6], inplace=True)


# --- the plan cache and the launch ----------------------------------------------------------------------------------

@triton_backend
def test_a_repeated_call_hits_its_plan_and_another_section_makes_another(monkeypatch):
    """The sections and the layout are part of a plan's key: the same shapes with other sections are not served
    by the first call's plan."""
    cos, sin = table(64, 32)
    q = make("bshd", 2, 3, 4, 32, torch.float32)
    ids = mrope_ids(2, 3).to(DEVICE)
    ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=[4, 6, 6])
    real_put = plans.put
    monkeypatch.setattr(plans, "put", lambda key, plan: pytest.fail("the call should have used its plan"))
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=(4, 6, 6))  # a tuple: the same key
    assert_close_to_reference(out, ref.mrope(q, ids.cpu(), [4, 6, 6]))
    monkeypatch.setattr(plans, "put", real_put)
    for section, interleaved in (([4, 6, 6], True), ([8, 4, 4], False)):
        n_plans = len(plans)
        out, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=section,
                                    mrope_interleaved=interleaved)
        assert len(plans) == n_plans + 1
        assert_close_to_reference(out, ref.mrope(q, ids.cpu(), section, mrope_interleaved=interleaved))
    with pytest.raises(ValueError, match="mrope_section"):  # a float section is validated, not served a plan
        ropekit.apply_rope(q, None, cos, sin, positions=ids, mrope_section=[4.0, 6, 6])


@triton_backend
def test_one_launch_reads_the_table_and_the_ids_never_per_token_rows():
    """The call is one tile-kernel launch whose angles come from the table the text call reads and whose
    positions are the caller's (3, batch, seq) ids; even where the flat kernel is forced, M-RoPE takes the tile."""
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 3).to(DEVICE)
    with forced_config(FlatConfig(512, 4)), recorded_launches() as records:
        ropekit.apply_rope(q, k, cos, sin, positions=ids, mrope_section=[6, 5, 5], mrope_interleaved=True)
    assert [r.kernel.__name__ for r in records] == ["rope_v4_kernel"]
    arguments = records[0].arguments
    assert arguments["angles"][0] is cos and arguments["angles"][1] is sin
    assert not arguments["POSITION"].COS_PER_TOKEN
    assert arguments["positions"][0].data_ptr() == ids.data_ptr()
    assert arguments["POSITION"].MODE == ropekit.positions.mrope_mode([6, 5, 5], True)
    assert ropekit.positions.mrope_sections(arguments["POSITION"].MODE) == ((6, 5, 5), True)


# --- the measurement command runs its whole path (on a CPU: no clock, nothing measured) -----------------------------

def test_the_mrope_benchmark_runs_dry_and_its_byte_model_adds_up(tmp_path, capsys):
    from ropekit.bench import mrope
    from ropekit.bench.timing import DryRunTimer

    tiny = (dict(mrope.CASES[0], batch=2, heads_q=2, heads_k=1), dict(mrope.CASES[4], seqlen=70, heads_q=2, heads_k=1))
    rows = mrope.speed(DEVICE, DryRunTimer(), tiny)
    assert [r["max_abs_difference"] for r in rows] == [0.0, 0.0]  # the same table values reach the same pairs
    assert {"in-kernel", "rows: rotate", "rows: build + rotate", "text"} <= set(rows[0])
    ids = mrope.vision_ids(1, 70)
    assert ids[:, 0, :64].eq(torch.arange(64)).all() and ids[0, 0, 64:].eq(64).all()  # text, then one image
    model = mrope.byte_model(dict(mrope.CASES[2]))  # qwen2.5vl, 16384 tokens: 128 rotary channels, 4-byte rows
    assert model["rows_memory"] == 16384 * 128 * 2 * 4
    assert model["rows: rotate"] - model["q_and_k"] == 2 * (model["in-kernel"] - model["q_and_k"] - model["ids"])
    ops = mrope.build_operators(DEVICE)
    assert ops["operators"] == len(ops["names"]) > 10 and ops["host_reads"] == 2  # the rows' range check
    assert mrope.main(["--out", str(tmp_path), "--no-speed"]) == 0
    assert (tmp_path / "mrope.json").exists() and "rows memory" in capsys.readouterr().out


# --- the module ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("parameters", [
    {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
    {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5], "mrope_interleaved": True},
], ids=["qwen2.5-vl", "qwen3-vl"])
def test_rotary_embedding_takes_mrope_from_the_config(backend, parameters):
    """``RotaryEmbedding`` built from a Qwen-VL config's rope parameters: (3, batch, seq) ids are M-RoPE's, text
    positions rotate as ever."""
    rope = ropekit.RotaryEmbedding(32, scaling=parameters, max_positions=64, device=DEVICE)
    q, k = make("bshd", 2, 5, 4, 32, torch.float32), make("bshd", 2, 5, 2, 32, torch.float32)
    ids = mrope_ids(2, 5)
    out_q, out_k = rope(q, k, positions=ids.to(DEVICE))
    kw = dict(base=parameters["rope_theta"], mrope_interleaved=parameters.get("mrope_interleaved", False))
    assert_close_to_reference(out_q, ref.mrope(q, ids, parameters["mrope_section"], **kw))
    assert_close_to_reference(out_k, ref.mrope(k, ids, parameters["mrope_section"], **kw))
    text, _ = rope(q, None, positions=3)
    assert_close_to_reference(text, ref.rope(q, ref.token_positions(2, 5, offsets=3), base=parameters["rope_theta"]))


@triton_backend
@pytest.mark.parametrize("variant, section, interleaved", VARIANTS, ids=VARIANT_IDS)
def test_the_fused_kernel_reads_mrope_positions_through_the_same_helper(variant, section, interleaved):
    """The sections travel in the position mode, so the fused pre-processing kernel (which shares the angle lookup)
    takes an M-RoPE position spec with no argument of its own (its front doors: tests/test_fused_angles.py)."""
    from ropekit.positions import resolve_positions
    from ropekit.triton.fused import launch_fused

    q, k = make("bshd", 2, 5, 4, 32, torch.float32), make("bshd", 2, 5, 2, 32, torch.float32)
    cos, sin = table(64, 32)
    ids = mrope_ids(2, 5)
    spec = resolve_positions(batch=2, seqlen=5, positions=ids.to(DEVICE), mrope_section=section,
                             mrope_interleaved=interleaved)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    launch_fused(q, k, cos, sin, positions=spec, rotary_dim=32, out_q=out_q, out_k=out_k)
    assert_close_to_reference(out_q, ref.mrope(q, ids, section, mrope_interleaved=interleaved))
    assert_close_to_reference(out_k, ref.mrope(k, ids, section, mrope_interleaved=interleaved))
