"""The public API as a specification: layouts, positions, GQA, pairings, partial rotary, in place, autograd, compile,
errors, logging and the eager plan cache — every output compared with the float64 reference."""

import logging

import pytest
import torch

import ropekit
from ropekit import api
from ropekit import reference as ref
from ropekit.layouts import TO_BSHD
from ropekit.testing import assert_close_to_reference
from ropekit.triton import launch
from ropekit.triton.launch import plans
from conftest import DEVICE, gpu_only
from rope_cases import CASES, expected, make, positions_for, table, valid_call


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
    want_q = ref.rope_backward(grad_q.permute(TO_BSHD[layout]), pos_bs, rotary_dim=24).permute(TO_BSHD[layout])
    want_k = ref.rope_backward(grad_k.permute(TO_BSHD[layout]), pos_bs, rotary_dim=24).permute(TO_BSHD[layout])
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


# --- torch.compile and CUDA graphs ----------------------------------------------------------------------------------

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


# --- Transformer Engine's angles ------------------------------------------------------------------------------------

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


def test_out_of_table_positions_without_check_mode_give_nan_not_garbage():
    q, k, cos, sin = valid_call()
    out_q, _ = ropekit.apply_rope(q, None, cos, sin, positions=torch.tensor([0, 100], device=DEVICE))
    assert torch.isfinite(out_q[0]).all() and torch.isnan(out_q[1]).all()


def test_launch_parameters_logged_at_debug(caplog):
    q, k, cos, sin = valid_call()
    with caplog.at_level(logging.DEBUG, logger="ropekit"):
        ropekit.apply_rope(q, k, cos, sin, backend="triton")  # the Triton launcher logs its launch
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "grid=" in text and ("block_s=" in text or "block=" in text) and "float32" in text


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
# The eager plan cache (the Triton backend's): a repeated call skips validation, and must still compute the right
# thing on new data.
# --------------------------------------------------------------------------------------------------------------------

triton_backend = pytest.mark.backend("triton")

def _no_new_plans(monkeypatch):
    """From here on, a call that makes a plan (i.e. that was validated and derived its launch) fails the test."""
    def fail(key, plan):
        raise AssertionError("a new plan was made: the call should have used its cached plan")
    monkeypatch.setattr(plans, "put", fail)


@triton_backend
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cached_plan_reads_each_calls_tensors(case, inplace, monkeypatch):
    """Second and third calls with the same signature (fresh q, k, positions values) hit the plan and match the
    reference: the plan keeps shapes and strides, never a tensor or a position value."""
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
            _no_new_plans(monkeypatch)
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout=layout, inplace=inplace, **kw)
        assert (out_q is q) == inplace and (out_k is k) == inplace
        assert_close_to_reference(out_q, want_q)
        assert_close_to_reference(out_k, want_k)


@triton_backend
def test_cached_plan_varlen_and_per_token(monkeypatch):
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
        _no_new_plans(monkeypatch)


@triton_backend
def test_cached_plan_still_checks_the_offset_range():
    q, k, cos, sin = valid_call()
    ropekit.apply_rope(q, k, cos, sin, positions=0)  # plan cached for int offsets of this signature
    for bad in (-1, cos.shape[0] - q.shape[1] + 1):
        before = q.clone()
        with pytest.raises(ValueError, match="positions"):
            ropekit.apply_rope(q, k, cos, sin, positions=bad, inplace=True)
        assert torch.equal(q, before)


@triton_backend
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


@triton_backend
def test_cached_plan_distinguishes_strides():
    """Same shape, different strides (a non-contiguous view): a different plan, both right."""
    cos, sin = table(64, 32)
    for noncontiguous in (False, True, False, True):
        q = make("bshd", 2, 5, 4, 32, torch.float32, noncontiguous=noncontiguous)
        out_q, _ = ropekit.apply_rope(q, None, cos, sin)
        assert_close_to_reference(out_q, ref.rope(q, ref.token_positions(2, 5)))


@triton_backend
def test_cached_plan_follows_a_forced_launch_config():
    """A plan made under the launch table is not reused under a forced configuration, nor the other way round."""
    q, k, cos, sin = valid_call()
    want = ref.rope(q, ref.token_positions(q.shape[0], q.shape[1]))
    ropekit.apply_rope(q, k, cos, sin)  # cached under the launch table
    tile = launch.TileConfig(1, 1, 1)
    with launch.forced_config(tile):
        out_q, _ = ropekit.apply_rope(q, k, cos, sin)
        assert [plan.launch.config for plan in launch.plans.values()] == [tile]
        assert_close_to_reference(out_q, want)
    assert not launch.plans
    out_q, _ = ropekit.apply_rope(q, k, cos, sin)
    assert_close_to_reference(out_q, want)


@triton_backend
def test_a_repeated_training_call_plans_its_forward_and_backward_once(monkeypatch):
    """A call whose q and k require grad goes through autograd, not the eager plan, and is validated every time; its
    launches, forward and backward, come from the same plan cache: the second step plans nothing. Both steps' outputs
    and gradients match the float64 reference (the gradient of a rotation is the rotation by -theta)."""
    cos, sin = table(64, 32)
    positions = torch.tensor([3, 11], device=DEVICE)
    pos = ref.token_positions(2, 5, offsets=positions.cpu())
    for step in range(2):
        q = torch.randn(2, 5, 4, 32, device=DEVICE, requires_grad=True)
        k = torch.randn(2, 5, 2, 32, device=DEVICE, requires_grad=True)
        w_q, w_k = torch.randn_like(q), torch.randn_like(k)
        if step == 1:
            _no_new_plans(monkeypatch)
            for module in (launch, api):  # and no launch derived again, cached or not
                monkeypatch.setattr(module, "plan_rope", lambda *a, **kw: pytest.fail("a launch was planned again"))
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=positions)
        ((out_q * w_q).sum() + (out_k * w_k).sum()).backward()
        assert_close_to_reference(out_q, ref.rope(q.detach(), pos))
        assert_close_to_reference(out_k, ref.rope(k.detach(), pos))
        assert_close_to_reference(q.grad, ref.rope(w_q, pos, conjugate=True))
        assert_close_to_reference(k.grad, ref.rope(w_k, pos, conjugate=True))


@triton_backend
def test_a_cached_plan_keeps_none_of_its_calls_tensors_alive():
    """The plans a call leaves in the cache (the eager signature's, the validated call's of a training step, a fused
    op's) hold no tensor of that call: dropping the caller's references frees its inputs, its outputs and their autograd graph."""
    import gc
    import weakref

    cos, sin = table(64, 32)
    q = torch.randn(2, 5, 4, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 5, 2, 32, device=DEVICE, requires_grad=True)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin)  # autograd: a plan through the validated call
    out_q.sum().backward()  # and one for the backward
    x = torch.randn(2, 5, 4, 32, device=DEVICE)
    out_x, _ = ropekit.apply_rope(x, None, cos, sin)  # eager: a plan by the call's signature
    y = torch.randn(2, 5, 4, 32, device=DEVICE)
    out_y, _ = ropekit.qk_norm_rope(y, None, cos, sin, torch.ones(32, device=DEVICE))  # a fused op's plan
    refs = [weakref.ref(t) for t in (q, k, out_q, out_k, x, out_x, y, out_y)]
    del q, k, out_q, out_k, x, out_x, y, out_y
    gc.collect()
    assert plans and [ref() for ref in refs] == [None] * len(refs)


def test_torch_compile_fullgraph_in_place_with_a_key():
    """In place with both q and k (the overlap check compares data pointers, which a traced graph has not) compiles
    without a graph break, as an engine compiles its model (fullgraph), and rotates like the eager call."""
    cos, sin = table()

    def step(q, k, offsets):
        ropekit.apply_rope(q, k, cos, sin, positions=offsets, inplace=True)
        return q, k

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    want_q, want_k = ropekit.apply_rope(q, k, cos, sin, positions=torch.tensor([4, 0], device=DEVICE))
    got_q, got_k = compiled(q.clone(), k.clone(), torch.tensor([4, 0], device=DEVICE))
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)


# --------------------------------------------------------------------------------------------------------------------
# Calls without a cos/sin table (table-free angles, Llama 4's NoPE temperature) through torch.compile, a CUDA graph
# and the plan cache: one specification, each call kind a parameter.
# --------------------------------------------------------------------------------------------------------------------

class TableFreeAngles:
    """``apply_rope(q, k, inv_freq=..., scale=...)``: q and k rotated by position * inv_freq, times ``scale``."""
    far = 2_000_000  # a position past any table a test would build
    signatures = ((10000.0, 1.25), (10000.0, 0.5))  # (base, scale): each its own call signature
    graph = (32, 10_000_000, (500000.0, 1.0))  # CUDA graph: q heads, offsets below, signature

    @staticmethod
    def kwargs(head_dim, signature):
        base, scale = signature
        return dict(inv_freq=ropekit.inverse_frequencies(head_dim, base).to(DEVICE, torch.float64), scale=scale)

    @staticmethod
    def q(x, positions, signature):
        base, scale = signature
        return scale * ref.rope(x, positions, base=base)

    k = q


class NopeTemperature:
    """``apply_rope(q, k, nope_temperature=(floor_scale, attn_scale))``: q scaled at its position, k passed through."""
    far = 30
    signatures = ((4, 0.5), (4, 0.25), (8, 0.5))  # (floor_scale, attn_scale)
    graph = (40, 100_000, (8192, 0.1))  # Llama 4's 40 q heads and scales

    @staticmethod
    def kwargs(head_dim, signature):
        return dict(nope_temperature=signature)

    @staticmethod
    def q(x, positions, signature):
        return ref.nope_temperature(x, positions, *signature)

    @staticmethod
    def k(x, positions, signature):
        return x


TABLE_FREE = [pytest.param(TableFreeAngles, id="table-free-angles"), pytest.param(NopeTemperature, id="nope")]
COMPILE_BACKEND = "aot_eager" if DEVICE == "cpu" else "inductor"


@pytest.mark.parametrize("kind", TABLE_FREE)
def test_table_free_calls_compile_fullgraph_out_of_place_in_place_and_for_training(backend, kind):
    signature = kind.signatures[0]
    kwargs = kind.kwargs(32, signature)

    def step(q, k, offsets):
        q2, k2 = ropekit.apply_rope(q, k, positions=offsets, **kwargs)
        return (q2 * 2).sum(-1), k2

    q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)
    offsets = torch.tensor([4, kind.far], device=DEVICE)
    for got, want in zip(torch.compile(step, fullgraph=True, backend=COMPILE_BACKEND)(q, k, offsets),
                         step(q, k, offsets)):
        torch.testing.assert_close(got, want)

    def loss(q):
        return ropekit.apply_rope(q, None, positions=1, **kwargs)[0].square().sum()

    q = q.detach().requires_grad_()
    torch.compile(loss, fullgraph=True, backend=COMPILE_BACKEND)(q).backward()
    grad, q.grad = q.grad.clone(), None
    loss(q).backward()
    torch.testing.assert_close(grad, q.grad)

    def in_place(x, offsets):
        ropekit.apply_rope(x, None, positions=offsets, inplace=True, **kwargs)
        return x

    x, offsets = make("bshd", 2, 3, 4, 32, torch.float32), torch.tensor([7, 0], device=DEVICE)
    got = torch.compile(in_place, fullgraph=True, backend=COMPILE_BACKEND)(x.clone(), offsets)
    assert_close_to_reference(got, kind.q(x, ref.token_positions(2, 3, offsets=offsets.cpu()), signature))


@gpu_only
@pytest.mark.parametrize("kind", TABLE_FREE)
def test_table_free_calls_replay_in_a_cuda_graph_with_new_positions(kind):
    heads_q, offsets_below, signature = kind.graph
    kwargs = kind.kwargs(128, signature)
    q = torch.randn(64, 1, heads_q, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    offsets = torch.randint(0, offsets_below, (64,), device="cuda")
    out = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up (compile) outside the capture
            ropekit.apply_rope(q, k, positions=offsets, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["q"], out["k"] = ropekit.apply_rope(q, k, positions=offsets, **kwargs)
    for _ in range(3):
        offsets.copy_(torch.randint(0, offsets_below, (64,), device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        pos = ref.token_positions(64, 1, offsets=offsets.cpu())
        assert_close_to_reference(out["q"], kind.q(q, pos, signature))
        want_k = kind.k(k, pos, signature)
        if want_k is k:
            assert torch.equal(out["k"], k)
        else:
            assert_close_to_reference(out["k"], want_k)


@triton_backend
@pytest.mark.parametrize("kind", TABLE_FREE)
def test_table_free_calls_hit_their_plan_and_each_other_signature_makes_another(kind, monkeypatch):
    first, *others = kind.signatures
    for call, offset in enumerate((3, kind.far)):
        if call == 1:
            real_put = plans.put
            _no_new_plans(monkeypatch)
        q, k = make("bshd", 2, 3, 4, 32, torch.float32), make("bshd", 2, 3, 2, 32, torch.float32)  # fresh values
        out_q, out_k = ropekit.apply_rope(q, k, positions=offset, **kind.kwargs(32, first))
        pos = ref.token_positions(2, 3, offsets=offset)
        assert_close_to_reference(out_q, kind.q(q, pos, first))
        assert_close_to_reference(out_k, kind.k(k, pos, first))
    monkeypatch.setattr(plans, "put", real_put)
    for signature in others:
        n_plans = len(plans)
        out_q, out_k = ropekit.apply_rope(q, k, positions=9, **kind.kwargs(32, signature))
        assert len(plans) == n_plans + 1
        pos = ref.token_positions(2, 3, offsets=9)
        assert_close_to_reference(out_q, kind.q(q, pos, signature))
        assert_close_to_reference(out_k, kind.k(k, pos, signature))


@pytest.mark.parametrize("argument,value", [("layout", ["bshd"]), ("rotary_dim", [16]), ("scale", [1.0])])
def test_an_unhashable_argument_is_refused_by_name_not_by_the_plan_cache(argument, value):
    """The eager plan's key holds the call's host arguments; a list among them must reach validation, whose error
    names the argument, rather than fail the plan cache's hash."""
    q, k = make("bshd", 1, 4, 2, 16, torch.float32), make("bshd", 1, 4, 2, 16, torch.float32)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    with pytest.raises((TypeError, ValueError), match=argument):
        ropekit.apply_rope(q, k, cos, sin, backend="triton", **{argument: value})
