"""Inputs that look valid but are not what the kernels were first written for: every tensor argument as a view
(strided, expanded, a slice of a larger buffer), hostile index values, aliasing, autograd's version counter, edge
shapes and meta tensors. Each output is compared with the float64 reference, and memory outside the outputs is
compared bit for bit (guard regions)."""

import threading

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE, gpu_only

HEAD_DIM = 32


def table(rows=64, rotary_dim=HEAD_DIM):
    return ropekit.cos_sin_table(rows, rotary_dim, device=DEVICE)


def in_guarded_buffer(x: torch.Tensor, pad: int = 37) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of ``x`` that is a slice of a larger buffer filled with a sentinel: (view, buffer)."""
    buffer = torch.full((x.numel() + 2 * pad,), 12345.0, dtype=x.dtype, device=x.device)
    view = buffer[pad:pad + x.numel()].view(x.shape)
    view.copy_(x)
    return view, buffer


def outside(view: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    start = view.data_ptr() - buffer.data_ptr()
    start //= buffer.element_size()
    return torch.cat((buffer[:start], buffer[start + view.numel():]))


# --------------------------------------------------------------------------------------------------------------------
# Every tensor the kernel reads carries its own strides.
# --------------------------------------------------------------------------------------------------------------------

def _table_views(cos, sin):
    wide_cos = torch.cat((cos, torch.randn_like(cos)), dim=1)
    wide_sin = torch.cat((torch.randn_like(sin), sin), dim=1)
    return {
        "sin-column-slice": (cos, wide_sin[:, sin.shape[1]:]),
        "cos-column-slice": (wide_cos[:, :cos.shape[1]], sin),
        "both-slices-differently": (wide_cos[:, :cos.shape[1]], wide_sin[:, sin.shape[1]:]),
        "sin-transposed-copy": (cos, sin.t().contiguous().t()),
        "row-slice": (torch.cat((cos, cos))[cos.shape[0]:], sin),
    }


@pytest.mark.parametrize("view", ["sin-column-slice", "cos-column-slice", "both-slices-differently",
                                  "sin-transposed-copy", "row-slice"])
def test_cos_sin_with_their_own_strides(view):
    cos, sin = table()
    cos_v, sin_v = _table_views(cos, sin)[view]
    q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
    k = torch.randn(2, 5, 1, HEAD_DIM, device=DEVICE)
    offsets = torch.tensor([3, 11], device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, k, cos_v, sin_v, positions=offsets)
    pos = ref.token_positions(2, 5, offsets=offsets.cpu())
    assert_close_to_reference(out_q, ref.rope(q, pos))
    assert_close_to_reference(out_k, ref.rope(k, pos))


def test_per_token_rows_with_their_own_strides():
    ids = torch.randint(0, 64, (2, 5))
    cos, sin = _rows(ids)
    cos, sin = cos.float(), sin.float()
    sin_slice = torch.cat((torch.randn_like(sin), sin), dim=-1)[..., HEAD_DIM:]  # a slice of a wider buffer
    q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
    out_q, _ = ropekit.apply_rope(q, None, cos, sin_slice, per_token=True)
    assert_close_to_reference(out_q, ref.rope(q, ids))
    out_q, _ = ropekit.apply_rope(q, None, cos[:1].expand(2, 5, HEAD_DIM), sin_slice[:1].expand(2, 5, HEAD_DIM),
                                  per_token=True)
    assert_close_to_reference(out_q, ref.rope(q, ids[:1].expand(2, 5)))


@pytest.mark.parametrize("view", ["strided", "expanded", "slice-of-larger"])
def test_position_ids_and_offsets_as_views(view):
    cos, sin = table()
    q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
    ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    offsets = torch.tensor([4, 9], device=DEVICE)
    if view == "strided":
        ids_v = torch.stack((ids, ids), dim=-1)[..., 0]
        offsets_v = torch.stack((offsets, offsets), dim=-1)[:, 1]
    elif view == "expanded":
        ids = ids[:1].expand(2, 5)
        ids_v = ids
        offsets = offsets[:1].expand(2)
        offsets_v = offsets
    else:
        ids_v = torch.cat((ids.flatten(), ids.flatten()))[10:].view(2, 5)
        offsets_v = torch.cat((offsets, offsets))[2:]
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids_v)
    assert_close_to_reference(out, ref.rope(q, ids.cpu()))
    out, _ = ropekit.apply_rope(q, None, cos, sin, positions=offsets_v)
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(2, 5, offsets=offsets.cpu())))


@pytest.mark.parametrize("view", ["strided", "slice-of-larger", "int32-strided"])
def test_cu_seqlens_as_views(view):
    cos, sin = table()
    cu = torch.tensor([0, 3, 7, 12], device=DEVICE)
    if view == "strided":
        cu_v = torch.stack((cu, cu + 100), dim=-1)[:, 0]
    elif view == "slice-of-larger":
        cu_v = torch.cat((torch.tensor([99, 98], device=DEVICE), cu))[2:]
    else:
        cu_v = torch.stack((cu, cu), dim=-1).to(torch.int32)[:, 1]
    assert view == "slice-of-larger" or not cu_v.is_contiguous()
    q = torch.randn(12, 3, HEAD_DIM, device=DEVICE)
    out, _ = ropekit.apply_rope(q, None, cos, sin, layout="thd", cu_seqlens=cu_v, max_seqlen=5)
    assert_close_to_reference(out, ref.rope(q[None], ref.varlen_positions(cu.cpu())[None])[0])


# --------------------------------------------------------------------------------------------------------------------
# No write outside a tensor, whatever the index tensors hold.
# --------------------------------------------------------------------------------------------------------------------

HOSTILE_CU = {
    "ends-past-tokens": [0, 3, 7, 40],
    "starts-negative": [-5, 3, 7, 12],
    "decreasing": [0, 9, 4, 12],
    "huge": [0, 3, 2**40, 12],
}


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("cu_name", list(HOSTILE_CU))
def test_hostile_cu_seqlens_touch_nothing_outside(cu_name, inplace):
    cos, sin = table()
    cu = torch.tensor(HOSTILE_CU[cu_name], device=DEVICE)
    q, q_buf = in_guarded_buffer(torch.randn(12, 3, HEAD_DIM, device=DEVICE))
    k, k_buf = in_guarded_buffer(torch.randn(12, 1, HEAD_DIM, device=DEVICE))
    q_outside, k_outside = outside(q, q_buf).clone(), outside(k, k_buf).clone()
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=12, inplace=inplace)
    assert torch.equal(outside(q, q_buf), q_outside) and torch.equal(outside(k, k_buf), k_outside)
    assert out_q.shape == q.shape and out_k.shape == k.shape


@pytest.mark.parametrize("positions", ["beyond-table", "negative"])
def test_hostile_positions_touch_nothing_outside_and_come_out_nan(positions):
    cos, sin = table(16)
    value = 10**9 if positions == "beyond-table" else -3
    q, q_buf = in_guarded_buffer(torch.randn(2, 4, 3, HEAD_DIM, device=DEVICE))
    q_outside = outside(q, q_buf).clone()
    ids = torch.full((2, 4), value, device=DEVICE)
    ropekit.apply_rope(q, None, cos, sin, positions=ids, inplace=True)
    assert torch.equal(outside(q, q_buf), q_outside)
    assert torch.isnan(q).all()


def test_check_mode_refuses_hostile_cu_seqlens(monkeypatch):
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    cos, sin = table()
    q = torch.randn(12, 3, HEAD_DIM, device=DEVICE)
    before = q.clone()
    with pytest.raises(ValueError, match="cu_seqlens"):
        ropekit.apply_rope(q, None, cos, sin, layout="thd", cu_seqlens=torch.tensor([0, 3, 40], device=DEVICE),
                           max_seqlen=37, inplace=True)
    assert torch.equal(q, before)


# --------------------------------------------------------------------------------------------------------------------
# In place: PyTorch's rules.
# --------------------------------------------------------------------------------------------------------------------

def test_in_place_refuses_k_overlapping_q():
    cos, sin = table()
    q = torch.randn(2, 5, 4, HEAD_DIM, device=DEVICE)
    before = q.clone()
    with pytest.raises(RuntimeError, match="single memory location"):
        ropekit.apply_rope(q, q[:, :, 1:3], cos, sin, inplace=True)
    assert torch.equal(q, before)


@pytest.mark.parametrize("view", ["as_strided-rows-overlap", "expanded"])
def test_in_place_refuses_self_overlapping_views(view):
    cos, sin = table()
    base = torch.randn(400, device=DEVICE)
    if view == "expanded":
        q = base[:HEAD_DIM].view(1, 1, 1, HEAD_DIM).expand(2, 3, 1, HEAD_DIM)
    else:
        q = base.as_strided((2, 3, 1, HEAD_DIM), (3 * 8, 8, HEAD_DIM, 1))  # tokens 8 apart, heads 32 wide
    before = base.clone()
    with pytest.raises(RuntimeError, match="single memory location"):
        ropekit.apply_rope(q, None, cos, sin, inplace=True)
    assert torch.equal(base, before)


def test_in_place_on_slices_of_a_packed_qkv_is_fine():
    cos, sin = table()
    hq, hk = 4, 2
    qkv = torch.randn(9, (hq + 2 * hk) * HEAD_DIM, device=DEVICE)
    want = qkv.clone()
    q = qkv[:, :hq * HEAD_DIM].view(9, hq, HEAD_DIM)
    k = qkv[:, hq * HEAD_DIM:(hq + hk) * HEAD_DIM].view(9, hk, HEAD_DIM)
    cu = torch.tensor([0, 4, 9], device=DEVICE)
    ropekit.apply_rope(q, k, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=5, inplace=True)
    pos = ref.varlen_positions(cu.cpu())[None]
    assert_close_to_reference(q, ref.rope(want[:, :hq * HEAD_DIM].view(1, 9, hq, HEAD_DIM), pos)[0])
    assert_close_to_reference(k, ref.rope(want[:, hq * HEAD_DIM:(hq + hk) * HEAD_DIM].view(1, 9, hk, HEAD_DIM),
                                          pos)[0])
    assert torch.equal(qkv[:, (hq + hk) * HEAD_DIM:], want[:, (hq + hk) * HEAD_DIM:])  # v untouched


def test_in_place_bumps_the_version_counter_so_autograd_notices():
    cos, sin = table()
    w = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE, requires_grad=True)
    x = w * 2
    y = x.exp()  # saves its output for backward
    version = y._version
    with torch.no_grad():
        ropekit.apply_rope(y, None, cos, sin, inplace=True)
    assert y._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_in_place_bumps_the_version_counter_on_the_cached_plan_path():
    cos, sin = table()
    for _ in range(3):  # the second and third calls take the cached plan
        q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
        version = q._version
        ropekit.apply_rope(q, None, cos, sin, positions=1, inplace=True)
        assert q._version > version


# --------------------------------------------------------------------------------------------------------------------
# Edge shapes and meta tensors.
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("heads", [(0, 2), (2, 0), (0, 0)], ids=["q0-k2", "q2-k0", "q0-k0"])
def test_zero_heads_on_either_side(heads, inplace):
    cos, sin = table()
    q = torch.randn(2, 5, heads[0], HEAD_DIM, device=DEVICE)
    k = torch.randn(2, 5, heads[1], HEAD_DIM, device=DEVICE)
    q_in, k_in = q.clone(), k.clone()
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, inplace=inplace)
    pos = ref.token_positions(2, 5)
    assert_close_to_reference(out_q, ref.rope(q_in, pos))
    assert_close_to_reference(out_k, ref.rope(k_in, pos))


@pytest.mark.parametrize("shape", [(0, 5, 3, HEAD_DIM), (2, 0, 3, HEAD_DIM)], ids=["zero-batch", "zero-tokens"])
def test_zero_batch_and_zero_tokens(shape):
    cos, sin = table()
    q = torch.randn(shape, device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, q.clone(), cos, sin)
    assert out_q.shape == shape and out_k.shape == shape


def test_zero_tokens_varlen():
    cos, sin = table()
    q = torch.randn(0, 3, HEAD_DIM, device=DEVICE)
    out, _ = ropekit.apply_rope(q, None, cos, sin, layout="thd", cu_seqlens=torch.zeros(3, dtype=torch.int64,
                                                                                           device=DEVICE), max_seqlen=0)
    assert out.shape == q.shape


def test_one_element_table():
    cos, sin = table(1, 2)
    q = torch.randn(1, 1, 2, 2, device=DEVICE)
    out, _ = ropekit.apply_rope(q, None, cos, sin)
    assert_close_to_reference(out, ref.rope(q, ref.token_positions(1, 1)))


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd", "thd"])
def test_meta_tensors_give_shapes_without_data(layout):
    shapes = {"thd": ((12, 4, HEAD_DIM), (12, 1, HEAD_DIM)), "bshd": ((2, 6, 4, HEAD_DIM), (2, 6, 1, HEAD_DIM)),
              "sbhd": ((6, 2, 4, HEAD_DIM), (6, 2, 1, HEAD_DIM)), "bhsd": ((2, 4, 6, HEAD_DIM), (2, 1, 6, HEAD_DIM))}
    q, k = (torch.empty(shape, device="meta", dtype=torch.bfloat16) for shape in shapes[layout])
    cos, sin = (torch.empty(64, HEAD_DIM // 2, device="meta") for _ in range(2))
    extra = dict(cu_seqlens=torch.empty(3, dtype=torch.int64, device="meta"), max_seqlen=6) if layout == "thd" else {}
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, layout=layout, **extra)
    assert out_q.device.type == "meta" and out_q.shape == q.shape and out_q.dtype == q.dtype
    assert out_k.shape == k.shape and out_q.is_contiguous()


def test_rotary_embedding_meta_call_changes_no_state():
    rope = ropekit.RotaryEmbedding(head_dim=HEAD_DIM)
    device_before, rows_before = rope.table.cos.device, len(rope.table)
    q = torch.empty(2, 6, 4, HEAD_DIM, device="meta")
    out_q, _ = rope(q)
    assert out_q.shape == q.shape and out_q.device.type == "meta"
    assert rope.table.cos.device == device_before and len(rope.table) == rows_before
    real = torch.randn(2, 6, 4, HEAD_DIM, device=DEVICE)
    assert_close_to_reference(rope(real)[0], ref.rope(real, ref.token_positions(2, 6)))


# --------------------------------------------------------------------------------------------------------------------
# Per-token rows, ambiguous positions.
# --------------------------------------------------------------------------------------------------------------------

def _rows(ids, rotary_dim=HEAD_DIM):
    theta = ref.angles(ids, ropekit.inverse_frequencies(rotary_dim, 10000.0))
    return (torch.cat((theta.cos(), theta.cos()), -1).to(DEVICE), torch.cat((theta.sin(), theta.sin()), -1).to(DEVICE))


def test_per_token_rows_refuse_a_smaller_rotary_dim():
    cos, sin = _rows(torch.randint(0, 64, (2, 5)))
    q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="rotary_dim"):
        ropekit.apply_rope(q, None, cos.float(), sin.float(), per_token=True, rotary_dim=HEAD_DIM // 2)


def test_check_mode_refuses_per_token_rows_with_unequal_halves(monkeypatch):
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    cos, sin = _rows(torch.randint(0, 64, (2, 5)))
    cos = cos.clone()
    cos[..., 0] += 0.5
    q = torch.randn(2, 5, 3, HEAD_DIM, device=DEVICE)
    with pytest.raises(ValueError, match="per-token cos rows"):
        ropekit.apply_rope(q, None, cos.float(), sin.float(), per_token=True)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_backward_is_exact_for_per_token_rows_with_unequal_halves(interleaved):
    # Not a rotation, but the forward is the eager formula; its backward must be that formula's transpose.
    generator = torch.Generator().manual_seed(0)
    cos = torch.randn(1, 3, 8, generator=generator, dtype=torch.float64).to(DEVICE)
    sin = torch.randn(1, 3, 8, generator=generator, dtype=torch.float64).to(DEVICE)
    q = torch.randn(1, 3, 2, 8, generator=generator, dtype=torch.float64).to(DEVICE).requires_grad_()
    fn = lambda x: ropekit.apply_rope(x, None, cos, sin, per_token=True, interleaved=interleaved)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q,))
    assert_close_to_reference(fn(q), ref.rope_from_cos_sin(q, cos[:, :, None], sin[:, :, None],
                                                           interleaved=interleaved))


def test_thd_positions_of_ambiguous_length_need_the_callers_choice():
    cos, sin = table()
    cu = torch.tensor([0, 0, 2, 3], device=DEVICE)  # 3 sequences, 3 tokens: offsets or ids?
    q = torch.randn(3, 2, HEAD_DIM, device=DEVICE)
    values = torch.tensor([5, 7, 9], device=DEVICE)
    with pytest.raises(ValueError, match="ambiguous"):
        ropekit.apply_rope(q, None, cos, sin, positions=values, layout="thd", cu_seqlens=cu, max_seqlen=2)
    as_ids, _ = ropekit.apply_rope(q, None, cos, sin, positions=values[None], layout="thd", cu_seqlens=cu,
                                   max_seqlen=2)
    assert_close_to_reference(as_ids, ref.rope(q[None], values.cpu()[None])[0])
    as_offsets, _ = ropekit.apply_rope(q, None, cos, sin, positions=values[:, None], layout="thd", cu_seqlens=cu,
                                       max_seqlen=2)
    pos = ref.varlen_positions(cu.cpu(), offsets=values.cpu())
    assert_close_to_reference(as_offsets, ref.rope(q[None], pos[None])[0])


# --------------------------------------------------------------------------------------------------------------------
# Threads.
# --------------------------------------------------------------------------------------------------------------------

def _concurrent_matches_serial(n_threads: int, calls: int, shape) -> None:
    cos, sin = ropekit.cos_sin_table(8192, shape[-1], device=DEVICE)
    inputs = [torch.randn(shape, device=DEVICE, dtype=torch.bfloat16) for _ in range(n_threads)]
    offsets = [torch.randint(0, 4000, (shape[0],), device=DEVICE) for _ in range(n_threads)]
    serial = [ropekit.apply_rope(x, None, cos, sin, positions=p)[0] for x, p in zip(inputs, offsets)]
    results, errors = [None] * n_threads, []

    def work(i):
        try:
            for _ in range(calls):
                results[i] = ropekit.apply_rope(inputs[i], None, cos, sin, positions=offsets[i])[0]
            if DEVICE == "cuda":
                torch.cuda.current_stream().synchronize()
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(torch.equal(a, b) for a, b in zip(serial, results))


def test_threads_on_the_interpreter_are_serialised_and_correct():
    _concurrent_matches_serial(4, 3, (2, 4, 2, HEAD_DIM))


@gpu_only
def test_threads_on_the_gpu_give_bit_identical_results():
    _concurrent_matches_serial(8, 20, (4, 512, 8, 128))


# --------------------------------------------------------------------------------------------------------------------
# torch.compile keeps both promises.
# --------------------------------------------------------------------------------------------------------------------

def test_compiled_validation_errors_stay_value_errors():
    cos, sin = table()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: ropekit.apply_rope(x, None, cos, sin, rotary_dim=33)[0])
    with pytest.raises(ValueError, match="rotary_dim"):
        compiled(torch.randn(1, 4, 2, HEAD_DIM, device=DEVICE))


def test_compiled_in_place_bumps_the_version_counter():
    cos, sin = table()
    torch._dynamo.reset()

    @torch.compile
    def rotate_in_place(y):
        ropekit.apply_rope(y, None, cos, sin, inplace=True)
        return y

    w = torch.randn(1, 4, 2, HEAD_DIM, device=DEVICE, requires_grad=True)
    y = (w * 2).exp()
    with torch.no_grad():
        rotate_in_place(y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
