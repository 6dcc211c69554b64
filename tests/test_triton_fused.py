"""ropekit.triton.fused: the fused kernel's launcher on its own, with small forced tiles so that many programs share
the work (partial tiles, sequences shorter than the longest, weight gradients summed over many programs, by atomic
adds or in deterministic mode by per-program rows), against the float64 reference."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.positions import POSITION_IDS, SCALAR_OFFSET, PositionSpec
from ropekit.testing import assert_close_to_reference
from ropekit.triton.fused import CACHE_PAGED, FusedConfig, launch_fused
from conftest import DEVICE, gpu_only

SMALL = FusedConfig(block_s=2, block_h=1, num_warps=1)
# the same tiles launched head blocks inner (one grid axis for tokens x heads), with the streaming hint
SMALL_HEADS_INNER = FusedConfig(block_s=2, block_h=1, num_warps=1, evict_first=True, heads_inner=True)
# backward programs that walk three token blocks each (the last group partial), in both launch orders
SMALL_GROUPS = FusedConfig(block_s=2, block_h=1, num_warps=1, token_blocks=3)
SMALL_GROUPS_INNER = SMALL_GROUPS._replace(heads_inner=True)
SMALL_GROUPS_PIPELINED = SMALL_GROUPS._replace(stages=2)  # the walk software-pipelined (on a GPU)


@pytest.fixture(params=[False, True], ids=["atomic-sum", "deterministic"])
def deterministic(request):
    """Both ways the backward sums its weight gradients: atomic adds into one row per tensor, or (under
    torch.use_deterministic_algorithms) a row per program and one reduction."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("config", [SMALL, SMALL_HEADS_INNER, SMALL_GROUPS, SMALL_GROUPS_INNER, SMALL_GROUPS_PIPELINED])
@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_sums_weight_gradients_over_every_program(interleaved, config, deterministic):
    """varlen: 3 sequences (one shorter than a tile), one head per program: the weight gradient is the sum of many
    programs' rows, and the early-exiting programs contribute nothing."""
    cu = torch.tensor([0, 1, 6, 9], device=DEVICE)
    x = torch.randn(9, 3, 8, device=DEVICE, dtype=torch.float64)
    g = torch.randn(9, 3, 8, device=DEVICE, dtype=torch.float64)
    w = torch.randn(8, device=DEVICE, dtype=torch.float64)
    cos, sin = (t.double() for t in ropekit.cos_sin_table(16, 6, device=DEVICE))
    dx = torch.empty_like(x)
    spec = PositionSpec(SCALAR_OFFSET, 2, None, cu, 5)
    dw, _ = launch_fused(x, None, cos, sin, positions=spec, rotary_dim=6, interleaved=interleaved, out_q=dx,
                         q_weight=w, eps=1e-6, weight_offset=1.0, grad_q=g, config=config)
    leaves = [t.detach().cpu().requires_grad_() for t in (x, w)]
    normed = ref.rms_norm(leaves[0], leaves[1], eps=1e-6, weight_offset=1.0)
    out = ref.rope_table(normed, cos, sin, ref.varlen_positions(cu, offsets=2), interleaved=interleaved)
    want_dx, want_dw = torch.autograd.grad(out, leaves, g.cpu())
    assert_close_to_reference(dx, want_dx)
    assert_close_to_reference(dw, want_dw)


@pytest.mark.parametrize("token_blocks,stages", [(1, 1), (2, 1), (4, 1), (4, 3), (4, 4)])
def test_backward_of_q_and_k_with_fewer_k_heads_in_token_groups(token_blocks, stages, deterministic):
    """Batch form, 7 tokens (a partial tile and a partial group), 5 q heads in blocks of 4 and one k head in a
    block of its own (k's head blocks are sized to k): every gradient against the float64 reference."""
    config = FusedConfig(block_s=2, block_h=4, num_warps=2, token_blocks=token_blocks, stages=stages)
    q, k = (torch.randn(2, 7, h, 8, device=DEVICE, dtype=torch.float64) for h in (5, 1))
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    wq, wk = (torch.randn(8, device=DEVICE, dtype=torch.float64) for _ in range(2))
    cos, sin = (t.double() for t in ropekit.cos_sin_table(16, 8, device=DEVICE))
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dw_q, dw_k = launch_fused(q, k, cos, sin, positions=PositionSpec(SCALAR_OFFSET, 3), rotary_dim=8, out_q=dq,
                              out_k=dk, q_weight=wq, k_weight=wk, eps=1e-6, grad_q=gq, grad_k=gk, config=config)
    leaves = [t.detach().cpu().requires_grad_() for t in (q, k, wq, wk)]
    outs = [ref.rope_table(ref.rms_norm(x, w, eps=1e-6), cos, sin, 3 + torch.arange(7))
            for x, w in ((leaves[0], leaves[2]), (leaves[1], leaves[3]))]
    want = torch.autograd.grad(outs, leaves, [gq.cpu(), gk.cpu()])
    for got, expected in zip((dq, dk, dw_q, dw_k), want):
        assert_close_to_reference(got, expected)


@gpu_only
def test_deterministic_mode_repeats_weight_gradients_bit_for_bit():
    """Thousands of programs add into each weight-gradient element: in deterministic mode two calls agree bit for
    bit, and the atomic sum agrees with them to float32 rounding."""
    q = torch.randn(2, 4096, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(2, 4096, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    wq, wk = (torch.randn(128, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = ropekit.cos_sin_table(4096, 128, device=DEVICE)

    def weight_gradients():
        return launch_fused(q, k, cos, sin, positions=PositionSpec(SCALAR_OFFSET, 0), rotary_dim=128,
                            out_q=torch.empty_like(q), out_k=torch.empty_like(k), q_weight=wq, k_weight=wk, eps=1e-6,
                            grad_q=gq, grad_k=gk)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        first, second = weight_gradients(), weight_gradients()
    finally:
        torch.use_deterministic_algorithms(before)
    atomic = weight_gradients()
    for a, b, c in zip(first, second, atomic):
        assert torch.equal(a, b)
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5 * a.abs().max().item())


@pytest.mark.parametrize("config", [SMALL, SMALL_HEADS_INNER])
def test_forward_paged_norm_with_position_ids_in_small_tiles(config):
    """q and k heads split over programs, k's programs writing the cache; q out of place, k not written back."""
    tokens, hq, hk, d = 5, 3, 2, 16
    q, k, v = (torch.randn(1, tokens, h, d, device=DEVICE) for h in (hq, hk, hk))
    qw, kw = torch.randn(d, device=DEVICE), torch.randn(d, device=DEVICE)
    k_cache, v_cache = torch.zeros(3, 4, hk, d, device=DEVICE), torch.zeros(3, 4, hk, d, device=DEVICE)
    slots = torch.tensor([11, 0, -1, 5, 6], device=DEVICE)
    ids = torch.tensor([[9, 0, 3, 3, 15]], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 12, device=DEVICE)
    out_q = torch.empty_like(q)
    launch_fused(q, k, cos, sin, positions=PositionSpec(POSITION_IDS, 0, ids), rotary_dim=12, out_q=out_q, v=v,
                 k_cache=k_cache, v_cache=v_cache, cache_mode=CACHE_PAGED, slots=slots, block_size=4, cache_len=12,
                 q_weight=qw, k_weight=kw, eps=1e-5, config=config)
    want_q = ref.rope_table(ref.rms_norm(q, qw, eps=1e-5), cos, sin, ids.cpu())
    want_k = ref.rope_table(ref.rms_norm(k, kw, eps=1e-5), cos, sin, ids.cpu())[0]
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(k_cache, ref.paged_cache_write(torch.zeros(3, 4, hk, d), want_k, slots))
    assert torch.equal(v_cache.cpu().double(), ref.paged_cache_write(torch.zeros(3, 4, hk, d), v[0], slots))


def test_the_launch_choice_is_the_models_and_the_override_wins(monkeypatch):
    from ropekit.triton import choice, model
    from ropekit.triton.fused import FusedShape, forced_fused_config, fused_config_for

    def shape(tokens, heads=32):
        return FusedShape(tokens, heads, 128, 2)

    # under the interpreter: fixed tiles; on a GPU: the model's choice on the GPU's facts (tests/test_choice.py holds
    # what the H100's measured table knew), never more heads a program than the call has
    if ropekit.device.INTERPRET:
        assert fused_config_for(shape(3, heads=4), DEVICE) == FusedConfig(4, 4, 4)
    facts = model.DeviceFacts("H100 SXM (published)", 132, 3350.0, 600.0, "assumed")
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)
    monkeypatch.setattr(choice, "choose_fused", lambda s, device=None, bench=None, registers=None:
                        model.model_fused(facts, s))
    assert fused_config_for(shape(16384, heads=4), DEVICE).block_h <= 4
    forced = FusedConfig(block_s=3, block_h=5, num_warps=2)  # any value: the override is taken as given
    with forced_fused_config(forced):
        assert fused_config_for(shape(16384), DEVICE) == forced
        with forced_fused_config(None):
            assert fused_config_for(shape(16384), DEVICE) != forced
        assert fused_config_for(shape(1, heads=1), DEVICE) == forced
    assert fused_config_for(shape(16384), DEVICE) != forced


def test_a_forced_config_reaches_the_kernel_through_the_public_op():
    """The public op under a forced small tile gives the same result as under the table (many programs vs few)."""
    from ropekit.fused import qk_norm_rope
    from ropekit.triton.fused import forced_fused_config

    q, k = torch.randn(2, 5, 3, 16, device=DEVICE), torch.randn(2, 5, 2, 16, device=DEVICE)
    w = torch.randn(16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    want = qk_norm_rope(q, k, cos, sin, w, w)
    with forced_fused_config(SMALL):
        got = qk_norm_rope(q, k, cos, sin, w, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _python_calls(fn) -> int:
    """Python function calls one call of ``fn`` makes (the profiler's "call" events)."""
    import sys

    calls = [0]

    def count(frame, event, arg):
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls[0]


@pytest.mark.parametrize("op", ["rope_and_cache", "rope_and_cache-qk-norm", "qk_norm_rope", "qk_norm_rope-in-place",
                                "mla_rope_and_cache"])
def test_a_repeated_fused_call_costs_the_host_about_what_apply_rope_costs(op):
    """A decode step repeated with the same signature goes straight to its plan: the fused op's host path makes at most
    1.5 times the Python calls of apply_rope's on the same q and k (launches held back: nothing runs)."""
    from ropekit.triton.launch import recorded_launches

    batch, dtype = 4, torch.bfloat16
    q, k, v = (torch.randn(batch, 1, h, 128, device=DEVICE, dtype=dtype) for h in (8, 2, 2))
    cos, sin = ropekit.cos_sin_table(64, 128, device=DEVICE)
    offsets = torch.tensor([3, 9, 0, 40], device=DEVICE)
    k_cache, v_cache = (torch.zeros(2, 4, 2, 128, device=DEVICE, dtype=dtype) for _ in range(2))
    slots = torch.arange(batch, device=DEVICE)
    w = torch.randn(128, device=DEVICE, dtype=dtype)
    q_pe, k_pe, kv_c = (torch.randn(batch, *shape, device=DEVICE, dtype=dtype) for shape in ((8, 64), (64,), (96,)))
    kv_cache = torch.zeros(2, 4, 96 + 64, device=DEVICE, dtype=dtype)
    cos64, sin64 = ropekit.cos_sin_table(64, 64, device=DEVICE)
    calls = {
        "rope_and_cache": lambda: ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                                         slot_mapping=slots, positions=offsets),
        "rope_and_cache-qk-norm": lambda: ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                                                 slot_mapping=slots, positions=offsets, q_weight=w,
                                                                 k_weight=w),
        "qk_norm_rope": lambda: ropekit.qk_norm_rope(q, k, cos, sin, w, w, positions=offsets),
        "qk_norm_rope-in-place": lambda: ropekit.qk_norm_rope(q, k, cos, sin, w, w, positions=offsets, inplace=True),
        "mla_rope_and_cache": lambda: ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, offsets, cos64,
                                                                 sin64),
    }
    with torch.no_grad(), recorded_launches() as launches:
        rope = lambda: ropekit.apply_rope(q, k, cos, sin, positions=offsets)  # noqa: E731
        rope(), calls[op]()  # the first calls validate and plan
        planned = len(launches)
        rope_calls, fused_calls = _python_calls(rope), _python_calls(calls[op])
        assert len(launches) == planned + 2  # the repeated calls launched
    assert fused_calls <= 1.5 * rope_calls, (fused_calls, rope_calls)
