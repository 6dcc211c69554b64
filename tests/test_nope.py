"""Llama 4's NoPE layers as a specification: ``apply_rope(q, k, positions=..., nope_temperature=(floor_scale,
attn_scale))`` rotates nothing; every channel of q is multiplied by ``log(floor((position + 1) / floor_scale) + 1) *
attn_scale + 1`` at its token's position (transformers' ``attn_temperature_tuning``, vLLM's ``_get_attn_scale``), and
k passes through. Every layout and position form, in place and out of place, autograd (torch.compile, CUDA graphs
and the plan cache: tests/test_api.py), on the Triton kernel and the native backend; validation names the argument
before anything is written."""

import math

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.layouts import TO_BSHD
from ropekit.testing import assert_close_to_reference, ulp
from ropekit.triton.launch import TileConfig, forced_config, recorded_launches
from conftest import DEVICE
from rope_cases import make, positions_for, table

triton_backend = pytest.mark.backend("triton")
LLAMA4 = (8192, 0.1)  # Llama 4's floor_scale and attn_scale


def expected(x, layout, positions, floor_scale, attn_scale):
    order = TO_BSHD[layout]
    return ref.nope_temperature(x.permute(order), positions, floor_scale, attn_scale).permute(order)


# --- the reference: the engines' formulas ---------------------------------------------------------------------------

def test_reference_is_transformers_and_vllms_formula():
    """transformers' ``log1p(floor((positions.float() + 1) / floor_scale)) * attn_scale + 1`` and vLLM's
    ``log(floor((positions + 1) / floor_scale) + 1) * attn_scale + 1``, both in float32, agree with the float64
    reference within float32 rounding, past many multiples of floor_scale."""
    positions = torch.cat((torch.arange(0, 20_000, 7), torch.tensor([8190, 8191, 8192, 1_000_000, 9_999_999])))
    x = torch.ones(len(positions), 1, 1, dtype=torch.float64)
    want = ref.nope_temperature(x, positions, *LLAMA4)[:, 0, 0]
    transformers = torch.log1p(torch.floor((positions.float() + 1.0) / LLAMA4[0])) * LLAMA4[1] + 1.0
    vllm = torch.log(torch.floor((positions.float() + 1.0) / LLAMA4[0]) + 1.0) * LLAMA4[1] + 1.0
    torch.testing.assert_close(transformers.double(), want, rtol=3e-7, atol=0)
    torch.testing.assert_close(vllm.double(), want, rtol=3e-7, atol=0)
    assert want[positions < 8191].eq(1).all() and want[positions == 8191].item() == pytest.approx(1 + 0.1 * math.log(2))


def test_matches_transformers_llama4_in_bf16(backend):
    """q scaled as transformers scales it (float32 math, one rounding to q's dtype) at decode positions past
    several multiples of floor_scale."""
    q = make("bshd", 3, 4, 4, 64, torch.bfloat16)
    offsets = torch.tensor([0, 8190, 123_456])
    positions = ref.token_positions(3, 4, offsets=offsets).to(DEVICE)
    scales = torch.log1p(torch.floor((positions.float() + 1.0) / 8192)) * 0.1 + 1.0
    want = (q * scales[..., None, None]).to(q.dtype)  # transformers' expression
    got, _ = ropekit.apply_rope(q, None, positions=offsets.to(DEVICE), nope_temperature=LLAMA4)
    torch.testing.assert_close(got, want)


# --- every case apply_rope takes ------------------------------------------------------------------------------------

# (id, layout, batch, seq, hq, hk, head_dim, position kind, dtype)
CASES = [
    ("bshd-none-fp32", "bshd", 2, 5, 4, 2, 32, "none", torch.float32),
    ("sbhd-int-bf16", "sbhd", 2, 5, 4, 4, 32, "int", torch.bfloat16),
    ("bhsd-offsets-fp16", "bhsd", 3, 4, 4, 1, 48, "offsets", torch.float16),
    ("bshd-ids-fp64", "bshd", 2, 6, 2, 2, 40, "ids", torch.float64),
    ("bshd-ids1d-fp32", "bshd", 2, 6, 4, 2, 32, "ids1d", torch.float32),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_q_is_scaled_and_k_passes_through(backend, case, inplace):
    """A small floor_scale (4) so that positions of a few tokens reach several temperatures."""
    _, layout, batch, seqlen, hq, hk, head_dim, kind, dtype = case
    q, k = make(layout, batch, seqlen, hq, head_dim, dtype), make(layout, batch, seqlen, hk, head_dim, dtype)
    q_before, k_before = q.clone(), k.clone()
    arg, pos = positions_for(kind, batch, seqlen)
    out_q, out_k = ropekit.apply_rope(q, k, positions=arg, layout=layout, inplace=inplace, nope_temperature=(4, 0.5))
    assert (out_q is q) == inplace and (out_k is k) == inplace
    assert_close_to_reference(out_q, expected(q_before, layout, pos, 4, 0.5))
    assert torch.equal(out_k, k_before)
    if not inplace:
        assert out_k.is_contiguous() and out_k.data_ptr() != k.data_ptr()


@pytest.mark.parametrize("config", [TileConfig(2, 1, 4, fused_qk=True), TileConfig(1, 2, 4)], ids=["fused-qk", "tile"])
@triton_backend
def test_both_tile_forms_scale_q_and_copy_k(config):
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    offsets = torch.tensor([5, 40], device=DEVICE)
    with forced_config(config):
        out_q, out_k = ropekit.apply_rope(q, k, positions=offsets, nope_temperature=(8, 0.25))
    assert_close_to_reference(out_q, ref.nope_temperature(q, ref.token_positions(2, 3, offsets=offsets), 8, 0.25))
    assert torch.equal(out_k, k)


def test_varlen_thd(backend):
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    q, k = torch.randn(9, 4, 32, device=DEVICE), torch.randn(9, 2, 32, device=DEVICE)
    offsets = torch.tensor([2, 8189, 70_000])
    out_q, out_k = ropekit.apply_rope(q, k, positions=offsets.to(DEVICE), layout="thd", cu_seqlens=cu, max_seqlen=5,
                                      nope_temperature=LLAMA4)
    assert_close_to_reference(out_q, ref.nope_temperature(q, ref.varlen_positions(cu, offsets=offsets), *LLAMA4))
    assert torch.equal(out_k, k)


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_q_with_no_heads_still_copies_k_out_of_place_and_leaves_it_in_place(backend, layout):
    """An empty q decides nothing about in place: its data pointer may read 0, as an empty output's does (the
    fuzzer's finding: k's output was left unwritten when q had no heads)."""
    k = torch.randn(3, 3, 3, 16, device=DEVICE, dtype=torch.bfloat16)
    q = torch.empty(3, 3, 0, 16, device=DEVICE, dtype=torch.bfloat16)  # its output has its strides and pointer
    before = k.clone()
    positions = torch.tensor([[8, 8, 8], [3, 3, 3], [7, 7, 7]], device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, k, positions=positions, layout=layout, nope_temperature=(4, 0.5))
    assert out_q.shape == q.shape and torch.equal(out_k, before)
    out_q, out_k = ropekit.apply_rope(q, k, positions=positions, layout=layout, nope_temperature=(4, 0.5),
                                      inplace=True)
    assert out_k is k and torch.equal(k, before)


def test_an_infinite_channel_stays_in_its_channel(backend):
    """A scale, not a rotation: an Inf or NaN in q reaches only its own channel."""
    q = torch.randn(1, 2, 1, 8, device=DEVICE)
    q[0, 0, 0, 1], q[0, 1, 0, 6] = float("inf"), float("nan")
    out, _ = ropekit.apply_rope(q, None, positions=10, nope_temperature=(4, 0.5))
    bad = ~torch.isfinite(out)
    assert bad.sum() == 2 and bad[0, 0, 0, 1] and bad[0, 1, 0, 6]


@triton_backend
def test_the_kernel_and_the_native_backend_agree_bit_for_bit():
    q = make("bshd", 2, 6, 4, 32, torch.bfloat16)
    offsets = torch.tensor([3, 5_000_000], device=DEVICE)
    kw = dict(positions=offsets, nope_temperature=LLAMA4)
    assert torch.equal(ropekit.apply_rope(q, None, backend="triton", **kw)[0],
                       ropekit.apply_rope(q, None, backend="native", **kw)[0])


# --- autograd (torch.compile, CUDA graphs and the plan cache: tests/test_api.py, with the other table-free call) ----

def test_backward_scales_q_and_passes_k(backend):
    q = make("bshd", 2, 4, 4, 32, torch.float32).requires_grad_()
    k = make("bshd", 2, 4, 2, 32, torch.float32).requires_grad_()
    offsets = torch.tensor([1, 20], device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, k, positions=offsets, nope_temperature=(4, 0.5))
    grad_q, grad_k = torch.randn_like(out_q), torch.randn_like(out_k)
    torch.autograd.backward((out_q, out_k), (grad_q, grad_k))
    assert_close_to_reference(q.grad, ref.nope_temperature(grad_q, ref.token_positions(2, 4, offsets=offsets.cpu()),
                                                           4, 0.5))
    assert torch.equal(k.grad, grad_k)


def test_gradcheck_in_float64(backend):
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)

    def f(q, k):
        return ropekit.apply_rope(q, k, positions=6, nope_temperature=(2, 0.3))

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-6)


# --- validation: every error names the argument, before anything is written -----------------------------------------

BAD_CALLS = [
    ("with-cos-sin", ValueError, "nope_temperature", lambda: dict(cos=table()[0], sin=table()[1])),
    ("with-table", ValueError, "nope_temperature", lambda: dict(table=ropekit.RopeTable(32, 64, device=DEVICE))),
    ("with-inv-freq", ValueError, "nope_temperature",
     lambda: dict(inv_freq=ropekit.inverse_frequencies(32).to(DEVICE))),
    ("not-a-pair", TypeError, "nope_temperature", lambda: dict(nope_temperature=8192)),
    ("three-values", TypeError, "nope_temperature", lambda: dict(nope_temperature=(8192, 0.1, 1.0))),
    ("floor-scale-zero", ValueError, "floor_scale", lambda: dict(nope_temperature=(0, 0.1))),
    ("floor-scale-fraction", ValueError, "floor_scale", lambda: dict(nope_temperature=(2.5, 0.1))),
    ("floor-scale-bool", ValueError, "floor_scale", lambda: dict(nope_temperature=(True, 0.1))),
    ("attn-scale-nan", ValueError, "attn_scale", lambda: dict(nope_temperature=(8192, float("nan")))),
    ("attn-scale-string", ValueError, "attn_scale", lambda: dict(nope_temperature=(8192, "0.1"))),
    ("partial-rotary", ValueError, "nope_temperature", lambda: dict(rotary_dim=16)),
    ("per-token", ValueError, "nope_temperature", lambda: dict(per_token=True)),
    ("mrope", ValueError, "nope_temperature", lambda: dict(mrope_section=[4, 6, 6])),
    ("cuda-backend", ValueError, "nope_temperature", lambda: dict(backend="cuda")),
    ("negative-offset", ValueError, "positions", lambda: dict(positions=-1)),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name, error, argument, spoil", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_errors_name_the_argument_before_any_write(backend, name, error, argument, spoil, inplace):
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    before_q, before_k = q.clone(), k.clone()
    kwargs = dict(nope_temperature=LLAMA4)
    kwargs.update(spoil())
    cos, sin = kwargs.pop("cos", None), kwargs.pop("sin", None)
    with pytest.raises(error, match=argument):
        ropekit.apply_rope(q, k, cos, sin, inplace=inplace, **kwargs)
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


def test_an_integer_valued_float_floor_scale_is_vllms_config(backend):
    q = make("bshd", 1, 3, 2, 32, torch.float32)
    assert torch.equal(ropekit.apply_rope(q, None, positions=9000, nope_temperature=(8192.0, 0.1))[0],
                       ropekit.apply_rope(q, None, positions=9000, nope_temperature=(8192, 0.1))[0])


# --- the launch -----------------------------------------------------------------------------------------------------

@triton_backend
def test_one_launch_that_reads_no_table_and_in_place_never_touches_k():
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    with recorded_launches() as records:
        ropekit.apply_rope(q, k, positions=3, nope_temperature=LLAMA4)
        ropekit.apply_rope(q, k, positions=3, nope_temperature=LLAMA4, inplace=True)
    assert [r.kernel.__name__ for r in records] == ["rope_v4_kernel"] * 2
    out_of_place, in_place = (r.arguments for r in records)
    assert out_of_place["angles"][0] is None and out_of_place["ROTATION"].NOPE_FLOOR_SCALE == 8192
    assert out_of_place["HAS_K"]
    assert not in_place["HAS_K"]


# --- the fused cache write: rope_and_cache(..., nope_temperature=...) -----------------------------------------------

FUSED_CASES = [  # (id, layout, position kind, cache dtype, q's output dtype)
    ("bshd-none-bf16", "bshd", "none", torch.bfloat16, None),
    ("sbhd-int-bf16", "sbhd", "int", torch.bfloat16, None),
    ("bhsd-offsets-e4m3", "bhsd", "offsets", torch.float8_e4m3fn, None),
    ("bshd-ids-e4m3-float8-q", "bshd", "ids", torch.float8_e4m3fn, torch.float8_e4m3fn),
    ("bshd-ids1d-int8", "bshd", "ids1d", torch.int8, None),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_rope_and_cache_of_a_nope_layer_scales_q_and_caches_k_and_v_as_they_are(backend, case, inplace):
    """Llama 4's NoPE layer in one launch: q times its token's temperature (a small floor_scale, 4, so that a few
    tokens reach several temperatures), k and v into the cache unrotated (a quantised cache: their quotients by its
    scale, rounded; a float8 q: q's scaled values over q_scale), k's output (``write_k``) its own values."""
    if inplace and case[4] is not None:
        pytest.skip("a float8 q is written out of place")
    _, layout, kind, cache_dtype, q_dtype = case
    batch, seqlen, hq, hk, head_dim = 2, 5, 4, 2, 32
    q, k, v = (make(layout, batch, seqlen, h, head_dim, torch.bfloat16) for h in (hq, hk, hk))
    q_before, k_before = q.clone(), k.clone()
    arg, pos = positions_for(kind, batch, seqlen)
    caches = [torch.zeros(3, 4, hk, head_dim, device=DEVICE).to(cache_dtype) for _ in range(2)]
    slots = torch.randperm(12, device=DEVICE)[:batch * seqlen]
    slots[3] = -1
    scale = torch.tensor([0.05], device=DEVICE)
    quantised = dict(k_scale=scale, v_scale=scale) if cache_dtype != torch.bfloat16 else {}
    write_k = cache_dtype == torch.bfloat16  # (without k's output a quantised k's store is its only one)
    float8_q = dict(q_dtype=q_dtype, q_scale=torch.tensor([0.25], device=DEVICE)) if q_dtype is not None else {}
    for _ in range(2):  # the second call takes the plan the first made
        q = q_before.clone()  # (in place, each call scales its own copy)
        out_q, out_k = ropekit.rope_and_cache(q, k, v, k_cache=caches[0],
                                              v_cache=caches[1], slot_mapping=slots, positions=arg, layout=layout,
                                              inplace=inplace, write_k=write_k, nope_temperature=(4, 0.5),
                                              **quantised, **float8_q)
    want_q = expected(q_before, layout, pos, 4, 0.5)
    if q_dtype is not None:
        quotient = want_q / 0.25
        error = (out_q.double().cpu() - quotient).abs()
        assert bool((error <= ulp(quotient, q_dtype) / 2 + 1e-5 * quotient.abs()).all())
    else:
        assert_close_to_reference(out_q, want_q)
    assert torch.equal(out_k, k_before) if write_k else out_k is None
    order = TO_BSHD[layout]
    written = slots >= 0
    for cache, x in zip(caches, (k_before, v)):
        rows = x.permute(order).reshape(-1, hk, head_dim)[written.cpu()].double().cpu()
        got = cache.view(-1, hk, head_dim)[slots[written]].double().cpu()
        want = rows if cache_dtype == torch.bfloat16 else ref.quantise(rows, 0.05, cache_dtype)
        assert torch.equal(got, want)


@triton_backend
def test_rope_and_cache_of_a_nope_layer_is_one_launch_that_reads_no_table():
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    cache = torch.zeros(2, 4, 2, 32, device=DEVICE)
    with recorded_launches() as records:
        ropekit.rope_and_cache(q, k, k, k_cache=cache, v_cache=cache.clone(), cache_offsets=0, positions=3,
                               nope_temperature=LLAMA4)
    assert [r.kernel.__name__ for r in records] == ["fused_forward_kernel"]
    arguments = records[0].arguments
    assert arguments["angles"][0] is None and arguments["angles"][1] is None
    assert (arguments["POSITION"].NOPE_FLOOR_SCALE, arguments["POSITION"].NOPE_ATTN_SCALE) == LLAMA4


FUSED_BAD_CALLS = [
    ("with-cos-sin", ValueError, "nope_temperature", lambda: dict(cos=table()[0], sin=table()[1])),
    ("with-inv-freq", ValueError, "nope_temperature",
     lambda: dict(inv_freq=ropekit.inverse_frequencies(32).to(DEVICE))),
    ("with-a-norm", ValueError, "nope_temperature", lambda: dict(norm="after")),
    ("with-weights", ValueError, "nope_temperature",
     lambda: dict(q_weight=torch.ones(32, device=DEVICE), k_weight=torch.ones(32, device=DEVICE))),
    ("not-a-pair", TypeError, "nope_temperature", lambda: dict(nope_temperature=8192)),
    ("attn-scale-bool", ValueError, "attn_scale", lambda: dict(nope_temperature=(8192, True))),
    ("floor-scale-fraction", ValueError, "floor_scale", lambda: dict(nope_temperature=(2.5, 0.1))),
    ("partial-rotary", ValueError, "nope_temperature", lambda: dict(rotary_dim=16)),
    ("mrope", ValueError, "nope_temperature", lambda: dict(mrope_section=[4, 6, 6])),
]


@pytest.mark.parametrize("name, error, argument, spoil", FUSED_BAD_CALLS, ids=[c[0] for c in FUSED_BAD_CALLS])
def test_rope_and_cache_nope_errors_name_the_argument_before_any_write(backend, name, error, argument, spoil):
    """Each refused call comes after a legal NoPE call of the same tensors was planned (a value equal to the
    planned one's, (8192, True) == (8192, 1), is still validated), and writes nothing."""
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    cache = torch.zeros(2, 4, 2, 32, device=DEVICE)
    call = dict(k_cache=cache, v_cache=cache.clone(), cache_offsets=torch.zeros(2, dtype=torch.long, device=DEVICE))
    for _ in range(2):
        ropekit.rope_and_cache(q, k, k, **call, nope_temperature=(8192, 1))
    before = q.clone(), k.clone(), cache.clone()
    kwargs = dict(nope_temperature=LLAMA4)
    kwargs.update(spoil())
    cos, sin = kwargs.pop("cos", None), kwargs.pop("sin", None)
    with pytest.raises(error, match=argument):
        ropekit.rope_and_cache(q, k, k, cos, sin, **call, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, cache)))
