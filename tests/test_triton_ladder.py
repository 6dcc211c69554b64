"""The Triton ladder v1 -> v3 as a specification: each version over its whole feature set against the float64
reference (``ropekit.reference.rope``), small shapes under the interpreter, real sizes on the GPU.

Accuracy bound (``assert_matches_reference``):

* float32 outputs: ``max |out - ref| <= 1e-5 * max |ref|``.
* float16 / bfloat16 outputs: within the rounding of a correctly-rounded fp32 result — every element satisfies
  ``|out - ref| <= ulp_dtype(|ref|) + 1e-6 * max |ref|``: one ulp of the output dtype at the reference value (half an
  ulp for the final rounding, the rest for the fp32 math and the float32 table), plus an fp32-sized slack for
  elements whose pair cancels. That the final rounding is to nearest is tested on its own, bit for bit.

Every output buffer is filled with NaN before the kernel runs, so an element the kernel forgets to write fails.
"""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.triton import v3 as v3_module
from ropekit.triton.v1 import rope_v1
from ropekit.triton.v2 import rope_v2
from ropekit.triton.v3 import V3Config, launch_config, rope_v3
from conftest import DEVICE, ON_GPU, gpu_only

STRIDED = {"v2": rope_v2, "v3": rope_v3}  # the versions that take any strides, head_dim and dtype
LADDER = {"v1": rope_v1, **STRIDED}


# --------------------------------------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------------------------------------

def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` numbers at ``magnitude`` (float64), floored at the spacing of the smallest normal."""
    info = torch.finfo(dtype)
    return torch.exp2(torch.floor(torch.log2(magnitude.clamp_min(info.tiny)))) * info.eps


def assert_matches_reference(out: torch.Tensor, x: torch.Tensor) -> None:
    """``out`` (a (b, s, h, d)-indexed view) is the rotation of ``x`` at positions 0..s-1 within the bound above."""
    batch, seqlen = x.shape[:2]
    want = ref.rope(x, ref.token_positions(batch, seqlen))
    got = out.detach().to(torch.float64).cpu()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} elements left unwritten (NaN poison)"
    error = (got - want).abs()
    scale = float(want.abs().max())
    if out.dtype == torch.float32:
        assert float(error.max()) <= 1e-5 * scale, f"fp32 error {float(error.max()):.3g} > 1e-5 * {scale:.3g}"
    else:
        bound = ulp(want.abs(), out.dtype) + 1e-6 * scale
        excess = error / bound
        worst = tuple(int(i) for i in torch.nonzero(excess == excess.max())[0])
        assert bool((error <= bound).all()), (
            f"{int((error > bound).sum())} elements beyond one {out.dtype} ulp; worst at {worst}: "
            f"out={float(got[worst]):.8g} ref={float(want[worst]):.8g} bound={float(bound[worst]):.3g}")


def test_ulp_helper_is_the_spacing_of_the_dtype():
    values = torch.tensor([1.0, 1.5, 3.0, 1000.0], dtype=torch.float64)
    assert ulp(values, torch.bfloat16).tolist() == [2**-7, 2**-7, 2**-6, 512 * 2**-7]
    assert ulp(values, torch.float16).tolist() == [2**-10, 2**-10, 2**-9, 512 * 2**-10]
    # and the bound rejects an output two ulps off
    x = torch.randn(1, 2, 1, 4)
    want = ref.rope(x, ref.token_positions(1, 2)).to(torch.bfloat16)
    off_by_two_ulps = want.double() + 2 * ulp(want.double().abs(), torch.bfloat16)
    with pytest.raises(AssertionError, match="beyond one"):
        assert_matches_reference(off_by_two_ulps.to(torch.bfloat16), x)


# --------------------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------------------

def tables(seqlen: int, head_dim: int):
    """Half-width float32 tables with a few more rows than the sequence (only rows 0..seq-1 may be read)."""
    return ropekit.cos_sin_table(seqlen + 3, head_dim, device=DEVICE)


def in_layout(layout: str, batch: int, seqlen: int, heads: int, head_dim: int, dtype) -> torch.Tensor:
    """A random tensor stored in ``layout``, returned as the (batch, seq, heads, head_dim)-indexed view."""
    def rand(*shape):
        return torch.randn(*shape, device=DEVICE).to(dtype)

    if layout == "bshd":
        return rand(batch, seqlen, heads, head_dim)
    if layout == "sbhd":  # Megatron / Transformer Engine order
        return rand(seqlen, batch, heads, head_dim).transpose(0, 1)
    if layout == "bhsd":  # transformers' (batch, heads, seq, head_dim)
        return rand(batch, heads, seqlen, head_dim).transpose(1, 2)
    if layout == "d-strided":  # a transposed q: channels are `heads` elements apart (stride_d != 1)
        return rand(batch, seqlen, head_dim, heads).transpose(2, 3)
    if layout == "qkv-slice":  # k sliced out of a fused (batch, seq, 3, heads, head_dim) projection
        return rand(batch, seqlen, 3, heads, head_dim)[:, :, 1]
    if layout == "head-slice":  # the first head_dim channels of wider rows
        return rand(batch, seqlen, heads, head_dim + 6)[..., :head_dim]
    raise ValueError(layout)


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer with x's layout, every element NaN."""
    return torch.full_like(x, float("nan"))


def run_and_check(launcher, x, cos=None, sin=None, **kwargs):
    if cos is None:
        cos, sin = tables(x.shape[1], x.shape[3])
    out = poisoned_like(x)
    returned = launcher(x, cos, sin, out, **kwargs)
    assert returned is out
    assert_matches_reference(out, x)
    return out


# --------------------------------------------------------------------------------------------------------------------
# v1: contiguous fp32, power-of-two head_dim
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 5, 3, 16), (1, 3, 2, 64), (3, 2, 1, 2)],
                         ids=lambda s: "b{}-s{}-h{}-d{}".format(*s))
def test_v1_matches_reference(shape):
    run_and_check(rope_v1, torch.randn(*shape, device=DEVICE))


def test_v1_allocates_out():
    x = torch.randn(2, 3, 2, 8, device=DEVICE)
    cos, sin = tables(3, 8)
    assert_matches_reference(rope_v1(x, cos, sin), x)


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


V1_REJECTS = [
    ("non-contiguous", lambda: (_x(3, 2, 2, 8).transpose(0, 1), *tables(3, 8), None), "x must be contiguous"),
    ("odd-head-dim", lambda: (_x(1, 2, 2, 7), *tables(2, 8), None), "head_dim must be even"),
    ("head-dim-80", lambda: (_x(1, 2, 2, 80), *tables(2, 80), None), "power of two"),
    ("fp16", lambda: (_x(1, 2, 2, 8, dtype=torch.float16), *tables(2, 8), None), "x must be float32"),
    ("3-d", lambda: (_x(2, 2, 8), *tables(2, 8), None), "x must be a 4-D"),
    ("table-too-short", lambda: (_x(1, 4, 2, 8), *[t[:3] for t in tables(4, 8)], None), "cos must have shape"),
    ("table-fp64", lambda: (_x(1, 2, 2, 8), *[t.double() for t in tables(2, 8)], None), "cos must be float32"),
    ("table-strided", lambda: (_x(1, 2, 2, 8), *[t.t().contiguous().t() for t in tables(2, 8)], None),
     "cos must be contiguous"),
    ("out-strided", lambda: (_x(1, 2, 2, 8), *tables(2, 8), _x(1, 2, 8, 2).transpose(2, 3)), "out must be contiguous"),
    ("out-fp16", lambda: (_x(1, 2, 2, 8), *tables(2, 8), _x(1, 2, 2, 8, dtype=torch.float16)), "out must be"),
]


@pytest.mark.parametrize("make_args, match", [c[1:] for c in V1_REJECTS], ids=[c[0] for c in V1_REJECTS])
def test_v1_rejects_what_it_does_not_support(make_args, match):
    with pytest.raises(ValueError, match=match):
        rope_v1(*make_args())


@pytest.mark.parametrize("version", list(LADDER))
def test_out_sharing_memory_with_x_is_refused(version):
    x = _x(1, 2, 2, 8)
    with pytest.raises(ValueError, match="out must not share memory with x"):
        LADDER[version](x, *tables(2, 8), x)


# --------------------------------------------------------------------------------------------------------------------
# v2 and v3: strides, masks, dtypes
# --------------------------------------------------------------------------------------------------------------------

LAYOUTS = ["bshd", "sbhd", "bhsd", "d-strided", "qkv-slice", "head-slice"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("version", list(STRIDED))
def test_any_layout_through_strides(version, layout, dtype):
    # head_dim 20: 10 pairs on 16 lanes, so every layout also runs with a partial mask.
    run_and_check(STRIDED[version], in_layout(layout, 2, 3, 3, 20, dtype))


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("version", list(STRIDED))
def test_head_dims_including_non_powers_of_two(version, head_dim):
    run_and_check(STRIDED[version], in_layout("bshd", 1, 2, 2, head_dim, torch.float16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("version", list(STRIDED))
def test_dtypes_out_in_the_input_dtype(version, dtype):
    out = run_and_check(STRIDED[version], in_layout("sbhd", 2, 3, 2, 12, dtype))
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("version", list(STRIDED))
def test_half_outputs_are_the_fp32_result_rounded_to_nearest(version, dtype):
    # fp32 math, one rounding to nearest even: the half output is bit for bit the kernel's own fp32 result (the same
    # inputs upcast) rounded by torch. On the CPU this holds because ropekit.device makes the interpreter round
    # fp32 -> bf16 casts (it truncates by itself), as the GPU does.
    x = in_layout("bshd", 2, 16, 4, 64, dtype)
    cos, sin = tables(16, 64)
    out = STRIDED[version](x, cos, sin, poisoned_like(x))
    out32 = STRIDED[version](x.float(), cos, sin, poisoned_like(x.float()))
    assert torch.equal(out.view(torch.int16), out32.to(dtype).view(torch.int16))


@pytest.mark.parametrize("version", list(STRIDED))
def test_out_with_its_own_strides_and_strided_tables(version):
    x = in_layout("sbhd", 2, 4, 3, 12, torch.float32)
    out = in_layout("bhsd", 2, 4, 3, 12, torch.float32).fill_(float("nan"))
    cos, sin = (t.t().contiguous().t() for t in tables(4, 12))  # column-major tables: stride (1, rows)
    assert cos.stride()[0] == 1
    STRIDED[version](x, cos, sin, out)
    assert_matches_reference(out, x)


@pytest.mark.parametrize("version", list(STRIDED))
def test_allocated_out_keeps_the_layout_of_x(version):
    x = in_layout("sbhd", 2, 3, 2, 8, torch.float16)
    out = STRIDED[version](x, *tables(3, 8))
    assert out.stride() == x.stride()  # an sbhd input gives an sbhd output
    assert_matches_reference(out, x)


def _rejects(x, cos, sin, out=None):
    return x, cos, sin, out


STRIDED_REJECTS = [
    ("fp64", lambda: _rejects(_x(1, 2, 2, 8, dtype=torch.float64), *tables(2, 8)), "x must be float16, bfloat16"),
    ("odd-head-dim", lambda: _rejects(_x(1, 2, 2, 9), *tables(2, 10)), "head_dim must be even"),
    ("table-fp16", lambda: _rejects(_x(1, 2, 2, 8), *[t.half() for t in tables(2, 8)]), "cos must be float32"),
    ("table-too-short", lambda: _rejects(_x(1, 5, 2, 8), *[t[:4] for t in tables(5, 8)]), "cos must have shape"),
    ("table-wrong-width", lambda: _rejects(_x(1, 2, 2, 8), *tables(2, 12)), "cos must have shape"),
    ("sin-strides-differ", lambda: _rejects(_x(1, 2, 2, 8), tables(2, 8)[0], tables(2, 8)[1].t().contiguous().t()),
     "sin must have the same strides"),
    ("out-dtype", lambda: _rejects(_x(1, 2, 2, 8), *tables(2, 8), _x(1, 2, 2, 8, dtype=torch.bfloat16)),
     "out must be a torch.float32 tensor"),
    ("out-broadcast", lambda: _rejects(_x(1, 2, 2, 8), *tables(2, 8), _x(1, 1, 2, 8).expand(1, 2, 2, 8)),
     "broadcast view"),
]


@pytest.mark.parametrize("make_args, match", [c[1:] for c in STRIDED_REJECTS], ids=[c[0] for c in STRIDED_REJECTS])
@pytest.mark.parametrize("version", list(STRIDED))
def test_strided_versions_reject_what_they_do_not_support(version, make_args, match):
    with pytest.raises(ValueError, match=match):
        STRIDED[version](*make_args())


def test_32_bit_addressing_is_refused_past_2_31_elements():
    # A meta tensor has a shape and strides but no memory: v2 and v3 must refuse it rather than overflow.
    x = torch.empty(2**20, 2**8, 1, 16, device="meta")  # 2**32 elements
    cos, sin = (torch.empty(2**8, 8, device="meta") for _ in range(2))
    for launcher in STRIDED.values():
        with pytest.raises(ValueError, match="32-bit"):
            launcher(x, cos, sin)


# --------------------------------------------------------------------------------------------------------------------
# v3: tiles
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [V3Config(1, 1, 1), V3Config(2, 2, 4), V3Config(4, 8, 2), V3Config(8, 1, 4)],
                         ids=lambda c: f"S{c.block_s}-H{c.block_h}-w{c.num_warps}")
def test_v3_ragged_tiles(config):
    # 5 tokens and 3 heads: no block size divides them, so the last tile of tokens and of heads is partial.
    run_and_check(rope_v3, in_layout("bhsd", 2, 5, 3, 20, torch.float16), config=config)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's config (this run compiles for the GPU)")
def test_v3_interpreter_config_is_fixed_and_large():
    assert launch_config(4, 4096, 32, 128, 2) == V3Config(16, 8, 4)
    assert launch_config(1, 3, 2, 80, 4) == V3Config(4, 2, 4)


def test_v3_gpu_table_shrinks_tiles_to_fill_the_gpu(monkeypatch):
    # The GPU rule, exercised on any machine: pretend to be an H100 (132 SMs) outside the interpreter.
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)
    monkeypatch.setattr(v3_module, "_sm_count", lambda: 132)
    prefill = launch_config(4, 4096, 32, 128, 2)
    assert prefill == v3_module.GPU_TABLE[(64, 2)]  # plenty of tokens: the table's tile
    small = launch_config(1, 512, 32, 128, 2)
    assert small.block_s < prefill.block_s  # 512 tokens: smaller tiles so that >= 4 programs per SM exist
    assert -(-512 // small.block_s) >= 4 * 132 or small.block_s == 1
    fallback = launch_config(8, 2048, 6, 48, 2)  # not in the table: 2048 elements per step over 4 heads
    assert fallback == V3Config(8, 4, 4)


def test_the_ladder_is_importable_from_ropekit():
    for version in ("v1", "v2", "v3"):
        module = getattr(ropekit.triton, version)
        assert callable(getattr(module, f"rope_{version}"))
    assert callable(ropekit.triton.v4.rope_v4_kernel) and callable(ropekit.triton.launch.rope_v4)


# --------------------------------------------------------------------------------------------------------------------
# Real sizes (GPU only)
# --------------------------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("version", list(LADDER))
def test_benchmark_shapes_on_gpu(version):
    # Llama-3-8B's q of one prefill sequence chunk (bf16; v1: fp32) and the MHA fp16 seed shape, cut in batch.
    if version == "v1":
        run_and_check(rope_v1, torch.randn(2, 2048, 32, 64, device="cuda"))
        return
    run_and_check(LADDER[version], in_layout("bshd", 1, 4096, 32, 128, torch.bfloat16))
    run_and_check(LADDER[version], in_layout("sbhd", 2, 2048, 64, 128, torch.float16))


@gpu_only
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("version", list(STRIDED))
def test_layouts_on_gpu(version, layout):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        run_and_check(STRIDED[version], in_layout(layout, 3, 300, 12, 80, dtype))


@gpu_only
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("version", list(STRIDED))
def test_head_dims_on_gpu(version, head_dim):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        run_and_check(STRIDED[version], in_layout("sbhd", 3, 300, 12, head_dim, dtype))


@gpu_only
@pytest.mark.parametrize("config", [V3Config(1, 1, 1), V3Config(2, 4, 4), V3Config(16, 8, 8), V3Config(64, 2, 4)],
                         ids=lambda c: f"S{c.block_s}-H{c.block_h}-w{c.num_warps}")
def test_v3_configs_on_gpu(config):
    run_and_check(rope_v3, in_layout("bshd", 2, 1000, 9, 128, torch.bfloat16), config=config)


def test_time_ladder_tool_runs_with_a_fake_clock(monkeypatch, tmp_path, capsys):
    # tools/time_ladder.py (run on the H100) measures v3's candidates; here its control flow runs on one tiny case
    # (every launch really executed), with the clock replaced by a fixed rule.
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "time_ladder.py"
    spec = importlib.util.spec_from_file_location("time_ladder", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool, "DEVICE", DEVICE)
    monkeypatch.setattr(tool, "CASES", {"tiny": (1, 3, 2, 1, 16, torch.bfloat16)})
    calls = []

    def fake_clock(fn, **_):
        fn()
        calls.append(fn)
        return 10.0 + len(calls) % 7  # deterministic, distinct enough to rank

    monkeypatch.setattr(tool, "graph_median_us", fake_clock)
    out = tmp_path / "ladder.json"
    monkeypatch.setattr("sys.argv", ["time_ladder.py", "--quick", "--out", str(out)])
    tool.main()
    report = json.loads(out.read_text())
    row = report["cases"]["tiny"]
    assert row["v3_candidates"] and all(c["us"] > 0 for c in row["v3_candidates"])
    assert "(8, 2): V3Config(block_s=" in capsys.readouterr().out
