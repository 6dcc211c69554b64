"""ropekit.triton.launch: the launch table, plans (what a launch passes and what it lets Triton make a constant),
index widths, and the plan cache, through public names."""

import pytest
import torch
import triton.language as tl

import ropekit
from ropekit import device, reference as ref
from ropekit.positions import resolve_positions
from ropekit.testing import assert_close_to_reference
from ropekit.triton.launch import (LaunchConfig, V4Launch, forced_config, launch_config, plan_v4, plans,
                                   recorded_launches, rope_v4)
from ropekit.triton.v4 import rope_v4_kernel
from conftest import DEVICE
from rope_cases import table


def named(pointers: tuple) -> dict:
    """A launch's pointer arguments by the kernel's parameter names."""
    return dict(zip(rope_v4_kernel.arg_names, pointers))


def test_v4_passes_no_argument_it_does_not_read():
    # Graph replay pays for every byte of kernel arguments: contiguous q/k/outputs and table pass their
    # strides as 1 (Triton makes 1 a constant: not passed) and the kernel derives them (DENSE); so do unused
    # position strides and, on the tiles, where k's head blocks begin; the offset 0 passes as 1; absent position
    # tensors are None. A strided view still passes its real strides.
    cos, sin = table(64, 16)
    offsets = torch.tensor([3, 9], device=DEVICE)
    q = torch.randn(2, 5, 4, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)

    def plan_of(x, kx, positions, **kw):
        spec = resolve_positions(batch=2, seqlen=5, positions=positions)
        return plan_v4(x, kx, cos, sin, out_q=torch.empty_like(x), out_k=torch.empty_like(kx), positions=spec,
                       rotary_dim=16, **kw)

    def strides(args, *tensors):
        return tuple(args[f"stride_{t}{axis}"] for t in tensors for axis in "bshd")
    for positions in (None, offsets):
        plan = plan_of(q, k, positions)
        args = plan.arguments()
        assert plan.constexprs["DENSE"]
        assert args["n_head_blocks_q"] == 1  # the tiles derive where k's head blocks begin
        assert strides(args, "q", "k", "oq", "ok") == (1,) * 16
        assert (args["stride_cos_b"], args["stride_cos_s"], args["stride_cos_d"]) == (1, 1, 1)
        assert (args["stride_pos_b"], args["stride_pos_s"], args["n_tokens"]) == (1, 1, 1)
        assert args["position_offset"] == 1  # offset 0, passed plus one
        assert not plan.constexprs["IN_PLACE"]
        pointers = named(V4Launch.pointers(q, k, q, k, cos, sin, None if positions is None else offsets, None))
        assert pointers["CU_SEQLENS"] is None and (pointers["POSITIONS"] is None) == (positions is None)
    strided = torch.randn(2, 5, 6, 16, device=DEVICE)[:, :, :4]
    plan = plan_of(strided, k, None)
    assert not plan.constexprs["DENSE"] and strides(plan.arguments(), "q") == strided.stride()
    assert plan.arguments()["stride_cos_s"] == cos.stride(0)  # the table's row stride is passed when not DENSE
    out = torch.empty_like(strided)
    spec = resolve_positions(batch=2, seqlen=5, positions=offsets)
    rope_v4(strided, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=16)
    assert_close_to_reference(out, ref.rope(strided, (offsets[:, None] + torch.arange(5, device=DEVICE))))


@pytest.mark.parametrize("dense", [True, False], ids=["contiguous", "strided"])
def test_v4_in_place_passes_no_output(dense):
    # In place the outputs are q and k: their pointers pass as None and their strides as 1 (IN_PLACE), the kernel
    # writes through q and k with q's and k's strides, and a partial rotary leaves the tail as it is (no copy).
    cos, sin = table(64, 8)
    offsets = torch.tensor([3, 9], device=DEVICE)
    spec = resolve_positions(batch=2, seqlen=5, positions=offsets)
    q = torch.randn(2, 5, 6 if dense else 7, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)
    if not dense:
        q = q[:, :, 1:]  # a strided view: its strides are passed, the outputs' are not
    expected_q = ref.rope(q, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    expected_k = ref.rope(k, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    plan = plan_v4(q, k, cos, sin, out_q=q, out_k=k, positions=spec, rotary_dim=8)
    assert plan.constexprs["IN_PLACE"] and not plan.constexprs["COPY_TAIL"]
    assert plan.constexprs["DENSE"] == dense
    args = plan.arguments()
    assert all(args[f"stride_{t}{axis}"] == 1 for t in ("oq", "ok") for axis in "bshd")  # the outputs' strides
    if not dense:
        assert tuple(args[f"stride_q{axis}"] for axis in "bshd") == q.stride()
    pointers = named(V4Launch.pointers(q, k, q, k, cos, sin, offsets, None, plan.in_place))
    assert pointers["OUT_Q"] is None and pointers["OUT_K"] is None
    plan(q, k, q, k, cos, sin, offsets, None, 0)
    assert_close_to_reference(q, expected_q)
    assert_close_to_reference(k, expected_k)
    # another call's outputs that are not its inputs get a plan of their own
    out = torch.empty_like(k)
    assert not plan_v4(k, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=8).in_place


def test_int64_addressing_covers_per_token_rows_and_position_ids():
    # The kernel indexes per-token cos/sin rows and position ids with the same integer type as q and k: a small q
    # with such a tensor spanning 2**31 elements needs int64 too (meta tensors: planned, never launched)
    q, k = torch.empty(1, 4, 2, 16, device="meta"), torch.empty(1, 4, 1, 16, device="meta")
    outs = dict(out_q=torch.empty_like(q), out_k=torch.empty_like(k))
    table = torch.empty(64, 8, device="meta")
    huge_rows = torch.empty_strided((1, 4, 16), (2**30, 2**30, 1), device="meta")
    huge_ids = torch.empty_strided((1, 4), (2**30, 2**30), dtype=torch.int64, device="meta")
    plain = resolve_positions(batch=1, seqlen=4, positions=None)
    assert plan_v4(q, k, table, table, positions=plain, rotary_dim=16, **outs).constexprs["INDEX_DTYPE"] == tl.int32
    per_token = plan_v4(q, k, huge_rows, huge_rows, positions=plain, rotary_dim=16, cos_per_token=True, **outs)
    assert per_token.constexprs["INDEX_DTYPE"] == tl.int64
    ids = resolve_positions(batch=1, seqlen=4, positions=huge_ids)
    assert plan_v4(q, k, table, table, positions=ids, rotary_dim=16, **outs).constexprs["INDEX_DTYPE"] == tl.int64


def test_v4_gpu_table_for_prefills_flat_path_paired_in_fp32_and_a_bounded_share_of_the_tile_per_thread(monkeypatch):
    # The GPU table, exercised on any machine (outside the interpreter): two tokens x every head per program; 32
    # warps once a thread would hold more than 48 bytes at 16 (docs/tuning.md#launch-table).
    monkeypatch.setattr(device, "INTERPRET", False)
    launch_config.cache_clear()
    try:
        llama = launch_config(4 * 4096, 32, 8, 128, 128, False, 2)  # 40 bytes a thread at 16 warps
        mha = launch_config(8 * 2048, 64, 64, 128, 128, False, 2)  # 128
        fp32 = launch_config(2 * 2048, 32, 32, 64, 64, False, 4)  # 64
        fp16_same_heads = launch_config(2 * 2048, 32, 32, 64, 64, False, 2)  # 32
        fp32_gqa = launch_config(4 * 4096, 32, 8, 128, 128, False, 4)
        fp32_q_only = launch_config(2 * 2048, 32, 0, 64, 64, False, 4)
    finally:
        launch_config.cache_clear()
    assert all(c.fused_qk and c.block_s == 2 and c.evict_first for c in (llama, mha, fp32, fp16_same_heads))
    assert (llama.num_warps, mha.num_warps, fp32.num_warps, fp16_same_heads.num_warps) == (16, 32, 32, 16)
    # prefills take the flat path where the tensors allow it (docs/tuning.md#flat-path): 16-bit q then k in blocks
    # of 2048; fp32 q and k together in blocks of 512 where they have one shape, else q then k in blocks of 1024;
    # no streaming hint on the flat path (docs/tuning.md#eviction-hints); the tiles keep theirs
    table = (llama, mha, fp16_same_heads, fp32, fp32_gqa, fp32_q_only)
    assert [c.flat for c in table] == [2048, 2048, 2048, 512, 1024, 1024]
    assert [c.flat_paired for c in table] == [False, False, False, True, False, False]
    assert not any(c.flat_streaming for c in table)
    assert all(c.evict_first for c in table)


def test_a_forced_config_reaches_every_launch_and_leaves_no_plan_behind():
    # rope_v4(config=...) forces one launch; forced_config forces every launch however it is reached, and the plan
    # cache forgets what was planned on either side of it
    q = torch.randn(2, 3, 4, 16, device=DEVICE)
    cos, sin = table(16, 16)
    spec = resolve_positions(batch=2, seqlen=3, positions=None)
    tile = LaunchConfig(1, 1, 1)
    assert plan_v4(q, None, cos, sin, out_q=torch.empty_like(q), out_k=None, positions=spec, rotary_dim=16,
                   config=tile).constexprs["BLOCK_S"] == 1
    ropekit.apply_rope(q, None, cos, sin)
    assert plans
    with forced_config(tile):
        assert not plans
        assert plan_v4(q, None, cos, sin, out_q=torch.empty_like(q), out_k=None, positions=spec,
                       rotary_dim=16).grid == (3, 4, 2)  # one token x one head a program
        out, _ = ropekit.apply_rope(q, None, cos, sin)
    assert not plans
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(2, 3)))
    assert launch_config(6, 4, 0, 16, 16) != tile


def test_plan_cache_is_bounded():
    cache = type(plans)(2)
    for key in range(5):
        cache.put(key, key)
        assert len(cache) <= 2 and cache[key] == key


def test_recorded_launches_run_nothing_and_list_every_launch():
    q = torch.randn(2, 3, 4, 16, device=DEVICE)
    k = torch.randn(2, 3, 2, 16, device=DEVICE)
    cos, sin = table(16, 16)
    with recorded_launches() as records:
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=2)
        ropekit.apply_rope(q.requires_grad_(), None, cos, sin)[0].sum().backward()  # forward and backward
    assert len(records) == 3
    assert [r.constexprs["CONJUGATE"] for r in records] == [False, False, True]
    assert named(records[0].pointers)["Q"] is q and named(records[0].pointers)["OUT_Q"] is out_q
    plan = plan_v4(q, k, cos, sin, out_q=out_q, out_k=out_k, rotary_dim=16,
                   positions=resolve_positions(batch=2, seqlen=3, positions=2))
    assert records[0].grid == plan.grid and records[0].ints == tuple(plan.arguments(2).values())
