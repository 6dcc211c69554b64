"""ropekit.triton.launch: plans (what a launch passes and what it lets Triton make a constant), the forced
configuration, the dry run and the plan cache, through public names and the launches' own records: no test here
knows a kernel's parameter names or positions."""

import pytest
import torch
import triton
import triton.language as tl

import ropekit
from ropekit import reference as ref
from ropekit.positions import resolve_positions
from ropekit.testing import assert_close_to_reference
from ropekit.triton.launch import (KernelLaunch, TileConfig, forced_config, plan_rope, plans, recorded_launches,
                                   rope_v4)
from conftest import DEVICE, gpu_only
from rope_cases import table


def leaves(value) -> list:
    """A value's leaves: tuples (the kernels' argument groups) unpacked all the way down."""
    return [leaf for item in value for leaf in leaves(item)] if isinstance(value, tuple) else [value]


def passed_integers(record) -> list:
    """The integers a recorded launch passes as arguments, tuples unpacked, constants to Triton (1) left out."""
    return [leaf for name, value in record.arguments.items() if name not in record.constexprs
            for leaf in leaves(value) if type(leaf) is int and leaf != 1]


def passed_tensors(record) -> list:
    return [v for value in record.arguments.values() for v in leaves(value) if isinstance(v, torch.Tensor)]


def record(fn, config=TileConfig(2, 4, 4)):
    """The one launch ``fn`` makes, planned with ``config`` (the same on every device)."""
    with forced_config(config), recorded_launches() as records:
        fn()
    assert len(records) == 1
    return records[0]


def test_a_contiguous_launch_passes_no_stride_and_a_strided_view_its_own():
    # Graph replay pays for every byte of kernel arguments: contiguous q/k/outputs and table pass no strides (the
    # kernel derives them), absent position tensors are None and the offset 0 is a constant. A strided view passes
    # its real strides.
    cos, sin = table(48, 16)
    offsets = torch.tensor([3, 9], device=DEVICE)
    q = torch.randn(2, 5, 4, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)
    dense = record(lambda: ropekit.apply_rope(q, k, cos, sin, backend="triton"))
    assert sorted(passed_integers(dense)) == [2, 4, 5, 48]  # k's heads, q's heads, seq, table rows: no stride
    strided = torch.randn(2, 5, 7, 16, device=DEVICE)[:, :, 1:5]
    view = record(lambda: ropekit.apply_rope(strided, k, cos, sin, positions=offsets, backend="triton"))
    assert set(strided.stride()) - {1} <= set(passed_integers(view))
    out, _ = ropekit.apply_rope(strided, None, cos, sin, positions=offsets, backend="triton")
    assert_close_to_reference(out, ref.rope(strided, (offsets[:, None] + torch.arange(5, device=DEVICE))))


@pytest.mark.parametrize("dense", [True, False], ids=["contiguous", "strided"])
def test_in_place_passes_no_output_and_leaves_the_tail(dense):
    # In place the outputs are q and k: no output tensor is passed, the kernel writes through q and k with their
    # strides, and a partial rotary leaves the tail as it is.
    cos, sin = table(64, 8)
    offsets = torch.tensor([3, 9], device=DEVICE)
    q = torch.randn(2, 5, 6 if dense else 7, 16, device=DEVICE)
    k = torch.randn(2, 5, 2, 16, device=DEVICE)
    if not dense:
        q = q[:, :, 1:]
    expected_q = ref.rope(q, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    expected_k = ref.rope(k, offsets[:, None] + torch.arange(5, device=DEVICE), rotary_dim=8)
    launch = record(lambda: ropekit.apply_rope(q, k, cos, sin, positions=offsets, rotary_dim=8, inplace=True,
                                               backend="triton"))
    assert {id(t) for t in passed_tensors(launch)} == {id(t) for t in (q, k, cos, sin, offsets)}
    ropekit.apply_rope(q, k, cos, sin, positions=offsets, rotary_dim=8, inplace=True, backend="triton")
    assert_close_to_reference(q, expected_q)
    assert_close_to_reference(k, expected_k)
    spec = resolve_positions(batch=2, seqlen=5, positions=offsets)
    out = torch.empty_like(k)
    assert not plan_rope(k, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=8).in_place


def test_int64_addressing_covers_per_token_rows_and_position_ids():
    # The kernel indexes per-token cos/sin rows and position ids with the same integer type as q and k: a small q
    # with such a tensor spanning 2**31 elements needs int64 too (meta tensors: planned, never launched)
    q, k = torch.empty(1, 4, 2, 16, device="meta"), torch.empty(1, 4, 1, 16, device="meta")
    outs = dict(out_q=torch.empty_like(q), out_k=torch.empty_like(k))
    tab = torch.empty(64, 8, device="meta")
    huge_rows = torch.empty_strided((1, 4, 16), (2**30, 2**30, 1), device="meta")
    huge_ids = torch.empty_strided((1, 4), (2**30, 2**30), dtype=torch.int64, device="meta")
    plain = resolve_positions(batch=1, seqlen=4, positions=None)

    def int64(plan):
        return tl.int64 in leaves(tuple(plan.launch.constexprs.values()))
    assert not int64(plan_rope(q, k, tab, tab, positions=plain, rotary_dim=16, **outs))
    assert int64(plan_rope(q, k, huge_rows, huge_rows, positions=plain, rotary_dim=16, cos_per_token=True, **outs))
    ids = resolve_positions(batch=1, seqlen=4, positions=huge_ids)
    assert int64(plan_rope(q, k, tab, tab, positions=ids, rotary_dim=16, **outs))


def test_the_shape_a_choice_sees_says_whether_sequences_are_packed_and_whether_the_kernel_makes_its_angles():
    """The model keeps the small streaming tile from packed batches and from angles a program's heads would each
    compute (table-free angles, a NoPE temperature, M-RoPE's position a pair): plan_rope tells it which."""
    q, k = torch.randn(2, 4, 4, 16, device=DEVICE), torch.randn(2, 4, 2, 16, device=DEVICE)
    tab = table(16, 16)[0]
    plain = resolve_positions(batch=2, seqlen=4, positions=None)
    ids = torch.zeros(3, 2, 4, dtype=torch.int64, device=DEVICE)
    mrope = resolve_positions(batch=2, seqlen=4, positions=ids, mrope_section=(2, 3, 3))
    inv_freq = torch.ones(8, dtype=torch.float64, device=DEVICE)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=DEVICE)
    packed = resolve_positions(batch=2, seqlen=8, positions=None, cu_seqlens=cu, max_seqlen=5)
    q3, k3 = torch.randn(8, 4, 16, device=DEVICE), torch.randn(8, 2, 16, device=DEVICE)

    def shape(q, k, cos, **kw):
        out = dict(out_q=torch.empty_like(q), out_k=torch.empty_like(k))
        return plan_rope(q, k, cos, cos, rotary_dim=16, **out, **kw).shape

    assert not shape(q, k, tab, positions=plain).computed_angles and not shape(q, k, tab, positions=plain).varlen
    assert shape(q, k, None, positions=plain, inv_freq=inv_freq).computed_angles
    assert shape(q, k, None, positions=plain, nope=(4, 0.5)).computed_angles
    assert shape(q, k, tab, positions=mrope).computed_angles
    assert shape(q3, k3, tab, positions=packed).varlen and not shape(q3, k3, tab, positions=packed).computed_angles


def test_a_forced_config_reaches_every_launch_and_leaves_no_plan_behind():
    # rope_v4(config=...) forces one launch; forced_config forces every launch however it is reached, and the plan
    # cache forgets what was planned on either side of it
    q = torch.randn(2, 3, 4, 16, device=DEVICE)
    cos, sin = table(16, 16)
    spec = resolve_positions(batch=2, seqlen=3, positions=None)
    tile = TileConfig(1, 1, 1)
    plan = plan_rope(q, None, cos, sin, out_q=torch.empty_like(q), out_k=None, positions=spec, rotary_dim=16,
                     config=tile)
    assert plan.config == tile and plan.launch.grid == (3, 4, 2)  # one token x one head a program
    ropekit.apply_rope(q, None, cos, sin, backend="triton")
    assert plans
    with forced_config(tile):
        assert not plans
        with recorded_launches() as records:
            ropekit.apply_rope(q, None, cos, sin, backend="triton")
        assert records[0].grid == (3, 4, 2)
        out, _ = ropekit.apply_rope(q, None, cos, sin, backend="triton")
    assert not plans
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(2, 3)))


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
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=2, backend="triton")
        ropekit.apply_rope(q.requires_grad_(), None, cos, sin, backend="triton")[0].sum().backward()  # fwd, bwd
    assert len(records) == 3
    assert any(t is q for t in passed_tensors(records[0])) and any(t is out_q for t in passed_tensors(records[0]))
    plan = plan_rope(q, k, cos, sin, out_q=out_q, out_k=out_k, rotary_dim=16,
                     positions=resolve_positions(batch=2, seqlen=3, positions=2))
    assert records[0].grid == plan.launch.grid and records[0].kernel is plan.launch.kernel
    assert records[1].arguments.keys() == records[2].arguments.keys()
    # launches of two dtypes never share a compiled kernel (the direct launch keys on the plan's dtypes)
    spec = resolve_positions(batch=2, seqlen=3, positions=2)
    half, bf16 = (plan_rope(q.to(t), k.to(t), cos, sin, out_q=out_q.to(t), out_k=out_k.to(t), rotary_dim=16,
                            positions=spec) for t in (torch.float16, torch.bfloat16))
    assert half.launch.key != bf16.launch.key
    assert [k for k, v in records[1].arguments.items() if k in records[1].constexprs
            and v != records[2].arguments[k]] != []  # the backward is another specialisation (the conjugate)


@triton.jit
def _scale_rows(scale, OUT, BLOCK: tl.constexpr, X, strides):
    # parameters in an order no launcher could guess: KernelLaunch places them by name
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * strides[0] + cols * strides[1])
    tl.store(OUT + row * BLOCK + cols, x * scale)


def test_a_kernel_launch_places_arguments_by_name_and_takes_new_tensors_each_call():
    x = torch.randn(3, 8, device=DEVICE)
    out = torch.empty(3, 8, device=DEVICE)
    launch = KernelLaunch(_scale_rows, (3,), 1, ("X", "OUT"),
                          dict(strides=x.stride(), X=x, OUT=out, scale=2.0, BLOCK=8))
    launch(x, out)
    assert torch.equal(out, 2 * x)
    y, out2 = torch.randn(3, 8, device=DEVICE), torch.empty(3, 8, device=DEVICE)
    launch(y, out2)
    launch(y, out2)  # a second call of the same specialisation: the direct launch on a GPU (a 1-D grid, padded)
    assert torch.equal(out2, 2 * y)
    assert launch.grid == (3, 1, 1)


@gpu_only
def test_launch_hooks_a_profiler_installs_see_every_direct_launch():
    """With no launch hook installed, a repeated launch calls Triton's launcher itself (no hook metadata built), and
    its results are right; a hook added to ``triton.knobs`` (as Proton adds its own) sends each launch back through
    Triton's runner, so it is called for every launch of a cached kernel, and no longer once it is removed."""
    hooks = getattr(getattr(triton, "knobs", None), "runtime", None)
    if not hasattr(getattr(hooks, "launch_enter_hook", None), "add"):
        pytest.skip("this Triton keeps no chain of launch hooks")
    x = torch.randn(3, 8, device=DEVICE)
    out = torch.empty(3, 8, device=DEVICE)
    launch = KernelLaunch(_scale_rows, (3,), 1, ("X", "OUT"),
                          dict(strides=x.stride(), X=x, OUT=out, scale=2.0, BLOCK=8))
    for _ in range(3):
        launch(x, out)  # compiled, then launched directly without hooks
    assert torch.equal(out, 2 * x)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"] if hasattr(metadata, "get") else metadata)

    hooks.launch_enter_hook.add(hook)
    try:
        for _ in range(3):
            y = torch.randn(3, 8, device=DEVICE)
            launch(y, out)
            assert torch.equal(out, 2 * y)
    finally:
        hooks.launch_enter_hook.remove(hook)
    launch(x, out)
    torch.cuda.synchronize()
    assert seen == ["_scale_rows"] * 3


@triton.jit
def _double_rows(x, out, BLOCK: tl.constexpr):
    # x and out: (tensor, strides) pairs, as the fused kernels take their tensors
    X, x_strides = x
    OUT, out_strides = out
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    values = tl.load(X + row * x_strides[0] + cols * x_strides[1])
    tl.store(OUT + row * out_strides[0] + cols * out_strides[1], values * 2)


def _rows_at(offset: int) -> torch.Tensor:
    """A (4, 8) float32 view ``offset`` elements into its buffer: 16-byte aligned at offset 0, not at offset 1."""
    return torch.randn(4 * 8 + offset, device=DEVICE)[offset:].view(4, 8)


def test_a_kernel_launch_places_values_inside_tuple_arguments_and_keys_on_their_alignment():
    # A per-call value named (parameter, index) goes inside a tuple argument. Triton compiles an aligned pointer into
    # wide vector loads, wherever it sits: a misaligned tensor in the same place must get a runner of its own (on a
    # GPU, a runner compiled for the aligned one would fault or read wrong values), however the calls alternate.
    aligned, out = _rows_at(0), _rows_at(0)
    launch = KernelLaunch(_double_rows, (4,), 1, (("x", 0), ("out", 0)),
                          dict(x=(aligned, aligned.stride()), out=(out, out.stride()), BLOCK=8))
    for offset in (0, 0, 1, 1, 0, 1):  # the first launch of each alignment compiles, the next ones run directly
        x, y = _rows_at(offset), _rows_at(offset)
        launch(x, y)
        assert torch.equal(y, 2 * x), f"offset {offset}"
    launch()  # no values: the plan's own tensors
    assert torch.equal(out, 2 * aligned)


def test_a_kernel_launch_reports_its_registers_without_running():
    # the model counts the programs an SM holds from the compiled kernel's registers (docs/tuning.md): compiled and
    # loaded for the call's tensors, nothing written; under the interpreter nothing is compiled
    x = torch.randn(3, 8, device=DEVICE)
    out = torch.full((3, 8), 7.0, device=DEVICE)
    launch = KernelLaunch(_scale_rows, (3,), 1, ("X", "OUT"),
                          dict(strides=x.stride(), X=x, OUT=out, scale=2.0, BLOCK=8))
    count = launch.registers((x, out))
    assert torch.equal(out, torch.full((3, 8), 7.0, device=DEVICE))
    if ropekit.device.INTERPRET:
        assert count is None
    else:
        assert isinstance(count, int) and 1 <= count <= 255 and launch.registers((x, out)) == count
        launch(x, out)  # the launch runs the kernel it compiled
        assert torch.equal(out, 2 * x)
