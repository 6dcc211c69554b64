"""The native backend (ropekit.native) against the Triton kernels and the float64 reference: the same bits wherever the
order of operations is fixed, the same validation, the same cache semantics; and how a process picks its backend."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE, ON_GPU

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


def on(backend, fn):
    """``fn()`` with ``backend`` the default (the fused ops take no backend argument)."""
    with ropekit.device.set_backend(backend):
        return fn()


def same_bits(a, b) -> bool:
    """Equal bit for bit, signed zeros and infinities included (any NaN matches any NaN)."""
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    nan = a.float().isnan()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(nan, b.float().isnan()) and torch.equal(a.view(ints)[~nan], b.view(ints)[~nan])


def as_the_kernel(native, kernel) -> bool:
    """The same bits as the kernel where the order of operations is the kernel's: under the interpreter. A GPU build
    of the kernel contracts ``a * cos - b * sin`` into one FMA (one rounding fewer than PyTorch's two products and a
    sum), so there the values agree within one rounding of the output dtype at the largest value, NaNs in the same
    places, and anything the kernel copies or leaves untouched still bit for bit."""
    if not ON_GPU or native is None or kernel is None or same_bits(native, kernel):
        return same_bits(native, kernel)
    if native.dtype != kernel.dtype or native.shape != kernel.shape:
        return False
    a, b = native.detach().float().cpu(), kernel.detach().float().cpu()
    nan = b.isnan()
    if not torch.equal(a.isnan(), nan):
        return False
    finite = b[~nan]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return bool(((a[~nan] - finite).abs() <= torch.finfo(native.dtype).eps * scale).all())


def close_to_the_kernel(native, kernel):
    """With QK-norm: the sum of squares is summed in another order, so the root differs by a rounding, and the
    rotation's difference of products may cancel: within 2 units in the last place of the largest value."""
    nan = kernel.isnan()
    assert torch.equal(native.isnan(), nan)
    atol = 2 * torch.finfo(kernel.dtype).eps * float(kernel[~nan].abs().max())
    torch.testing.assert_close(native[~nan], kernel[~nan], rtol=0, atol=atol)


def both(call):
    """``call(backend)`` on the native backend and on the Triton kernels (fresh inputs each: ``call`` builds them)."""
    return call("native"), call("triton")


# --------------------------------------------------------------------------------------------------------------------
# apply_rope: every switch, bit for bit, and against the float64 reference.
# --------------------------------------------------------------------------------------------------------------------

POSITIONS = {
    "none": lambda b, s: (None, ref.token_positions(b, s)),
    "int": lambda b, s: (7, ref.token_positions(b, s, offsets=7)),
    "offsets": lambda b, s: (torch.tensor([3, 50])[:b], ref.token_positions(b, s, offsets=torch.tensor([3, 50])[:b])),
    "ids": lambda b, s: (torch.tensor([[0, 9, 2, 63, 5], [4, 4, 1, 0, 30]])[:b, :s],
                         torch.tensor([[0, 9, 2, 63, 5], [4, 4, 1, 0, 30]])[:b, :s]),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("conjugate", [False, True], ids=["forward", "conjugate"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("positions", list(POSITIONS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_apply_rope_native_equals_the_kernel_bit_for_bit(dtype, positions, interleaved, rotary, conjugate, inplace):
    dtype = DTYPES[dtype]
    rotary_dim = 32 if rotary == "full" else 16
    cos, sin = ropekit.cos_sin_table(64, rotary_dim, device=DEVICE)
    q = torch.randn(2, 5, 4, 32, device=DEVICE).to(dtype)
    k = torch.randn(2, 5, 2, 32, device=DEVICE).to(dtype)  # GQA
    arg, pos = POSITIONS[positions](2, 5)
    arg = arg.to(DEVICE) if isinstance(arg, torch.Tensor) else arg

    def call(backend):
        x, y = q.clone(), k.clone()
        return ropekit.apply_rope(x, y, cos, sin, positions=arg, interleaved=interleaved, rotary_dim=rotary_dim,
                                  conjugate=conjugate, inplace=inplace, backend=backend)

    (nq, nk), (tq, tk) = both(call)
    assert as_the_kernel(nq, tq) and as_the_kernel(nk, tk)
    if not conjugate and positions != "offsets":  # (offset 50 runs past the 64-row table: NaN, checked below)
        kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
        assert_close_to_reference(nq, ref.rope(q, pos, **kw))
        assert_close_to_reference(nk, ref.rope(k, pos, **kw))


def test_positions_outside_the_table_come_out_nan_on_both_backends():
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    q = torch.randn(1, 3, 2, 32, device=DEVICE)
    ids = torch.tensor([[-1, 2, 8]], device=DEVICE)
    for backend in ropekit.device.BACKENDS:
        out, _ = ropekit.apply_rope(q, None, cos, sin, positions=ids, backend=backend)
        assert out[0, [0, 2], :, :16].isnan().all() and torch.isfinite(out[0, 1]).all()
        assert torch.equal(out[..., 16:], q[..., 16:])  # the tail is still copied


@pytest.mark.parametrize("positions", ["none", "offsets", "ids"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_varlen_native_equals_the_kernel(dtype, positions):
    dtype = DTYPES[dtype]
    cos, sin = ropekit.cos_sin_table(64, 32, device=DEVICE)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=DEVICE)  # an empty sequence in the middle
    q = torch.randn(8, 4, 32, device=DEVICE).to(dtype)
    arg = {"none": None, "offsets": torch.tensor([[5], [0], [20]], device=DEVICE),
           "ids": torch.randint(0, 64, (1, 8), device=DEVICE)}[positions]
    (nq, _), (tq, _) = both(lambda backend: ropekit.apply_rope(q, None, cos, sin, positions=arg, layout="thd",
                                                                 cu_seqlens=cu, max_seqlen=5, backend=backend))
    assert as_the_kernel(nq, tq)
    pos = {"none": ref.varlen_positions(cu),
           "offsets": ref.varlen_positions(cu, offsets=torch.tensor([5, 0, 20])),
           "ids": arg[0].cpu() if arg is not None else None}[positions]
    assert_close_to_reference(nq, ref.rope(q, pos))


def test_varlen_rows_no_sequence_covers_are_left_as_they_were_in_place():
    cos, sin = ropekit.cos_sin_table(64, 32, device=DEVICE)
    cu = torch.tensor([0, 4, 2, 6], dtype=torch.int64, device=DEVICE)  # decreasing: rows 6 and 7 are covered by none
    q = torch.randn(8, 2, 32, device=DEVICE)
    outs = [ropekit.apply_rope(q.clone(), None, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=4, inplace=True,
                               backend=backend)[0] for backend in ropekit.device.BACKENDS]
    for out in outs:
        assert torch.equal(out[6:], q[6:]) and not torch.equal(out[1:4], q[1:4])
    assert as_the_kernel(outs[0][:2], outs[1][:2])  # rows 2..5 are covered twice (a race on the GPU): not compared


@pytest.mark.parametrize("eager_rounding", [False, True], ids=["one-rounding", "eager-rounding"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_per_token_rows_native_equals_the_kernel(dtype, interleaved, eager_rounding):
    dtype = DTYPES[dtype]
    q = torch.randn(2, 5, 4, 32, device=DEVICE).to(dtype)
    theta = ref.angles(torch.randint(0, 100, (2, 5)), ropekit.inverse_frequencies(32))
    theta = theta.repeat_interleave(2, -1) if interleaved else torch.cat((theta, theta), -1)
    cos, sin = theta.cos().to(DEVICE, dtype), theta.sin().to(DEVICE, dtype)
    (nq, _), (tq, _) = both(lambda backend: ropekit.apply_rope(q, None, cos, sin, per_token=True,
                                                                 interleaved=interleaved,
                                                                 eager_rounding=eager_rounding, backend=backend))
    assert as_the_kernel(nq, tq)


def test_autograd_through_the_native_path_matches_the_kernel_and_passes_gradcheck():
    cos, sin = ropekit.cos_sin_table(16, 8, device=DEVICE, dtype=torch.float64)
    q = torch.randn(1, 3, 2, 8, device=DEVICE, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ropekit.apply_rope(x, None, cos, sin, backend="native")[0], (q,))
    grads = []
    for backend in ropekit.device.BACKENDS:
        x = q.detach().float().requires_grad_()
        out, _ = ropekit.apply_rope(x, None, cos.float(), sin.float(), positions=2, backend=backend)
        (out * torch.arange(out.numel(), device=out.device).reshape(out.shape)).sum().backward()
        grads.append(x.grad)
    assert as_the_kernel(*grads)


def test_validation_errors_are_the_same_on_both_backends(backend):
    cos, sin = ropekit.cos_sin_table(8, 32, device=DEVICE)
    q = torch.randn(1, 4, 2, 32, device=DEVICE)
    before = q.clone()
    with pytest.raises(ValueError, match="positions reach 11 but the cos/sin table has 8 rows"):
        ropekit.apply_rope(q, None, cos, sin, positions=8, inplace=True)
    with pytest.raises(ValueError, match="rotary_dim"):
        ropekit.qk_norm_rope(q, None, cos, sin, torch.ones(32, device=DEVICE), rotary_dim=3)
    with pytest.raises(RuntimeError, match="single memory location"):
        ropekit.apply_rope(q.expand(2, 4, 2, 32), None, cos, sin, inplace=True)
    assert torch.equal(q, before)


# --------------------------------------------------------------------------------------------------------------------
# The fused ops: QK-norm, the cache writes (slot -1, out-of-range, float8), MLA.
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weight_offset", [0.0, 1.0], ids=["qwen3", "gemma"])
@pytest.mark.parametrize("rotary", ["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_qk_norm_rope_native_matches_the_kernel_and_the_reference(dtype, interleaved, rotary, weight_offset):
    dtype = DTYPES[dtype]
    rotary_dim = 32 if rotary == "full" else 16
    cos, sin = ropekit.cos_sin_table(64, rotary_dim, device=DEVICE)
    q = torch.randn(2, 5, 4, 32, device=DEVICE).to(dtype)
    k = torch.randn(2, 5, 2, 32, device=DEVICE).to(dtype)
    w_q, w_k = (0.1 * torch.randn(32, device=DEVICE) + (0 if weight_offset else 1) for _ in range(2))
    ids = torch.randint(0, 64, (2, 5), device=DEVICE)
    (nq, nk), (tq, tk) = both(lambda backend: on(backend, lambda: ropekit.qk_norm_rope(
        q, k, cos, sin, w_q, w_k, positions=ids, interleaved=interleaved, weight_offset=weight_offset)))
    for native, kernel, x, w in ((nq, tq, q, w_q), (nk, tk, k, w_k)):
        close_to_the_kernel(native, kernel)
        half = rotary_dim // 2
        want = ref.rms_norm(x, w, eps=1e-6, weight_offset=weight_offset)
        rotated = ref.rope_table(want[..., :rotary_dim], cos[:, :half], sin[:, :half], ids.cpu(),
                                 interleaved=interleaved)
        assert_close_to_reference(native, torch.cat((rotated, want[..., rotary_dim:]), -1))


def test_qk_norm_rope_backward_native_matches_the_kernel():
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    q0, k0 = torch.randn(2, 3, 4, 32, device=DEVICE), torch.randn(2, 3, 2, 32, device=DEVICE)
    w0 = 1 + 0.1 * torch.randn(32, device=DEVICE)

    def grads(backend):
        q, k, w_q, w_k = (t.clone().requires_grad_() for t in (q0, k0, w0, w0))
        out_q, out_k = on(backend, lambda: ropekit.qk_norm_rope(q, k, cos, sin, w_q, w_k, positions=3))
        (out_q.square().sum() + out_k.sum()).backward()
        return q.grad, k.grad, w_q.grad, w_k.grad

    for native, kernel in zip(*both(grads)):
        torch.testing.assert_close(native, kernel, rtol=1e-5, atol=1e-5)


def _cache_call(dtype, fp8: bool, paged: bool, norm: bool):
    """A rope_and_cache call with hostile addressing: slot -1, a slot past the cache, a mapping shorter than the
    tokens (paged); an offset running past the cache's rows (contiguous); values past e4m3's range."""
    cos, sin = ropekit.cos_sin_table(64, 16, device=DEVICE)
    q = torch.randn(2, 3, 4, 32, device=DEVICE).to(dtype)
    k = (100 * torch.randn(2, 3, 2, 32, device=DEVICE)).to(dtype)
    v = torch.randn(2, 3, 2, 32, device=DEVICE).to(dtype)
    v[0, 0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e-6])
    cache_dtype = torch.float8_e4m3fn if fp8 else dtype
    shape = (4, 4, 2, 32) if paged else (2, 5, 2, 32)
    k_cache = torch.randn(shape, device=DEVICE).to(cache_dtype)
    v_cache = torch.randn(shape, device=DEVICE).to(cache_dtype)
    scale = torch.tensor([0.25], device=DEVICE)
    where = dict(slot_mapping=torch.tensor([5, -1, 0, 99, 15], device=DEVICE)) if paged else dict(
        cache_offsets=torch.tensor([1, 4], device=DEVICE))
    weights = dict(q_weight=torch.rand(32, device=DEVICE) + 0.5, k_weight=torch.rand(32, device=DEVICE) + 0.5) \
        if norm else {}

    def call(backend):
        kc, vc = k_cache.clone(), v_cache.clone()
        out_q, out_k = on(backend, lambda: ropekit.rope_and_cache(
            q, k, v, cos, sin, k_cache=kc, v_cache=vc, positions=torch.tensor([[1, 2, 70], [0, 5, 9]], device=DEVICE),
            k_scale=scale, v_scale=scale, write_k=True, **where, **weights))
        return out_q, out_k, kc, vc

    return call, (k_cache, v_cache)


@pytest.mark.parametrize("norm", [False, True], ids=["rope", "norm-rope"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("cache", ["fp32", "bf16", "fp8"])
def test_rope_and_cache_native_writes_the_kernels_cache(cache, paged, norm):
    dtype = torch.bfloat16 if cache == "bf16" else torch.float32
    call, (k_before, v_before) = _cache_call(dtype, cache == "fp8", paged, norm)
    native, kernel = both(call)
    for a, b in zip(native, kernel):
        if norm and a.dtype != torch.float8_e4m3fn:
            close_to_the_kernel(a, b)
        else:
            assert as_the_kernel(a, b)
    k_cache, v_cache = native[2], native[3]
    if paged:  # slots 5, 0 and 15 written (tokens 0, 2 and 4); -1, 99 and the unmapped token 5 write nothing
        written = [5, 0, 15]
        untouched = [s for s in range(16) if s not in written]
        assert same_bits(k_cache.flatten(0, 1)[untouched], k_before.flatten(0, 1)[untouched])
        assert same_bits(v_cache.flatten(0, 1)[untouched], v_before.flatten(0, 1)[untouched])
    else:  # sequence 1 starts at row 4 of 5: its tokens 1 and 2 fall outside and write nothing
        assert same_bits(k_cache[0, [0, 4]], k_before[0, [0, 4]]) and same_bits(k_cache[1, :4], k_before[1, :4])
    if cache == "fp8":  # x / scale saturates at +-448 (PyTorch's own cast would give NaN), NaN stays NaN
        stored = v_cache.flatten(0, 1)[5, 0, :4].float() if paged else v_cache[0, 1, 0, :4].float()
        assert stored[:2].tolist() == [448.0, -448.0] and stored[2].isnan()


def test_float8_rounding_native_equals_the_kernels_integer_arithmetic():
    """Every special case of the e4m3 conversion: saturation, infinities, NaN, subnormals and their ties, signed zero,
    as a v cache write (v passes through untouched: only the conversion differs)."""
    specials = [0.0, -0.0, 447.9, 448.0, 464.0, 465.0, 1e6, float("inf"), -float("inf"), float("nan"), 2.0 ** -9,
                2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -6, 2.0 ** -6 * 1.0625, 1.0625, 1.1875, -0.3]
    values = torch.cat((torch.tensor(specials), torch.randn(110) * torch.logspace(-4, 3, 110)))[:128]
    v = values.reshape(1, 4, 1, 32).to(DEVICE)
    k = torch.randn(1, 4, 1, 32, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 32, device=DEVICE)

    def call(backend):
        kc = torch.zeros(1, 4, 1, 32, device=DEVICE, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        on(backend, lambda: ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=kc, v_cache=vc, cache_offsets=0,
                                                   k_scale=torch.ones(1, device=DEVICE),
                                                   v_scale=torch.ones(1, device=DEVICE)))
        return vc

    native, kernel = both(call)
    assert same_bits(native, kernel)
    assert torch.equal(native.float().nan_to_num(), ref.e4m3(v).float().nan_to_num())


def test_mla_rope_and_cache_native_equals_the_kernel():
    tokens, heads, rope_dim, latent = 5, 4, 16, 24
    q_pe = torch.randn(tokens, heads, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    k_pe = torch.randn(tokens, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    kv_c = torch.randn(tokens, latent, device=DEVICE, dtype=torch.bfloat16)
    cos_sin_cache = torch.randn(64, rope_dim, device=DEVICE)
    slots = torch.tensor([3, -1, 7, 0, 12], device=DEVICE)
    positions = torch.tensor([0, 5, 63, 64, 9], device=DEVICE)  # 64: outside the table

    def call(backend):
        cache = torch.zeros(4, 4, latent + rope_dim, device=DEVICE, dtype=torch.bfloat16)
        q, k = on(backend, lambda: ropekit.mla_rope_and_cache(q_pe.clone(), k_pe.clone(), kv_c, cache, slots,
                                                              positions, cos_sin_cache=cos_sin_cache))
        return q, k, cache

    for a, b in zip(*both(call)):
        assert as_the_kernel(a, b)


# --------------------------------------------------------------------------------------------------------------------
# Choosing the backend.
# --------------------------------------------------------------------------------------------------------------------

def test_set_backend_is_a_setting_and_a_context_manager():
    start = ropekit.device.default_backend()
    with ropekit.device.set_backend("native"):
        assert ropekit.device.default_backend() == "native" and os.environ["ROPEKIT_BACKEND"] == "native"
        with ropekit.device.set_backend("triton"):
            assert ropekit.device.default_backend() == "triton"
        assert ropekit.device.default_backend() == "native"
    assert ropekit.device.default_backend() == start
    with pytest.raises(ValueError, match="backend must be one of"):
        ropekit.device.set_backend("cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        ropekit.apply_rope(torch.zeros(1, 1, 1, 2), None, torch.ones(1, 1), torch.zeros(1, 1), backend="numpy")


def _cpu_calls():
    """apply_rope, qk_norm_rope (and its backward), rope_and_cache and mla_rope_and_cache on CPU tensors with no
    backend named, each beside the reference."""
    cos, sin = ropekit.cos_sin_table(64, 32)
    q, k, v = torch.randn(2, 5, 4, 32), torch.randn(2, 5, 2, 32), torch.randn(2, 5, 2, 32)
    at = ref.token_positions(2, 5, offsets=3)
    out_q, _ = ropekit.apply_rope(q, k, cos, sin, positions=3)
    assert_close_to_reference(out_q, ref.rope(q, at))
    w = torch.rand(32) + 0.5
    normed_q, _ = ropekit.qk_norm_rope(q, k, cos, sin, w, w, positions=3)
    assert_close_to_reference(normed_q, ref.rope(ref.rms_norm(q, w, eps=1e-6), at))
    leaf = q.double().requires_grad_()
    grad, = torch.autograd.grad(ropekit.qk_norm_rope(leaf, None, cos.double(), sin.double(), w.double(), None,
                                                     positions=3)[0].sum(), leaf)
    want_leaf = q.double().requires_grad_()
    want, = torch.autograd.grad(ref.rope(ref.rms_norm(want_leaf, w.double(), eps=1e-6), at).sum(), want_leaf)
    torch.testing.assert_close(grad, want)
    k_cache, v_cache = torch.zeros(4, 4, 2, 32), torch.zeros(4, 4, 2, 32)
    ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=torch.arange(10),
                           positions=3)
    assert torch.equal(v_cache.flatten(0, 1)[:10], v.flatten(0, 1))
    assert_close_to_reference(k_cache.flatten(0, 1)[:10].view(2, 5, 2, 32), ref.rope(k, at))
    q_pe, k_pe, latent = torch.randn(6, 4, 32), torch.randn(6, 32), torch.randn(6, 64)
    cache, slots, positions = torch.zeros(2, 4, 96), torch.arange(6), torch.arange(6) + 3
    q_out, _ = ropekit.mla_rope_and_cache(q_pe.clone(), k_pe.clone(), latent, cache, slots, positions, cos, sin)
    assert_close_to_reference(q_out, ref.rope(q_pe[None], positions[None], interleaved=True)[0])
    assert torch.equal(cache.flatten(0, 1)[:6, :64], latent)


def _no_kernel(*args, **kwargs):
    raise AssertionError("a call on CPU tensors reached the GPU's kernels")


@pytest.mark.skipif(not ON_GPU, reason="a machine whose kernels run on its GPU")
def test_cpu_tensors_on_a_gpu_machine_take_the_native_ops_and_a_named_kernel_refuses_them():
    """The default backend there is the kernels', which run on the GPU only: a call on CPU tensors takes the native
    ops instead; naming a kernel backend for them is refused by q's name."""
    assert ropekit.device.default_backend() == "triton"
    _cpu_calls()
    for backend in ("triton", "cuda"):
        with pytest.raises(ValueError, match="q is on cpu"):
            ropekit.apply_rope(torch.randn(1, 2, 2, 8), None, *ropekit.cos_sin_table(4, 8), backend=backend)


def test_cpu_tensors_take_the_native_ops_where_the_kernels_run_on_a_gpu(monkeypatch):
    """The same rule on a machine without a GPU, which that machine's settings stand in for: the kernels' backend,
    not interpreted, on a CUDA machine. The kernels' planners and launchers are replaced by a failure: every call
    must end in the native ops."""
    with ropekit.device.set_backend("triton"):
        monkeypatch.setattr(ropekit.device, "INTERPRET", False)
        monkeypatch.setattr(ropekit.device, "DEVICE", "cuda")
        for module, name in (("api", "rope_v4"), ("api", "plan_rope"), ("fused.qk_norm_rope", "launch_fused"),
                             ("fused.qk_norm_rope", "plan_fused"), ("fused.kv_cache", "plan_fused"),
                             ("fused.mla", "plan_fused")):
            monkeypatch.setattr(sys.modules[f"ropekit.{module}"], name, _no_kernel)
        assert ropekit.device.backend_for(torch.zeros(1)) == "native"
        assert ropekit.device.backend_for(torch.zeros(1, device="meta")) == "triton"
        _cpu_calls()
        with pytest.raises(ValueError, match="q is on cpu"):
            ropekit.apply_rope(torch.randn(1, 2, 2, 8), None, *ropekit.cos_sin_table(4, 8), backend="triton")

def _fresh_process(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter started as a user starts one (neither variable inherited from this process)."""
    base = {name: value for name, value in os.environ.items() if name not in ("TRITON_INTERPRET", "ROPEKIT_BACKEND")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**base, **env})


@pytest.mark.skipif(ON_GPU, reason="what a machine without a GPU picks")
@pytest.mark.parametrize("env, want", [({}, "native"), ({"TRITON_INTERPRET": "1"}, "triton"),
                                       ({"ROPEKIT_BACKEND": "triton"}, "triton"),
                                       ({"TRITON_INTERPRET": "1", "ROPEKIT_BACKEND": "native"}, "native")],
                         ids=["default", "TRITON_INTERPRET=1", "ROPEKIT_BACKEND=triton", "ROPEKIT_BACKEND-wins"])
def test_a_process_without_a_gpu_picks_native_unless_asked(env, want):
    done = _fresh_process("""
        import subprocess, sys
        import ropekit
        child = subprocess.run([sys.executable, "-c", "import ropekit; print(ropekit.device.default_backend())"],
                               capture_output=True, text=True)
        print(ropekit.device.default_backend(), child.stdout.strip())
    """, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [want, want]  # a child process inherits the choice


def test_an_unknown_ropekit_backend_is_refused_by_name():
    done = _fresh_process("import ropekit", ROPEKIT_BACKEND="numpy")
    assert done.returncode != 0 and "ROPEKIT_BACKEND" in done.stderr


def test_the_native_path_needs_no_numpy():
    done = _fresh_process("""
        import sys
        sys.modules["numpy"] = None  # any import of numpy now fails
        import torch
        import ropekit
        from ropekit import reference as ref
        from ropekit.testing import assert_close_to_reference

        cos, sin = ropekit.cos_sin_table(64, 32)
        q, k = torch.randn(2, 5, 4, 32), torch.randn(2, 5, 2, 32)
        out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=3, backend="native")
        assert_close_to_reference(out_q, ref.rope(q, ref.token_positions(2, 5, offsets=3)))
        cache = torch.zeros(4, 4, 2, 32, dtype=torch.float8_e4m3fn)
        with ropekit.device.set_backend("native"):
            ropekit.rope_and_cache(q, k, None, cos, sin, k_cache=cache, slot_mapping=torch.arange(10),
                                   k_scale=torch.ones(1))
            ropekit.qk_norm_rope(q, k, cos, sin, torch.ones(32), torch.ones(32))
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
