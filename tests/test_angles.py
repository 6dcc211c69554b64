"""Angles without a table, as a specification: ``apply_rope(q, k, inv_freq=..., scale=...)`` computes cos and sin of
``position * inv_freq`` (float64) at every token, as accurate as the float64-angle table at positions up to 1e7, for
every position form, layout and pairing, out of place, in place, through autograd (torch.compile, CUDA graphs, the
plan cache: tests/test_api.py), on the Triton kernel and the native backend; the CUDA backend refuses it by name."""

import math

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.frequencies import cos_sin_at, inverse_frequencies, rope_init
from ropekit.testing import assert_close_to_reference
from ropekit.triton.launch import FlatConfig, forced_config, recorded_launches
from conftest import DEVICE
from rope_cases import CASES, expected, make, positions_for, table

triton_backend = pytest.mark.backend("triton")


def freqs(rotary_dim, base=10000.0, dtype=torch.float64):
    return inverse_frequencies(rotary_dim, base).to(device=DEVICE, dtype=dtype)


# --- accuracy: no worse than the float64-angle table ----------------------------------------------------------------

def _cos_sin_probe(window, rotary_dim):
    """A float32 q whose rotation returns the cos (first half) and sin (second half) the kernel rotated by."""
    q = torch.zeros(1, window, 1, rotary_dim, device=DEVICE)
    q[..., :rotary_dim // 2] = 1.0
    return q


@pytest.mark.parametrize("base", [10000.0, 500000.0], ids=["base1e4", "base5e5"])
@pytest.mark.parametrize("start", [1_000, 1_000_000, 10_000_000], ids=["pos1e3", "pos1e6", "pos1e7"])
def test_accuracy_at_long_positions_is_the_float64_angle_tables(backend, start, base):
    """Against cos/sin of the float64 angle (reduced mod 2π and evaluated in float64 by torch), table-free errs no
    more than the table's rows at the same positions, i.e. at most half a float32 ulp of the value."""
    window, rotary_dim = 32, 64
    inv_freq = inverse_frequencies(rotary_dim, base)
    positions = torch.arange(start, start + window)
    theta = ref.angles(positions, inv_freq)
    truth = torch.cat((torch.cos(theta), torch.sin(theta)), -1)
    probe = _cos_sin_probe(window, rotary_dim)
    cos, sin = cos_sin_at(positions, inv_freq, device=DEVICE)  # the float64-angle table's rows
    from_table, _ = ropekit.apply_rope(probe, None, cos, sin, positions=torch.arange(window, device=DEVICE)[None])
    table_free, _ = ropekit.apply_rope(probe, None, inv_freq=inv_freq.to(DEVICE), positions=start)
    table_error = (from_table[0, :, 0].double().cpu() - truth).abs()
    free_error = (table_free[0, :, 0].double().cpu() - truth).abs()
    half_ulp = (torch.nextafter(truth.float(), torch.tensor(math.inf)).double() - truth.float().double()).abs() / 2
    assert free_error.max() <= table_error.max()
    assert bool((free_error <= half_ulp * (1 + 1e-6)).all())


def test_the_sine_and_cosine_are_float64_accurate_over_every_quadrant(backend):
    """float64 inputs keep the kernel's float64 cos and sin unrounded: at position 1 with the angles themselves as the
    "frequencies", a probe's rotation returns cos and sin of each angle, within 2 float64 ulps of 1 of torch's, on a
    dense grid of [-π, π], at every quadrant's edges and their neighbours, ±0 and the tiniest angles."""
    edges = torch.tensor([k * math.pi / 4 for k in range(-4, 5)], dtype=torch.float64)
    near = torch.cat([torch.nextafter(edges, edges + s) for s in (-1.0, 1.0)] + [edges])
    grid = torch.linspace(-math.pi, math.pi, 1024 - near.numel() - 4, dtype=torch.float64)
    angles = torch.cat((grid, near, torch.tensor([0.0, -0.0, 1e-300, -5e-324], dtype=torch.float64)))
    angles = angles.clamp(-math.pi, math.pi)
    n = angles.numel()
    probe = torch.zeros(1, 1, 1, 2 * n, dtype=torch.float64, device=DEVICE)
    probe[..., :n] = 1.0
    out, _ = ropekit.apply_rope(probe, None, inv_freq=angles.to(DEVICE), positions=1)
    cos, sin = out[0, 0, 0, :n].cpu(), out[0, 0, 0, n:].cpu()
    assert float((cos - torch.cos(angles)).abs().max()) <= 2 * 2.0**-52
    assert float((sin - torch.sin(angles)).abs().max()) <= 2 * 2.0**-52


def test_float32_frequencies_are_read_as_given(backend):
    inv_freq = freqs(32, dtype=torch.float32)
    q = make("bshd", 1, 3, 2, 32, torch.float32)
    out, _ = ropekit.apply_rope(q, None, inv_freq=inv_freq, positions=12345)
    # the angles of the float32 frequencies, in float64
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(1, 3, offsets=12345), inv_freq=inv_freq.cpu()))


# --- every case apply_rope takes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference_for_every_layout_position_form_and_pairing(backend, case, inplace):
    """GQA, partial rotary, GPT-J, fp16/bf16/fp32/fp64, positions None / int / per-sequence offsets / ids."""
    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, kind, dtype = case
    q, k = make(layout, batch, seqlen, hq, head_dim, dtype), make(layout, batch, seqlen, hk, head_dim, dtype)
    arg, pos = positions_for(kind, batch, seqlen)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    want_q, want_k = expected(q, layout, pos, **kw), expected(k, layout, pos, **kw)
    out_q, out_k = ropekit.apply_rope(q, k, inv_freq=freqs(rotary_dim), positions=arg, layout=layout,
                                      inplace=inplace, **kw)
    assert (out_q is q) == inplace and (out_k is k) == inplace
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)


@pytest.mark.parametrize("kind", ["none", "offsets", "ids"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_varlen_thd(backend, kind, interleaved):
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    q, k = torch.randn(9, 4, 32, device=DEVICE), torch.randn(9, 2, 32, device=DEVICE)
    if kind == "none":
        arg, pos = None, ref.varlen_positions(cu)
    elif kind == "offsets":
        offsets = torch.tensor([2, 1_000_000, 0])
        arg, pos = offsets.to(DEVICE), ref.varlen_positions(cu, offsets=offsets)
    else:
        ids = torch.randint(0, 10_000_000, (9,))
        arg, pos = ids.to(DEVICE), ids
    out_q, out_k = ropekit.apply_rope(q, k, inv_freq=freqs(32), positions=arg, layout="thd", cu_seqlens=cu,
                                      max_seqlen=5, interleaved=interleaved)
    assert_close_to_reference(out_q, ref.rope(q, pos, interleaved=interleaved))
    assert_close_to_reference(out_k, ref.rope(k, pos, interleaved=interleaved))


def test_a_strided_frequency_vector(backend):
    q = make("bshd", 2, 3, 4, 32, torch.float32, noncontiguous=True)
    inv_freq = torch.stack((freqs(32), torch.zeros(16, dtype=torch.float64, device=DEVICE)), -1)[:, 0]
    assert inv_freq.stride() == (2,)
    out, _ = ropekit.apply_rope(q, None, inv_freq=inv_freq, positions=40)
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(2, 3, offsets=40)))


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
     "original_max_position_embeddings": 2048},
], ids=["yarn", "longrope"])
def test_scale_is_the_attention_scaling_of_the_table(backend, rope_parameters):
    """``scale`` multiplies cos and sin as a table built with ``attention_scaling`` does (YaRN's, LongRoPE's)."""
    inv_freq, attention_scaling = rope_init(rope_parameters, 32, max_position_embeddings=8192, seq_len=8192)
    assert attention_scaling != 1.0
    q = make("bshd", 2, 4, 4, 32, torch.float32)
    cos, sin = ropekit.cos_sin_table(64, inv_freq=inv_freq, attention_scaling=attention_scaling, device=DEVICE)
    from_table, _ = ropekit.apply_rope(q, None, cos, sin, positions=9)
    table_free, _ = ropekit.apply_rope(q, None, inv_freq=inv_freq.to(DEVICE), scale=attention_scaling, positions=9)
    torch.testing.assert_close(table_free, from_table, rtol=0, atol=1e-6)
    assert_close_to_reference(table_free, ref.rope(q, ref.token_positions(2, 4, offsets=9), inv_freq=inv_freq,
                                                   attention_scaling=attention_scaling))


def test_scale_multiplies_in_float64(backend):
    """A scale that float32 cannot hold gives the table's values (built with that scale in float64), not those of
    the scale rounded to float32 (which would move about one value in six by an ulp)."""
    scale = 1 + 2**-26 + 2**-28
    inv_freq = inverse_frequencies(64)
    probe = _cos_sin_probe(256, 64)
    cos, sin = ropekit.cos_sin_table(256, inv_freq=inv_freq, attention_scaling=scale, device=DEVICE)
    from_table, _ = ropekit.apply_rope(probe, None, cos, sin)
    table_free, _ = ropekit.apply_rope(probe, None, inv_freq=inv_freq.to(DEVICE), scale=scale)
    assert (table_free != from_table).sum() <= from_table.numel() // 1000


@triton_backend
def test_the_kernel_and_the_native_backend_agree():
    q = make("bshd", 2, 6, 4, 64, torch.float32)
    offsets = torch.tensor([3, 9_999_990], device=DEVICE)
    kernel, _ = ropekit.apply_rope(q, None, inv_freq=freqs(64), positions=offsets, backend="triton")
    native, _ = ropekit.apply_rope(q, None, inv_freq=freqs(64), positions=offsets, backend="native")
    torch.testing.assert_close(kernel, native, rtol=0, atol=4e-7)


# --- autograd (torch.compile, CUDA graphs and the plan cache: tests/test_api.py, with the other table-free call) ----

def test_gradcheck_in_float64(backend):
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    inv_freq = freqs(6)

    def f(q, k):
        return ropekit.apply_rope(q, k, inv_freq=inv_freq, scale=0.8, positions=1_000_000, interleaved=True)

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-6)


def test_backward_is_the_conjugate_rotation(backend):
    q = make("bshd", 2, 4, 4, 32, torch.float32).requires_grad_()
    offsets = torch.tensor([1, 5_000_000], device=DEVICE)
    out, _ = ropekit.apply_rope(q, None, inv_freq=freqs(32), positions=offsets)
    grad = torch.randn_like(out)
    out.backward(grad)
    pos = ref.token_positions(2, 4, offsets=offsets.cpu())
    assert_close_to_reference(q.grad, ref.rope_backward(grad, pos))


# --- validation: every error names the argument, before anything is written -----------------------------------------

def _q_k():
    return make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)


BAD_CALLS = [
    ("float16", TypeError, "inv_freq", lambda: dict(inv_freq=freqs(32).half())),
    ("integer", TypeError, "inv_freq", lambda: dict(inv_freq=torch.arange(16, device=DEVICE))),
    ("not-a-tensor", TypeError, "inv_freq", lambda: dict(inv_freq=[1.0] * 16)),
    ("2-d", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32)[None])),
    ("empty", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32)[:0])),
    ("other-device", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32).to("meta"))),
    ("too-short-for-rotary-dim", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(16), rotary_dim=32)),
    ("with-cos-sin", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32), cos=table()[0], sin=table()[1])),
    ("with-table", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32), table=ropekit.RopeTable(32, 64, device=DEVICE))),
    ("with-per-token", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32), per_token=True)),
    ("cuda-backend", ValueError, "inv_freq", lambda: dict(inv_freq=freqs(32), backend="cuda")),
    ("scale-bool", TypeError, "scale", lambda: dict(inv_freq=freqs(32), scale=True)),
    ("scale-string", TypeError, "scale", lambda: dict(inv_freq=freqs(32), scale="2")),
    ("scale-nan", ValueError, "scale", lambda: dict(inv_freq=freqs(32), scale=float("nan"))),
    ("scale-with-a-table", ValueError, "scale", lambda: dict(cos=table()[0], sin=table()[1], scale=2.0)),
    ("negative-offset", ValueError, "positions", lambda: dict(inv_freq=freqs(32), positions=-1)),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name, error, argument, spoil", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_errors_name_the_argument_before_any_write(backend, name, error, argument, spoil, inplace):
    q, k = _q_k()
    before_q, before_k = q.clone(), k.clone()
    kwargs = spoil()
    cos, sin = kwargs.pop("cos", None), kwargs.pop("sin", None)
    with pytest.raises(error, match=argument):
        ropekit.apply_rope(q, k, cos, sin, inplace=inplace, **kwargs)
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


def test_in_place_refuses_frequencies_inside_q(backend):
    q = make("bshd", 2, 3, 4, 32, torch.float32)
    with pytest.raises(ValueError, match="inv_freq"):
        ropekit.apply_rope(q, None, inv_freq=q.view(-1)[:16], inplace=True)


# --- the launch choice ----------------------------------------------------------------------------------------------

@triton_backend
def test_a_table_free_call_never_takes_the_flat_kernel():
    """The flat kernel reads tables: even where a table call of the same shape takes it (forced here), a table-free
    call is planned on the tile kernel."""
    q, k = _q_k()
    cos, sin = table(64, 32)
    with forced_config(FlatConfig(512, 4)), recorded_launches() as records:
        ropekit.apply_rope(q, k, cos, sin)
        ropekit.apply_rope(q, k, inv_freq=freqs(32))
    kernels = [record.kernel.__name__ for record in records]
    assert kernels == ["rope_flat_kernel", "rope_v4_kernel"]
    assert records[1].arguments["POSITION"].ANGLES


# --- the measurement command runs its whole path (on a CPU: no clock, nothing measured) -----------------------------

def test_the_angles_benchmark_runs_dry(tmp_path, capsys):
    from ropekit.bench import angles
    from ropekit.bench.timing import DryRunTimer

    rows = angles.accuracy(DEVICE, "native", rotary_dim=16, window=8)
    assert {r["path"] for r in rows} == {"table", "table-free", "fp32-reduced-angle"}
    assert all(r["values_unlike_the_table"] == 0 for r in rows if r["path"] == "table-free")
    cache_case = next(c for c in angles.CASES if c["op"] == "rope_and_cache")
    tiny = (dict(angles.CASES[0], batch=2, offsets_below=64), dict(angles.CASES[2], seqlen=4),
            dict(cache_case, batch=3, offsets_below=64, offsets_from=32))
    speed = angles.speed(DEVICE, DryRunTimer(), tiny)
    assert [r["max_abs_difference"] <= 2**-3 for r in speed] == [True] * 3  # bf16 outputs: an ulp at most
    assert angles.main(["--out", str(tmp_path), "--no-speed", "--window", "4"]) == 0
    assert (tmp_path / "angles.json").exists() and "no worse than the table" in capsys.readouterr().out
