"""The public API as a specification: layouts, positions, GQA, pairings, partial rotary, in place, autograd, compile,
errors and logging — every output compared with the float64 reference."""

import logging
import math

import pytest
import torch
import triton.language as tl

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig
from conftest import DEVICE, FULL, gpu_only

TO_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}
FROM_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}  # these permutations are involutions


def make(layout, batch, seqlen, heads, head_dim, dtype, *, noncontiguous=False):
    """A random tensor in ``layout``; optionally a non-contiguous view (a slice of a wider head_dim)."""
    shape_bshd = (batch, seqlen, heads, head_dim + (16 if noncontiguous else 0))
    x = torch.randn(shape_bshd, dtype=torch.float32, device=DEVICE).to(dtype)
    x = x.permute(FROM_BSHD[layout]).contiguous()
    return x[..., :head_dim] if noncontiguous else x


def expected(x, layout, positions_bs, **kwargs):
    """Reference output in x's layout, from a (batch, seq) position tensor."""
    x_bshd = x.permute(TO_BSHD[layout])
    return ref.rope(x_bshd, positions_bs, **kwargs).permute(FROM_BSHD[layout])


def table(rows=64, rotary_dim=32, base=10000.0):
    return ropekit.cos_sin_table(rows, rotary_dim, base=base, device=DEVICE)


# Readable cases: (id, layout, batch, seq, hq, hk, head_dim, rotary_dim, interleaved, positions-kind, dtype)
CASES = [
    ("bshd-neox-none-fp32", "bshd", 2, 5, 4, 2, 32, 32, False, "none", torch.float32),
    ("sbhd-gptj-offset-fp32", "sbhd", 2, 5, 4, 4, 32, 32, True, "int", torch.float32),
    ("bhsd-neox-seqoffsets-bf16", "bhsd", 3, 4, 4, 1, 32, 32, False, "offsets", torch.bfloat16),
    ("bshd-gptj-ids-fp16", "bshd", 2, 6, 2, 2, 48, 48, True, "ids", torch.float16),
    ("bshd-neox-partial-ids1d-fp32", "bshd", 2, 6, 4, 2, 64, 32, False, "ids1d", torch.float32),
    ("sbhd-gptj-partial-offsets-bf16", "sbhd", 2, 3, 2, 1, 40, 24, True, "offsets", torch.bfloat16),
    ("bshd-neox-hd80-none-fp64", "bshd", 1, 3, 2, 2, 80, 80, False, "none", torch.float64),
    ("bshd-neox-decode-offsets-fp16", "bshd", 4, 1, 4, 2, 32, 32, False, "offsets", torch.float16),
]


def positions_for(kind, batch, seqlen):
    """(argument passed to apply_rope, (batch, seq) positions for the reference)."""
    if kind == "none":
        return None, ref.token_positions(batch, seqlen)
    if kind == "int":
        return 7, ref.token_positions(batch, seqlen, offsets=7)
    if kind == "offsets":
        offsets = torch.randint(0, 40, (batch,))
        return offsets.to(DEVICE), ref.token_positions(batch, seqlen, offsets=offsets)
    if kind == "ids":
        ids = torch.randint(0, 60, (batch, seqlen))
        return ids.to(DEVICE), ids
    if kind == "ids1d":
        ids = torch.randperm(60)[:seqlen]
        return ids.to(DEVICE), ids.expand(batch, seqlen)
    raise AssertionError(kind)


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_apply_rope_matches_reference(case, inplace):
    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, kind, dtype = case
    q = make(layout, batch, seqlen, hq, head_dim, dtype)
    k = make(layout, batch, seqlen, hk, head_dim, dtype)
    cos, sin = table(64, rotary_dim)
    arg, pos = positions_for(kind, batch, seqlen)
    q_in, k_in = q.clone(), k.clone()
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout=layout, interleaved=interleaved,
                                      rotary_dim=rotary_dim, inplace=inplace)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out_q, expected(q_in, layout, pos, **kw))
    assert_close_to_reference(out_k, expected(k_in, layout, pos, **kw))
    if inplace:
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
        # the tail of a partial rotary is untouched, bit for bit
        assert torch.equal(q[..., rotary_dim:], q_in[..., rotary_dim:])
    else:
        assert torch.equal(q, q_in) and torch.equal(k, k_in), "out-of-place call modified its inputs"
        assert out_q.is_contiguous() and out_q.shape == q.shape


# Every v4 tile shape must give the same answer: the layouts the H100 launch table picks (including one program per
# token block holding all q and k heads) are forced here onto every case, so the interpreter checks them on CPU.
V4_CONFIGS = [
    LaunchConfig(1, 4, 4, fused_qk=True),
    LaunchConfig(2, 1, 2, fused_qk=True, evict_first=True),
    LaunchConfig(4, 2, 4),
    LaunchConfig(1, 1, 1, evict_first=True),
    LaunchConfig(2, 1, 32, fused_qk=True, evict_first=True),
    LaunchConfig(1, 1, 4, flat=64, flat_warps=4),  # the flat path where the tensors allow it, else this tile
    LaunchConfig(1, 1, 4, flat=32, flat_warps=1, flat_paired=True),  # q and k in one program where shapes match
]


@pytest.mark.parametrize("config", V4_CONFIGS, ids=lambda c: f"s{c.block_s}h{c.block_h}w{c.num_warps}"
                         + ("-fused" if c.fused_qk else "") + ("-evict" if c.evict_first else "")
                         + (f"-flat{c.flat}" if c.flat else "") + ("-paired" if c.flat_paired else ""))
@pytest.mark.parametrize("case", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_every_v4_tile_shape_matches_reference(case, config, monkeypatch):
    monkeypatch.setattr(v4, "launch_config", lambda *args: config)
    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, kind, dtype = case
    q = make(layout, batch, seqlen, hq, head_dim, dtype)
    k = make(layout, batch, seqlen, hk, head_dim, dtype)
    cos, sin = table(64, rotary_dim)
    arg, pos = positions_for(kind, batch, seqlen)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout=layout, interleaved=interleaved,
                                      rotary_dim=rotary_dim)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out_q, expected(q, layout, pos, **kw))
    assert_close_to_reference(out_k, expected(k, layout, pos, **kw))
    # q alone, and varlen, through the same tile shape
    out_q, _ = ropekit.apply_rope(q, None, cos, sin, positions=arg, layout=layout, interleaved=interleaved,
                                  rotary_dim=rotary_dim)
    assert_close_to_reference(out_q, expected(q, layout, pos, **kw))
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    q_thd = torch.randn(9, hq, head_dim, device=DEVICE).to(dtype)
    k_thd = torch.randn(9, hk, head_dim, device=DEVICE).to(dtype)
    out_q, out_k = ropekit.apply_rope(q_thd, k_thd, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=5,
                                      interleaved=interleaved, rotary_dim=rotary_dim)
    assert_close_to_reference(out_q, ref.rope(q_thd, ref.varlen_positions(cu), **kw))
    assert_close_to_reference(out_k, ref.rope(k_thd, ref.varlen_positions(cu), **kw))


FLAT = LaunchConfig(1, 1, 4, flat=64, flat_warps=4)
FLAT_PAIRED = FLAT._replace(flat_paired=True)


@pytest.mark.parametrize("paired", [False, True], ids=["q-then-k", "paired"])
@pytest.mark.parametrize("kind", ["none", "int", "offsets", "ids", "ids1d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_v4_flat_path_matches_reference(kind, dtype, paired):
    # The flat path (blocks of elements over contiguous q then k, or of both at once, partner element loaded
    # separately): every position form, the conjugate, k absent / MQA / MHA, and element counts that do not fill
    # the last block (2 x 5 tokens x 3 heads x 16 = 480 elements in blocks of 64). Paired blocks need k of q's
    # shape; MQA then takes blocks of q, then of k.
    interleaved = False
    from ropekit.positions import resolve_positions

    batch, seqlen, heads, head_dim = 2, 5, 3, 16
    cos, sin = table(64, head_dim)
    arg, pos = positions_for(kind, batch, seqlen)
    spec = resolve_positions(batch=batch, seqlen=seqlen, positions=arg)
    for heads_k, conjugate in ((0, False), (1, True), (3, False)):
        q = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE).to(dtype)
        k = torch.randn(batch, seqlen, heads_k, head_dim, device=DEVICE).to(dtype) if heads_k else None
        out_q = torch.full_like(q, float("nan"))
        out_k = torch.full_like(k, float("nan")) if k is not None else None
        kw = dict(out_q=out_q, out_k=out_k, positions=spec, rotary_dim=head_dim, interleaved=interleaved,
                  conjugate=conjugate, config=FLAT_PAIRED if paired else FLAT)
        plan = v4.plan_v4(q, k, cos, sin, **kw)
        assert plan.constexprs["FLAT"] == 64 and plan.grid[1:] == (1, 1)
        pairs = paired and heads_k != 1
        assert plan.constexprs["FLAT_PAIRED"] == pairs
        q_blocks = -(-q.numel() // 64)
        assert plan.grid[0] == q_blocks + (0 if pairs or k is None else -(-k.numel() // 64))
        v4.rope_v4(q, k, cos, sin, **kw)
        for x, out in ((q, out_q), (k, out_k)):
            if x is not None:
                assert_close_to_reference(out, ref.rope(x, pos.to(x.device), interleaved=interleaved,
                                                        conjugate=conjugate))


def test_v4_flat_path_only_where_it_applies():
    # in place (a partner may be overwritten before it is read), partial rotary, varlen, per-token rows and
    # non-contiguous tensors take the tile path; positions outside the table still give NaN on the flat path
    from ropekit.positions import resolve_positions

    q = torch.randn(2, 4, 2, 16, device=DEVICE)
    cos, sin = table(8, 16)
    spec = resolve_positions(batch=2, seqlen=4, positions=None)

    def flat_of(x, out, **kw):
        kw = {"positions": spec, "rotary_dim": 16, "config": FLAT, **kw}
        return v4.plan_v4(x, None, cos, sin, out_q=out, out_k=None, **kw).constexprs["FLAT"]
    assert flat_of(q, torch.empty_like(q)) == 64
    assert flat_of(q, q) == 0  # in place
    assert flat_of(q, torch.empty_like(q), interleaved=True) == 0  # GPT-J pairs keep the tile
    assert flat_of(q, torch.empty_like(q), rotary_dim=8) == 0  # partial rotary
    assert flat_of(q, torch.empty_like(q), eager_rounding=True) == 0
    assert flat_of(q.double(), torch.empty_like(q.double())) == 0  # fp64 math stays on the tiles
    wide = torch.randn(2, 4, 3, 16, device=DEVICE)[:, :, :2]
    assert flat_of(wide, torch.empty_like(q)) == 0  # not contiguous
    far = resolve_positions(batch=2, seqlen=4, positions=6)  # tokens at positions 6..9 of an 8-row table
    out = torch.empty_like(q)
    v4.rope_v4(q, None, cos, sin, out_q=out, out_k=None, positions=far, rotary_dim=16, config=FLAT)
    assert torch.isfinite(out[:, :2]).all() and torch.isnan(out[:, 2:]).all()


def test_v4_passes_no_argument_it_does_not_read():
    # Graph replay pays for every byte of kernel arguments (run45): contiguous q/k/outputs and table pass their
    # strides as 1 (Triton makes 1 a constant: not passed) and the kernel derives them (DENSE); so do unused
    # position strides and, on the tiles, where k's head blocks begin; the offset 0 passes as 1; absent position
    # tensors are None. A strided view still passes its real strides.
    from ropekit.positions import resolve_positions

    cos, sin = table(64, 16)
    offsets = torch.tensor([3, 9], device=DEVICE)
    q = torch.randn(2, 5, 4, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)

    def plan_of(x, kx, positions, **kw):
        spec = resolve_positions(batch=2, seqlen=5, positions=positions)
        return v4.plan_v4(x, kx, cos, sin, out_q=torch.empty_like(x), out_k=torch.empty_like(kx), positions=spec,
                          rotary_dim=16, **kw)

    def ints_of(plan):
        return (*plan.ints_head, None, *plan.ints_tail)  # None: the position offset
    for positions in (None, offsets):
        plan = plan_of(q, k, positions)
        ints = ints_of(plan)
        assert plan.constexprs["DENSE"]
        assert ints[3] == 1 and ints[6:22] == (1,) * 16  # k's first head block; q, k, out_q, out_k strides
        assert ints[22:25] == (1, 1, 1) and ints[-3:] == (1, 1, 1)  # table strides, position strides, n_tokens
        assert not plan.constexprs["IN_PLACE"]
        pointers = v4.V4Launch.pointers(q, k, q, k, cos, sin, None if positions is None else offsets, None)
        assert pointers[-1] is None and (pointers[-2] is None) == (positions is None)
    strided = torch.randn(2, 5, 6, 16, device=DEVICE)[:, :, :4]
    plan = plan_of(strided, k, None)
    assert not plan.constexprs["DENSE"] and ints_of(plan)[6:10] == strided.stride()
    assert ints_of(plan)[23] == cos.stride(0)  # the table's row stride is passed when not DENSE
    out = torch.empty_like(strided)
    spec = resolve_positions(batch=2, seqlen=5, positions=offsets)
    v4.rope_v4(strided, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=16)
    assert_close_to_reference(out, ref.rope(strided, (offsets[:, None] + torch.arange(5, device=DEVICE))))


@pytest.mark.parametrize("dense", [True, False], ids=["contiguous", "strided"])
def test_v4_in_place_passes_no_output(dense):
    # In place the outputs are q and k: their pointers pass as None and their strides as 1 (IN_PLACE), the kernel
    # writes through q and k with q's and k's strides, and a partial rotary leaves the tail as it is (no copy).
    from ropekit.positions import resolve_positions

    cos, sin = table(64, 8)
    offsets = torch.tensor([3, 9], device=DEVICE)
    spec = resolve_positions(batch=2, seqlen=5, positions=offsets)
    q = torch.randn(2, 5, 6 if dense else 7, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)
    if not dense:
        q = q[:, :, 1:]  # a strided view: its strides are passed, the outputs' are not
    expected_q = ref.rope(q, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    expected_k = ref.rope(k, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    plan = v4.plan_v4(q, k, cos, sin, out_q=q, out_k=k, positions=spec, rotary_dim=8)
    assert plan.constexprs["IN_PLACE"] and not plan.constexprs["COPY_TAIL"]
    assert plan.constexprs["DENSE"] == dense
    ints = (*plan.ints_head, None, *plan.ints_tail)
    assert ints[14:22] == (1,) * 8  # out_q's and out_k's strides
    if not dense:
        assert ints[6:10] == q.stride()
    pointers = v4.V4Launch.pointers(q, k, q, k, cos, sin, offsets, None, plan.in_place)
    assert pointers[2] is None and pointers[3] is None
    plan(q, k, q, k, cos, sin, offsets, None, 0)
    assert_close_to_reference(q, expected_q)
    assert_close_to_reference(k, expected_k)
    # another call's outputs that are not its inputs get a plan of their own
    out = torch.empty_like(k)
    assert not v4.plan_v4(k, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=8).in_place


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_half_outputs_are_the_fp32_result_rounded_to_nearest(dtype, interleaved):
    # One rounding to nearest even of the fp32 math, on the GPU and under the interpreter alike (ropekit.device makes
    # the interpreter round fp32 -> bf16 casts as the GPU does): bit for bit the fp32 call's result rounded by torch.
    cos, sin = table(64, 24)
    q = torch.randn(2, 9, 4, 32, device=DEVICE).to(dtype)
    k = torch.randn(2, 9, 2, 32, device=DEVICE).to(dtype)
    offsets = torch.tensor([3, 17], device=DEVICE)
    kwargs = dict(positions=offsets, rotary_dim=24, interleaved=interleaved)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, **kwargs)
    out_q32, out_k32 = ropekit.apply_rope(q.float(), k.float(), cos, sin, **kwargs)
    assert torch.equal(out_q.view(torch.int16), out_q32.to(dtype).view(torch.int16))
    assert torch.equal(out_k.view(torch.int16), out_k32.to(dtype).view(torch.int16))


def test_int64_addressing_covers_per_token_rows_and_position_ids():
    # The kernel indexes per-token cos/sin rows and position ids with the same integer type as q and k: a small q
    # with such a tensor spanning 2**31 elements needs int64 too (meta tensors: planned, never launched)
    from ropekit.positions import resolve_positions

    q, k = torch.empty(1, 4, 2, 16, device="meta"), torch.empty(1, 4, 1, 16, device="meta")
    outs = dict(out_q=torch.empty_like(q), out_k=torch.empty_like(k))
    table = torch.empty(64, 8, device="meta")
    huge_rows = torch.empty_strided((1, 4, 16), (2**30, 2**30, 1), device="meta")
    huge_ids = torch.empty_strided((1, 4), (2**30, 2**30), dtype=torch.int64, device="meta")
    plain = resolve_positions(batch=1, seqlen=4, positions=None)
    assert v4.plan_v4(q, k, table, table, positions=plain, rotary_dim=16, **outs).constexprs["INDEX_DTYPE"] == tl.int32
    per_token = v4.plan_v4(q, k, huge_rows, huge_rows, positions=plain, rotary_dim=16, cos_per_token=True, **outs)
    assert per_token.constexprs["INDEX_DTYPE"] == tl.int64
    ids = resolve_positions(batch=1, seqlen=4, positions=huge_ids)
    assert v4.plan_v4(q, k, table, table, positions=ids, rotary_dim=16, **outs).constexprs["INDEX_DTYPE"] == tl.int64


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's question")
def test_kernels_run_when_triton_was_imported_before_ropekit():
    # A user (or transformers, or torch._dynamo) may import triton first: the interpreter is then switched on after
    # Triton's own jitted library functions were decorated, and a kernel that calls one of them cannot run.
    import os
    import subprocess
    import sys

    code = """
import triton
import torch
import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from ropekit.triton.v1 import rope_v1
from ropekit.triton.v2 import rope_v2
from ropekit.triton.v3 import rope_v3
q, k = torch.randn(2, 5, 4, 32), torch.randn(2, 5, 2, 32)
cos, sin = ropekit.cos_sin_table(16, 32)
want = ref.rope(q, ref.token_positions(2, 5))
for launcher in (rope_v1, rope_v2, rope_v3):
    assert_close_to_reference(launcher(q, cos, sin, torch.empty_like(q)), want)
for kwargs in ({}, {"positions": torch.tensor([0, 0])}, {"interleaved": False, "inplace": True}):
    assert_close_to_reference(ropekit.apply_rope(q.clone(), k, cos, sin, **kwargs)[0], want)
print("ok")
"""
    # a fresh process as a user starts one: TRITON_INTERPRET not set yet (this one's ropekit.device set it)
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_noncontiguous_views_and_k_none():
    q = make("bshd", 2, 4, 3, 32, torch.float32, noncontiguous=True)
    assert not q.is_contiguous()
    cos, sin = table()
    out_q, out_k = ropekit.apply_rope(q, None, cos, sin, positions=3)
    assert out_k is None
    assert_close_to_reference(out_q, expected(q, "bshd", ref.token_positions(2, 4, offsets=3)))
    # a transposed view: bhsd storage seen as bshd
    qt = make("bhsd", 2, 4, 3, 32, torch.float32).transpose(1, 2)
    out_q, _ = ropekit.apply_rope(qt, None, cos, sin)
    assert_close_to_reference(out_q, expected(qt, "bshd", ref.token_positions(2, 4)))


@pytest.mark.parametrize("kind", ["none", "offsets", "ids"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_varlen_thd(kind, interleaved):
    lengths = [3, 1, 5]
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    total = sum(lengths)
    q = torch.randn(total, 4, 32, device=DEVICE)
    k = torch.randn(total, 2, 32, device=DEVICE)
    cos, sin = table()
    if kind == "none":
        arg, pos = None, ref.varlen_positions(cu)
    elif kind == "offsets":
        offsets = torch.tensor([2, 10, 0])
        arg, pos = offsets.to(DEVICE), ref.varlen_positions(cu, offsets=offsets)
    else:
        ids = torch.randint(0, 60, (total,))
        arg, pos = ids.to(DEVICE), ids
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout="thd", cu_seqlens=cu, max_seqlen=5,
                                      interleaved=interleaved)
    assert_close_to_reference(out_q, ref.rope(q, pos, interleaved=interleaved))
    assert_close_to_reference(out_k, ref.rope(k, pos, interleaved=interleaved))


# --- autograd -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss_shape", ["broadcast-scalar", "full"])
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_gradients_match_reference(loss_shape, layout):
    q = make(layout, 2, 4, 4, 32, torch.float32, noncontiguous=True).requires_grad_()
    k = make(layout, 2, 4, 2, 32, torch.float32).requires_grad_()
    cos, sin = table(64, 24)
    offsets = torch.tensor([1, 9], device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=offsets, layout=layout, rotary_dim=24)
    if loss_shape == "broadcast-scalar":
        # Transformer Engine's first loss: a sum, whose gradient reaches the op as an expanded (stride-0) tensor.
        (out_q.sum() + out_k.sum()).backward()
        grad_q, grad_k = torch.ones_like(q), torch.ones_like(k)
    else:
        grad_q, grad_k = torch.randn_like(out_q), torch.randn_like(out_k)
        torch.autograd.backward((out_q, out_k), (grad_q, grad_k))
    pos = ref.token_positions(2, 4, offsets=offsets.cpu())
    pos_bs = pos
    want_q = ref.rope_backward(grad_q.permute(TO_BSHD[layout]), pos_bs, rotary_dim=24).permute(FROM_BSHD[layout])
    want_k = ref.rope_backward(grad_k.permute(TO_BSHD[layout]), pos_bs, rotary_dim=24).permute(FROM_BSHD[layout])
    assert_close_to_reference(q.grad, want_q)
    assert_close_to_reference(k.grad, want_k)


def test_gradcheck_through_the_kernel_in_float64():
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = table(16, 8)

    def f(q, k):
        return ropekit.apply_rope(q, k, cos, sin, positions=2, interleaved=True)

    assert torch.autograd.gradcheck(f, (q, k), eps=1e-6, atol=1e-6)


def test_gradcheck_on_the_reference_path():
    x = torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    pos = ref.token_positions(1, 3, offsets=5)
    assert torch.autograd.gradcheck(lambda x: ref.rope(x, pos, rotary_dim=6), (x,))


# --- torch.compile --------------------------------------------------------------------------------------------------

def test_torch_compile_fullgraph_no_graph_break():
    cos, sin = table()

    def step(q, k, offsets):
        q2, k2 = ropekit.apply_rope(q, k, cos, sin, positions=offsets)
        return (q2 * 2).sum(-1), k2

    # aot_eager on the CPU keeps the test fast; the GPU run uses inductor (test_cuda_graph_and_inductor).
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    offsets = torch.tensor([4, 0], device=DEVICE)
    got_q, got_k = compiled(q, k, offsets)
    want_q, want_k = step(q, k, offsets)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)


def test_torch_compile_training_step():
    cos, sin = table()
    q = make("bshd", 2, 3, 4, 32, torch.float32).requires_grad_()

    def loss(q):
        return ropekit.apply_rope(q, None, cos, sin, positions=1)[0].square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    compiled(q).backward()
    grad = q.grad.clone()
    q.grad = None
    loss(q).backward()
    torch.testing.assert_close(grad, q.grad)


@gpu_only
def test_cuda_graph_replays_with_new_positions():
    cos, sin = table(8192, 128)
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    offsets = torch.randint(0, 8000, (64,), device="cuda")
    out = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up (compile) outside the capture
            ropekit.apply_rope(q, k, cos, sin, positions=offsets)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["q"], out["k"] = ropekit.apply_rope(q, k, cos, sin, positions=offsets)
    for _ in range(3):
        offsets.copy_(torch.randint(0, 8000, (64,), device="cuda"))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        pos = ref.token_positions(64, 1, offsets=offsets.cpu())
        assert_close_to_reference(out["q"], ref.rope(q, pos))
        assert_close_to_reference(out["k"], ref.rope(k, pos))


# --- the module and its table --------------------------------------------------------------------------------------

def test_rotary_embedding_module_grows_its_table():
    rope = ropekit.RotaryEmbedding(32, base=500000.0, max_positions=8, device=DEVICE)
    q, k = make("bshd", 1, 6, 2, 32, torch.float32), make("bshd", 1, 6, 1, 32, torch.float32)
    out_q, out_k = rope(q, k, positions=20)  # needs rows up to 25: the table grows (host-known)
    assert len(rope.table) >= 26
    pos = ref.token_positions(1, 6, offsets=20)
    assert_close_to_reference(out_q, ref.rope(q, pos, base=500000.0))
    assert_close_to_reference(out_k, ref.rope(k, pos, base=500000.0))


def test_rotary_embedding_grows_for_a_long_sequence_given_position_ids():
    # Position ids live on the device and are never read by the host, but the sequence length is host-known: a
    # prefill of n tokens with ids 0..n-1 (transformers' call) reaches row n - 1, so the table grows to n rows first
    rope = ropekit.RotaryEmbedding(32, base=1e6, max_positions=8, device=DEVICE)
    q = make("bshd", 1, 40, 2, 32, torch.float32)
    ids = torch.arange(40, device=DEVICE)[None]
    out_q, _ = rope(q, positions=ids)
    assert len(rope.table) >= 40
    assert_close_to_reference(out_q, ref.rope(q, ids.cpu(), base=1e6))
    packed = torch.randn(12, 2, 32, device=DEVICE)  # varlen: the longest sequence counts
    cu = torch.tensor([0, 3, 12], device=DEVICE)
    out, _ = ropekit.RotaryEmbedding(32, max_positions=4, device=DEVICE)(
        packed, positions=torch.tensor([0, 0], device=DEVICE), layout="thd", cu_seqlens=cu, max_seqlen=9)
    assert_close_to_reference(out, ref.rope(packed, ref.varlen_positions(cu.cpu())))


def test_rotary_embedding_with_llama3_scaling_matches_reference():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    rope = ropekit.RotaryEmbedding(32, base=500000.0, scaling=scaling, max_positions=128, device=DEVICE)
    inv_freq, attention = ropekit.rope_init(dict(scaling, rope_theta=500000.0), 32)
    q = make("bshd", 1, 5, 2, 32, torch.float32)
    out_q, _ = rope(q, positions=100)
    pos = ref.token_positions(1, 5, offsets=100)
    assert_close_to_reference(out_q, ref.rope(q, pos, inv_freq=inv_freq, attention_scaling=attention))


def test_rotary_embedding_takes_rotary_dim_and_pairing_from_the_config_dict():
    params = ropekit.rope_parameters_from_config({"model_type": "glm", "head_dim": 32, "partial_rotary_factor": 0.5,
                                                  "rope_theta": 500000.0})
    rope = ropekit.RotaryEmbedding(params["head_dim"], scaling=params, max_positions=16, device=DEVICE)
    assert rope.rotary_dim == 16 and rope.interleaved
    q = make("bshd", 1, 5, 2, 32, torch.float32)
    out_q, _ = rope(q, positions=3)
    want = ref.rope(q, ref.token_positions(1, 5, offsets=3), base=500000.0, rotary_dim=16, interleaved=True)
    assert_close_to_reference(out_q, want)
    # explicit arguments still win over the dict
    assert not ropekit.RotaryEmbedding(32, scaling=params, interleaved=False, rotary_dim=32).interleaved


def test_rotary_embedding_context_length_comes_from_the_config_not_the_table():
    # Phi-3 style longrope without a factor: the attention factor follows max_position_embeddings / original
    half = 8
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * half, "long_factor": [4.0] * half,
               "original_max_position_embeddings": 64, "max_position_embeddings": 1024}
    rope = ropekit.RotaryEmbedding(16, scaling=scaling, max_positions=32, device=DEVICE)
    _, attention = ropekit.rope_init(scaling, 16)
    assert rope.table.attention_scaling == pytest.approx(attention) and attention == pytest.approx(
        math.sqrt(1 + math.log(1024 / 64) / math.log(64)))


@pytest.mark.parametrize("how", ["host-offset", "tensor-offsets", "seq_len-hint"])
def test_rotary_embedding_dynamic_and_longrope_follow_the_sequence_length(how):
    # transformers recomputes these frequencies from max(position_ids) + 1 every forward; so does the module
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
                "original_max_position_embeddings": 16, "max_position_embeddings": 64}
    for scaling in (dynamic, longrope):
        rope = ropekit.RotaryEmbedding(16, scaling=scaling, max_positions=8, device=DEVICE)
        q = make("bshd", 2, 1, 2, 16, torch.float32)
        # within, past, and back within the trained length: original, stretched (for 41 positions), original
        for last, stretched_for in ((5, None), (40, 41), (9, None)):
            if how == "host-offset":
                out_q, _ = rope(q, positions=last)
            elif how == "tensor-offsets":
                out_q, _ = rope(q, positions=torch.tensor([last - 3, last], device=DEVICE))
            else:
                out_q, _ = rope(q, positions=torch.tensor([last - 3, last], device=DEVICE), seq_len=last + 1)
            inv_freq, attention = ropekit.rope_init(scaling, 16, seq_len=stretched_for)
            offsets = last if how == "host-offset" else torch.tensor([last - 3, last])
            want = ref.rope(q, ref.token_positions(2, 1, offsets=offsets), inv_freq=inv_freq,
                            attention_scaling=attention)
            assert_close_to_reference(out_q, want)
            assert len(rope.table) > last  # grown from the length it read (or was told)


# --- context parallel ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_ranks_match_full_sequence(cp_size):
    seqlen = 16
    cos, sin = table()
    q = make("bshd", 2, seqlen, 2, 32, torch.float32)
    full, _ = ropekit.apply_rope(q, None, cos, sin)
    for rank in range(cp_size):
        shard = ropekit.context_parallel_shard(q, cp_size, rank, seq_dim=1)
        positions = ropekit.context_parallel_positions(seqlen, cp_size, rank, device=DEVICE)
        got, _ = ropekit.apply_rope(shard, None, cos, sin, positions=positions)
        torch.testing.assert_close(got, ropekit.context_parallel_shard(full, cp_size, rank, seq_dim=1),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("cp_size", [1, 2])
def test_context_parallel_packed_batch_matches_the_full_sequences(cp_size):
    # Transformer Engine's thd split: every sequence of the packed batch cut into 2 * cp_size chunks, rank r keeping
    # chunks r and 2 cp_size - 1 - r of each; cu_seqlens // cp_size are the rank's own sequence boundaries
    lengths = [8, 4, 12]
    cu = torch.tensor([0, 8, 12, 24], device=DEVICE)
    cos, sin = table()
    q = torch.randn(24, 2, 32, device=DEVICE)
    k = torch.randn(24, 1, 32, device=DEVICE)
    full_q, full_k = ropekit.apply_rope(q, k, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=12)
    for rank in range(cp_size):
        positions = ropekit.context_parallel_varlen_positions(cu, cp_size, rank)
        local_cu = cu // cp_size

        def shard(x):
            return torch.cat([ropekit.context_parallel_shard(x[int(a):int(b)], cp_size, rank, seq_dim=0)
                              for a, b in zip(cu[:-1], cu[1:])])
        got_q, got_k = ropekit.apply_rope(shard(q), shard(k), cos, sin, layout="thd", cu_seqlens=local_cu,
                                          max_seqlen=max(lengths) // cp_size, positions=positions)
        torch.testing.assert_close(got_q, shard(full_q), rtol=0, atol=0)
        torch.testing.assert_close(got_k, shard(full_k), rtol=0, atol=0)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_transformer_engine_freqs_become_tables(layout, interleaved):
    # TE's RotaryPositionEmbedding: float32 angles (positions, 1, 1, rotary_dim), rotary_percent 0.5 of head 32,
    # each pair's angle as the two halves or side by side; start positions per sequence; the tail is copied
    rotary_dim, seqlen = 16, 6
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    angles = torch.outer(torch.arange(32, dtype=torch.float32), inv_freq)
    pairs_twice = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)
    freqs = pairs_twice[:, None, None, :]
    cos, sin = ropekit.cos_sin_from_freqs(freqs, interleaved=interleaved)
    assert cos.shape == (32, rotary_dim // 2) and cos.dtype == torch.float32
    start = torch.tensor([3, 11], device=DEVICE)
    q = make(layout, 2, seqlen, 2, 32, torch.float32)
    out, _ = ropekit.apply_rope(q, None, cos.to(DEVICE), sin.to(DEVICE), positions=start, layout=layout,
                                interleaved=interleaved, rotary_dim=rotary_dim)
    want = expected(q, layout, ref.token_positions(2, seqlen, offsets=start.cpu()), inv_freq=inv_freq.double(),
                    rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out, want)
    with pytest.raises(ValueError, match="even"):
        ropekit.cos_sin_from_freqs(torch.zeros(4, 1, 1, 5))


# --- errors, before any write ----------------------------------------------------------------------------------------

def _valid():
    q = make("bshd", 2, 3, 4, 32, torch.float32)
    k = make("bshd", 2, 3, 2, 32, torch.float32)
    cos, sin = table(16, 32)
    return q, k, cos, sin


ERRORS = [
    ("odd-rotary-dim", lambda q, k, c, s: dict(rotary_dim=7), ValueError, "rotary_dim"),
    ("rotary-dim-too-large", lambda q, k, c, s: dict(rotary_dim=64), ValueError, "rotary_dim"),
    ("head-dim-mismatch", lambda q, k, c, s: dict(k=k[..., :16]), ValueError, "head_dim"),
    ("dtype-mismatch", lambda q, k, c, s: dict(k=k.double()), TypeError, "dtype"),
    ("integer-q", lambda q, k, c, s: dict(q=q.to(torch.int32)), TypeError, "q must be"),
    ("complex-q", lambda q, k, c, s: dict(q=torch.complex(q, q)), TypeError, "q must be"),
    ("bad-layout", lambda q, k, c, s: dict(layout="bsd"), ValueError, "layout"),
    ("positions-beyond-table", lambda q, k, c, s: dict(positions=15), ValueError, "table"),
    ("float-positions", lambda q, k, c, s: dict(positions=torch.zeros(2, device=DEVICE)), TypeError, "positions"),
    ("positions-wrong-shape", lambda q, k, c, s: dict(positions=torch.zeros(5, 7, dtype=torch.long, device=DEVICE)),
     ValueError, "positions"),
    ("cos-sin-shape-mismatch", lambda q, k, c, s: dict(sin=s[:, :8]), ValueError, "cos and sin"),
    ("thd-without-cu-seqlens", lambda q, k, c, s: dict(q=q[0], k=k[0], layout="thd"), ValueError, "cu_seqlens"),
    ("bad-backend", lambda q, k, c, s: dict(backend="rocm"), ValueError, "backend"),
    ("batch-mismatch", lambda q, k, c, s: dict(k=k[:1]), ValueError, "k"),
]


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("name,change,error,words", ERRORS, ids=[e[0] for e in ERRORS])
def test_invalid_input_raises_before_any_write(name, change, error, words, inplace):
    q, k, cos, sin = _valid()
    args = dict(q=q, k=k, cos=cos, sin=sin, inplace=inplace)
    args.update(change(q, k, cos, sin))
    before = [t.clone() for t in (args["q"], args["k"]) if isinstance(t, torch.Tensor)]
    with pytest.raises(error, match=words):
        ropekit.apply_rope(**args)
    after = [t for t in (args["q"], args["k"]) if isinstance(t, torch.Tensor)]
    for b, a in zip(before, after):
        assert torch.equal(b, a) or (b.is_complex() and torch.equal(torch.view_as_real(b), torch.view_as_real(a)))


def test_check_mode_catches_device_values(monkeypatch):
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    q, k, cos, sin = _valid()
    with pytest.raises(ValueError, match="table"):
        ropekit.apply_rope(q, k, cos, sin, positions=torch.tensor([3, 14], device=DEVICE))
    cu = torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens"):
        ropekit.apply_rope(q.reshape(6, 4, 32), None, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=4)


def test_out_of_table_positions_without_check_mode_give_nan_not_garbage():
    q, k, cos, sin = _valid()
    out_q, _ = ropekit.apply_rope(q, None, cos, sin, positions=torch.tensor([0, 100], device=DEVICE))
    assert torch.isfinite(out_q[0]).all() and torch.isnan(out_q[1]).all()


def test_launch_parameters_logged_at_debug(caplog):
    q, k, cos, sin = _valid()
    with caplog.at_level(logging.DEBUG, logger="ropekit"):
        ropekit.apply_rope(q, k, cos, sin)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "grid=" in text and "BLOCK_S=" in text and "float32" in text


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_real_sizes_on_gpu(dtype):
    # Llama-3-8B prefill shape, per-sequence offsets, GQA 32/8.
    q = torch.randn(4, 4096, 32, 128, device="cuda").to(dtype)
    k = torch.randn(4, 4096, 8, 128, device="cuda").to(dtype)
    cos, sin = table(8192, 128)
    offsets = torch.randint(0, 4000, (4,), device="cuda")
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=offsets)
    pos = ref.token_positions(4, 4096, offsets=offsets.cpu())
    assert_close_to_reference(out_q, ref.rope(q, pos))
    assert_close_to_reference(out_k, ref.rope(k, pos))


# --------------------------------------------------------------------------------------------------------------------
# The eager plan cache: a repeated call skips validation, and must still compute the right thing on new data.
# --------------------------------------------------------------------------------------------------------------------

def _fail_if_validated(*args, **kwargs):
    raise AssertionError("_prepare ran: the call should have used its cached plan")


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cached_plan_reads_each_calls_tensors(case, inplace, monkeypatch):
    """Second and third calls with the same signature (fresh q, k, positions values) hit the plan and match the
    reference: the plan keeps shapes and strides, never a tensor or a position value."""
    from ropekit import api

    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, kind, dtype = case
    cos, sin = table(64, rotary_dim)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    for call in range(3):
        q = make(layout, batch, seqlen, hq, head_dim, dtype)
        k = make(layout, batch, seqlen, hk, head_dim, dtype)
        arg, pos = positions_for(kind, batch, seqlen)
        if kind == "int":
            arg += call  # a decode loop: the offset moves, the signature does not
            pos = ref.token_positions(batch, seqlen, offsets=arg)
        want_q, want_k = expected(q, layout, pos, **kw), expected(k, layout, pos, **kw)
        if call == 1:
            monkeypatch.setattr(api, "_prepare", _fail_if_validated)
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout=layout, inplace=inplace, **kw)
        assert (out_q is q) == inplace and (out_k is k) == inplace
        assert_close_to_reference(out_q, want_q)
        assert_close_to_reference(out_k, want_k)


def test_cached_plan_varlen_and_per_token(monkeypatch):
    from ropekit import api

    cos, sin = table(64, 32)
    cu = torch.tensor([0, 3, 7, 12], dtype=torch.int32, device=DEVICE)
    pos = torch.cat([torch.arange(3), torch.arange(4), torch.arange(5)])
    for call in range(2):
        q = torch.randn(12, 4, 32, device=DEVICE)
        out_q, _ = ropekit.apply_rope(q, None, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=5)
        assert_close_to_reference(out_q, ref.rope(q[None], pos[None])[0])
        # HF's per-token rows (b, s, R), broadcast over heads
        x = torch.randn(2, 5, 3, 32, device=DEVICE)
        ids = torch.randint(0, 64, (2, 5))
        rows_cos = torch.cat((cos[ids.to(DEVICE)], cos[ids.to(DEVICE)]), dim=-1)
        rows_sin = torch.cat((sin[ids.to(DEVICE)], sin[ids.to(DEVICE)]), dim=-1)
        out_x, _ = ropekit.apply_rope(x, None, rows_cos, rows_sin, per_token=True)
        assert_close_to_reference(out_x, ref.rope(x, ids))
        monkeypatch.setattr(api, "_prepare", _fail_if_validated)


def test_cached_plan_still_checks_the_offset_range():
    q, k, cos, sin = _valid()
    ropekit.apply_rope(q, k, cos, sin, positions=0)  # plan cached for int offsets of this signature
    for bad in (-1, cos.shape[0] - q.shape[1] + 1):
        before = q.clone()
        with pytest.raises(ValueError, match="positions"):
            ropekit.apply_rope(q, k, cos, sin, positions=bad, inplace=True)
        assert torch.equal(q, before)


def test_cached_plan_and_a_growing_table():
    """RopeTable grows for host-known positions; an old (shorter) cos tensor must not reuse the grown plan."""
    rope_table = ropekit.RopeTable(32, base=10000.0, device=DEVICE, max_positions=8)
    q = torch.randn(1, 4, 2, 32, device=DEVICE)
    short_cos, short_sin = rope_table.cos, rope_table.sin
    ropekit.apply_rope(q, None, table=rope_table, positions=2)
    out, _ = ropekit.apply_rope(q, None, table=rope_table, positions=20)  # grows the table
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(1, 4, offsets=20)))
    with pytest.raises(ValueError, match="rows"):
        ropekit.apply_rope(q, None, short_cos, short_sin, positions=20)


def test_cached_plan_distinguishes_strides():
    """Same shape, different strides (a non-contiguous view): a different plan, both right."""
    cos, sin = table(64, 32)
    for noncontiguous in (False, True, False, True):
        q = make("bshd", 2, 5, 4, 32, torch.float32, noncontiguous=noncontiguous)
        out_q, _ = ropekit.apply_rope(q, None, cos, sin)
        assert_close_to_reference(out_q, ref.rope(q, ref.token_positions(2, 5)))


def test_cached_plan_follows_a_swapped_launch_table(monkeypatch):
    """A plan made under one launch table is not reused under another (tile tuning and the sanitizer swap it)."""
    q, k, cos, sin = _valid()
    seen = []
    real = v4.launch_config
    ropekit.apply_rope(q, k, cos, sin)  # cached under the real table

    def recording(*args):
        seen.append(args)
        return real(*args)
    monkeypatch.setattr(v4, "launch_config", recording)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin)
    assert seen, "the swapped launch table was never asked: a plan of the real table was reused"
    assert_close_to_reference(out_q, ref.rope(q, ref.token_positions(q.shape[0], q.shape[1])))
