"""Angles without a table and M-RoPE in the fused ops, as a specification: ``rope_and_cache`` and ``qk_norm_rope``
take ``apply_rope``'s ``inv_freq``/``scale`` (cos and sin of ``position * inv_freq`` computed in the kernel, no table)
and ``mrope_section``/``mrope_interleaved`` (each rotary pair at its own axis' position, chosen in the kernel from
``(3, ...)`` position ids). The rotated q and k, the cache rows and, through autograd, the gradients of q, k and the
norm's weights are those of the float64 reference, on the Triton kernel and the native backend."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.frequencies import inverse_frequencies
from ropekit.testing import assert_close_to_reference, ulp
from conftest import DEVICE

SECTIONS = [((2, 3, 3), False), ((4, 2, 2), True)]
SECTION_IDS = ["contiguous", "interleaved"]


def _inputs(batch=2, seqlen=5, heads_q=4, heads_k=2, head_dim=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, seqlen, h, head_dim, generator=g, dtype=dtype).to(DEVICE)
               for h in (heads_q, heads_k, heads_k))
    return q, k, v


def _rotated(x, pair_positions, inv_freq, scale=1.0, interleaved=False):
    """x (``(batch, seq, heads, dim)``) turned by ``pair_positions * inv_freq`` (``(batch, seq, dim / 2)``), cos and
    sin times ``scale``, in float64 on the CPU."""
    theta = (pair_positions.to(torch.float64) * inv_freq.to(torch.float64).cpu())[..., None, :]
    return ref.rotate_pairs(x.cpu(), torch.cos(theta) * scale, torch.sin(theta) * scale, interleaved=interleaved)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_rope_and_cache_without_a_table_at_long_positions(backend, interleaved):
    """Per-sequence offsets up to 10^7, a paged cache by slot mapping, GQA, the angles scaled: q, k and the cache
    rows against the float64 angles, and a second (planned) call gives the same bytes."""
    q, k, v = _inputs()
    inv_freq = inverse_frequencies(16, 500000.0).to(DEVICE)
    offsets = torch.tensor([1_000, 9_999_990], device=DEVICE)
    slots = torch.tensor([3, 4, 5, 6, 7, 20, -1, 22, 23, 24], device=DEVICE)
    k_cache, v_cache = (torch.zeros(4, 8, 2, 16, device=DEVICE) for _ in range(2))
    call = dict(k_cache=k_cache, v_cache=v_cache, slot_mapping=slots, positions=offsets, inv_freq=inv_freq,
                scale=0.875, interleaved=interleaved, write_k=True)
    out_q, out_k = ropekit.rope_and_cache(q, k, v, **call)
    pair_positions = ref.token_positions(2, 5, offsets=offsets.cpu())[..., None].expand(2, 5, 8)
    want_q, want_k = (_rotated(x, pair_positions, inv_freq, 0.875, interleaved) for x in (q, k))
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    assert_close_to_reference(k_cache, ref.paged_cache_write(torch.zeros(4, 8, 2, 16), want_k.reshape(10, 2, 16),
                                                             slots))
    assert_close_to_reference(v_cache, ref.paged_cache_write(torch.zeros(4, 8, 2, 16), v.reshape(10, 2, 16), slots))
    again_q, again_k = ropekit.rope_and_cache(q, k, v, **call)
    assert torch.equal(again_q, out_q) and torch.equal(again_k, out_k)


def test_rope_and_cache_without_a_table_quantises_on_write(backend):
    """Table-free angles compose with a quantising store: a float8 cache at a scale per (token, head), read back
    through its scales (the reader's round trip), within half a float8 spacing of the float64 rotation."""
    q, k, v = _inputs(head_dim=32)
    inv_freq = inverse_frequencies(32).to(DEVICE)
    offsets = torch.tensor([7, 123_456], device=DEVICE)
    k_cache, v_cache = (torch.zeros(2, 8, 2, 32, dtype=torch.float8_e4m3fn, device=DEVICE) for _ in range(2))
    k_scales, v_scales = (torch.zeros(2, 8, 2, device=DEVICE) for _ in range(2))
    ropekit.rope_and_cache(q, k, v, k_cache=k_cache, v_cache=v_cache, cache_offsets=torch.tensor([0, 3], device=DEVICE),
                           positions=offsets, inv_freq=inv_freq, kv_cache_dtype="fp8_per_token_head",
                           k_scale_cache=k_scales, v_scale_cache=v_scales)
    pair_positions = ref.token_positions(2, 5, offsets=offsets.cpu())[..., None].expand(2, 5, 16)
    truth = _rotated(k, pair_positions, inv_freq)
    for b, row in ((0, 0), (1, 3)):
        scale = k_scales[b, row:row + 5].cpu()[..., None]
        # the scale: max|x| over the head vector / the format's largest value, in float32
        torch.testing.assert_close(scale.double(), ref.token_head_scale(truth[b], torch.float8_e4m3fn), rtol=1e-6,
                                   atol=0)
        quotient = truth[b] / scale
        error = (ref.dequantise(k_cache[b, row:row + 5], scale) - truth[b]).abs() / scale
        bound = ulp(quotient, torch.float8_e4m3fn) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
        assert bool((error <= bound).all()), float((error / bound).max())


@pytest.mark.parametrize("section, mrope_interleaved", SECTIONS, ids=SECTION_IDS)
@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_rope_and_cache_takes_mrope_positions(backend, section, mrope_interleaved, layout):
    """M-RoPE's ``(3, batch, seq)`` ids (``(3, tokens)`` packed): each pair turns at its axis' position, in the
    outputs and in the cache, the same as ``apply_rope``'s M-RoPE and the float64 reference."""
    q, k, v = _inputs()
    cos, sin = ropekit.cos_sin_table(64, 16, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (3, 2, 5), generator=g)
    k_cache, v_cache = (torch.zeros(2, 8, 2, 16, device=DEVICE) for _ in range(2))
    offsets = torch.tensor([1, 3], device=DEVICE)
    if layout == "thd":
        flat = [x.reshape(10, *x.shape[2:]) for x in (q, k, v)]
        call = dict(layout="thd", cu_seqlens=torch.tensor([0, 5, 10], device=DEVICE), max_seqlen=5,
                    positions=ids.reshape(3, 10).to(DEVICE))
        out_q, out_k = ropekit.rope_and_cache(*flat, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                              cache_offsets=offsets, mrope_section=list(section),
                                              mrope_interleaved=mrope_interleaved, write_k=True, **call)
        out_q, out_k = out_q.reshape(q.shape), out_k.reshape(k.shape)
    else:
        out_q, out_k = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                              cache_offsets=offsets, positions=ids.to(DEVICE),
                                              mrope_section=list(section), mrope_interleaved=mrope_interleaved,
                                              write_k=True)
    want_q, want_k = (ref.mrope(x, ids, section, mrope_interleaved=mrope_interleaved) for x in (q, k))
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    assert_close_to_reference(k_cache, ref.contiguous_cache_write(torch.zeros(2, 8, 2, 16), want_k, [1, 3]))
    assert_close_to_reference(v_cache, ref.contiguous_cache_write(torch.zeros(2, 8, 2, 16), v, [1, 3]))
    if layout == "bshd":
        applied_q, applied_k = ropekit.apply_rope(q, k, cos, sin, positions=ids.to(DEVICE),
                                                  mrope_section=list(section), mrope_interleaved=mrope_interleaved)
        assert torch.equal(applied_q, out_q) and torch.equal(applied_k, out_k)


@pytest.mark.parametrize("norm", ["before", "after"])
def test_qk_norm_rope_without_a_table_and_its_gradients(backend, norm):
    """QK-norm + RoPE with the angles computed in the kernel at positions near 10^6: the forward against the float64
    norm and rotation, and the backward (q, k and both weights) against the reference's autograd."""
    q, k, _ = _inputs(dtype=torch.float64, seed=1)
    w_q, w_k = (torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(s)).to(DEVICE)
                for s in (5, 6))
    inv_freq = inverse_frequencies(16).to(DEVICE)
    offsets = torch.tensor([999_990, 3], device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in (q, k, w_q, w_k)]
    out_q, out_k = ropekit.qk_norm_rope(leaves[0], leaves[1], None, None, leaves[2], leaves[3], positions=offsets,
                                        inv_freq=inv_freq, scale=1.25, norm=norm)
    positions = ref.token_positions(2, 5, offsets=offsets.cpu())
    references = [t.detach().cpu().requires_grad_() for t in (q, k, w_q, w_k)]

    def expected(x, w):
        if norm == "before":
            return ref.rope(ref.rms_norm(x, w, eps=1e-6), positions, inv_freq=inv_freq, attention_scaling=1.25)
        return ref.rms_norm(ref.rope(x, positions, inv_freq=inv_freq, attention_scaling=1.25), w, eps=1e-6)

    want_q, want_k = expected(references[0], references[2]), expected(references[1], references[3])
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    g = torch.Generator().manual_seed(9)
    grads = [torch.randn(t.shape, dtype=torch.float64, generator=g) for t in (out_q, out_k)]
    got = torch.autograd.grad((out_q, out_k), leaves, [t.to(DEVICE) for t in grads])
    want = torch.autograd.grad((want_q, want_k), references, grads)
    for a, b in zip(got, want):
        assert_close_to_reference(a, b)


@pytest.mark.parametrize("section, mrope_interleaved", SECTIONS, ids=SECTION_IDS)
def test_qk_norm_rope_takes_mrope_positions_with_gradients(backend, section, mrope_interleaved):
    q, k, _ = _inputs(dtype=torch.float64, seed=2)
    w_q, w_k = (torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(s)).to(DEVICE)
                for s in (7, 8))
    cos, sin = (t.double() for t in ropekit.cos_sin_table(64, 16, device=DEVICE))
    ids = torch.randint(0, 64, (3, 2, 5), generator=torch.Generator().manual_seed(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, w_q, w_k)]
    out_q, out_k = ropekit.qk_norm_rope(leaves[0], leaves[1], cos, sin, leaves[2], leaves[3], positions=ids.to(DEVICE),
                                        mrope_section=section, mrope_interleaved=mrope_interleaved)
    references = [t.detach().cpu().requires_grad_() for t in (q, k, w_q, w_k)]
    want_q, want_k = (ref.mrope(ref.rms_norm(x, w, eps=1e-6), ids, section, mrope_interleaved=mrope_interleaved)
                      for x, w in ((references[0], references[2]), (references[1], references[3])))
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    grads = [torch.ones_like(t) for t in (want_q, want_k)]
    got = torch.autograd.grad((out_q, out_k), leaves, [t.to(DEVICE) for t in grads])
    want = torch.autograd.grad((want_q, want_k), references, grads)
    for a, b in zip(got, want):
        assert_close_to_reference(a, b)


def test_the_angles_arguments_are_validated_by_name(backend):
    """Every refusal names the caller's argument and comes before any write."""
    q, k, v = _inputs()
    cos, sin = ropekit.cos_sin_table(64, 16, device=DEVICE)
    inv_freq = inverse_frequencies(16).to(DEVICE)
    k_cache = torch.zeros(2, 8, 2, 16, device=DEVICE)
    cache = dict(k_cache=k_cache, cache_offsets=0)
    with pytest.raises(ValueError, match="inv_freq"):
        ropekit.rope_and_cache(q, k, None, cos, sin, inv_freq=inv_freq, **cache)
    with pytest.raises(TypeError, match="inv_freq"):
        ropekit.rope_and_cache(q, k, None, inv_freq=inv_freq.to(torch.float16), **cache)
    with pytest.raises(ValueError, match="inv_freq"):
        ropekit.rope_and_cache(q, k, None, inv_freq=inv_freq[:4], rotary_dim=16, **cache)
    with pytest.raises(ValueError, match="scale"):
        ropekit.rope_and_cache(q, k, None, cos, sin, scale=2.0, **cache)
    with pytest.raises((TypeError, ValueError), match="mrope_section"):
        ropekit.rope_and_cache(q, k, None, cos, sin, positions=torch.zeros(3, 2, 5, dtype=torch.long,
                                                                            device=DEVICE),
                               mrope_section=(2, 3, 4), **cache)
    with pytest.raises((TypeError, ValueError), match="inv_freq"):
        ropekit.qk_norm_rope(q, k, cos, sin, inv_freq=inv_freq)
    assert not k_cache.any()


@pytest.mark.parametrize("op", ["qk_norm_rope", "rope_and_cache"])
@pytest.mark.parametrize("bad,name", [
    (dict(scale=True), "scale"), (dict(scale=torch.tensor(1.0)), "scale"),
    (dict(scale=torch.tensor([1.0, 2.0])), "scale"),
    (dict(mrope_interleaved=0), "mrope_interleaved"), (dict(mrope_interleaved=None), "mrope_interleaved"),
    (dict(mrope_section=[2.0, 3.0, 3.0]), "mrope_section"), (dict(mrope_section=[2, True, 5]), "mrope_section"),
], ids=["scale-bool", "scale-tensor", "scale-two", "interleaved-0", "interleaved-none", "sections-floats",
        "sections-bool"])
def test_an_angle_argument_equal_to_a_planned_calls_is_still_validated(op, bad, name, backend):
    """A plan is found by the call's signature, every host argument with its type: a value equal to a planned call's
    (True == 1.0, 0 == False, (2.0, 3, 3) == (2, 3, 3)) but of a type validation refuses is refused, after that call
    as before it, naming the argument (and a tensor scale never reaches a comparison that would ask its truth)."""
    q, k, _ = _inputs(batch=1, seqlen=2, heads_q=2, heads_k=1, head_dim=16)
    cos, sin = ropekit.cos_sin_table(64, 16, device=DEVICE)
    weight = torch.ones(16, device=DEVICE)
    k_cache = torch.zeros(2, 2, 1, 16, device=DEVICE)
    legal = dict(positions=torch.zeros(3, 1, 2, dtype=torch.long, device=DEVICE), mrope_section=[2, 3, 3]) \
        if "mrope_section" in bad else {}
    positions = dict(positions=legal["positions"]) if legal else {}

    def call(**kwargs):
        if op == "qk_norm_rope":
            return ropekit.qk_norm_rope(q, k, cos, sin, weight, weight, **kwargs)
        return ropekit.rope_and_cache(q, k, k, cos, sin, k_cache=k_cache, v_cache=k_cache.clone(),
                                      slot_mapping=torch.arange(2, device=DEVICE), **kwargs)
    for _ in range(2):  # the first validates and plans, the second takes the plan
        call(**legal)
    before = (q.clone(), k.clone(), k_cache.clone())
    with pytest.raises((TypeError, ValueError), match=name):
        call(**positions, **bad)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, k_cache)))


def test_compiled_rope_and_cache_without_a_table_has_no_graph_break(backend):
    """torch.compile(fullgraph=True) keeps the mutating custom op, the frequencies and the M-RoPE ids in one graph."""
    q, k, v = _inputs()
    inv_freq = inverse_frequencies(16).to(DEVICE)
    ids = torch.randint(0, 4096, (3, 2, 5), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    k_cache, v_cache = (torch.zeros(2, 8, 2, 16, device=DEVICE) for _ in range(2))

    def step(q, k, v):
        return ropekit.rope_and_cache(q, k, v, k_cache=k_cache, v_cache=v_cache, cache_offsets=0, positions=ids,
                                      inv_freq=inv_freq, mrope_section=(2, 3, 3), write_k=True)

    torch._dynamo.reset()
    out_q, out_k = torch.compile(step, fullgraph=True, backend="eager")(q, k, v)
    want_q, want_k = (ref.mrope(x, ids.cpu(), (2, 3, 3), inv_freq=inv_freq) for x in (q, k))
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    assert_close_to_reference(k_cache[:, :5], want_k)
