"""The CUDA C++ backend (``ropekit/cuda``) as a specification.

On any machine with ``nvcc`` (CI included): the kernels compile for sm_90 without a warning, and the compile check
really fails on a planted syntax error, type error or warning. Without a GPU: a clear error says what is missing.

On the GPU (``gpu_only``): the whole feature matrix against the float64 reference (``ropekit.reference``) with the
bound of ``ropekit.testing`` (fp32: 1e-5 relative; fp16/bf16: one ulp of the output dtype + 1e-6 * max|ref|), every
output buffer poisoned with NaN first; the 16-byte and element-wise paths; positions outside the table; CUDA-graph
capture and replay; 64-bit addressing; the table kernel's accuracy; agreement with Triton v4 (reported: bit for
bit or not); launch errors as Python exceptions. ``tools/sanitize_cuda.sh`` runs the ``sanitizer_subset`` tests under
compute-sanitizer memcheck.
"""

import logging
import shutil

import pytest
import torch

from ropekit.layouts import TO_BSHD

import ropekit
from ropekit import cuda as rcuda
from ropekit import reference as ref
from ropekit.frequencies import cos_sin_at, inverse_frequencies
from ropekit.positions import POSITION_IDS, SCALAR_OFFSET, SEQ_OFFSETS, PositionSpec
from ropekit.testing import assert_close_to_reference, ulp
from conftest import DEVICE, ON_GPU, gpu_only

NVCC = rcuda.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA compiler) is not installed here")

# (b, s, h, d) view -> layout and back; these permutations are their own inverses.
PERMUTE = TO_BSHD


@pytest.fixture(scope="module")
def kernels():
    """The built extension; skips (with the reason) where the CUDA backend cannot be built."""
    ok, reason = rcuda.available()
    if not ok:
        pytest.skip(reason)
    return rcuda.load()


# --------------------------------------------------------------------------------------------------------------------
# Building: nvcc alone (CPU CI) and the errors without a GPU
# --------------------------------------------------------------------------------------------------------------------

@needs_nvcc
def test_kernels_compile_for_sm90_without_warnings():
    rcuda.compile_check("sm_90")


PLANTED = {
    "syntax-error": "__global__ void planted_kernel(float* x) { x[0] = 1.0f }\n",
    "type-error": "__global__ void planted_kernel(float* x) { int* p = x; p[0] = 0; }\n",
    "warning": "__global__ void planted_kernel(float* x) { int unused = 1; x[0] = 2.0f; }\n",
}


@needs_nvcc
@pytest.mark.parametrize("kind", list(PLANTED))
def test_compile_check_fails_on_a_planted_error(kind, tmp_path):
    # A copy of the real sources with one mistake appended: the check must fail and show nvcc's message.
    shutil.copy(rcuda.HEADER, tmp_path / "rope.h")
    broken = tmp_path / "rope.cu"
    source = rcuda.KERNEL_SOURCE.read_text()
    broken.write_text(source + "\n" + PLANTED[kind])
    planted_line = source.count("\n") + 2
    with pytest.raises(RuntimeError, match="nvcc failed") as failure:
        rcuda.compile_check("sm_90", source=broken)
    # nvcc's own message, pointing at the planted line (a warning counts as an error)
    assert f"rope.cu({planted_line}): error" in str(failure.value), str(failure.value)


@pytest.mark.skipif(ON_GPU, reason="checks the message given where there is no GPU")
def test_without_a_gpu_the_error_says_what_is_missing():
    ok, reason = rcuda.available()
    assert not ok and reason
    with pytest.raises(RuntimeError, match="CUDA backend is unavailable"):
        rcuda.load()
    q = torch.randn(1, 2, 2, 8)
    cos, sin = ropekit.cos_sin_table(4, 8)
    with pytest.raises(RuntimeError, match="CUDA backend is unavailable"):
        ropekit.apply_rope(q, None, cos, sin, backend="cuda")


def test_varlen_is_declined_clearly():
    q = torch.randn(5, 2, 8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    spec = PositionSpec(SCALAR_OFFSET, 0, None, torch.tensor([0, 2, 5], device=DEVICE), 3)
    with pytest.raises(NotImplementedError, match="varlen"):
        rcuda.rope_cuda(q, None, cos, sin, out_q=torch.empty_like(q), out_k=None, positions=spec, rotary_dim=8)


@pytest.mark.parametrize("kwargs, error", [
    (dict(max_positions=8, rotary_dim=7), ValueError),
    (dict(max_positions=-1, rotary_dim=8), ValueError),
    (dict(max_positions=8, rotary_dim=8, base=1.0), ValueError),
    (dict(max_positions=8, rotary_dim=8, device="cpu"), ValueError),
], ids=["odd-rotary-dim", "negative-length", "base-1", "cpu-device"])
def test_table_arguments_are_checked_before_building(kwargs, error):
    with pytest.raises(error):
        rcuda.cos_sin_table_cuda(**kwargs)


# --------------------------------------------------------------------------------------------------------------------
# Helpers for the GPU tests
# --------------------------------------------------------------------------------------------------------------------

def make(layout, batch, seqlen, heads, head_dim, dtype, *, pad=0, shift=0):
    """A random tensor in ``layout`` and its (b, s, h, d) view. ``pad`` widens the stored head_dim (a non-contiguous
    slice), ``shift`` starts the slice ``shift`` elements in (a pointer off the 16-byte grid)."""
    shape = [batch, seqlen, heads, head_dim + pad + shift]
    stored = torch.randn([shape[i] for i in PERMUTE[layout]], device=DEVICE).to(dtype)
    x = stored[..., shift:shift + head_dim]
    return x, x.permute(PERMUTE[layout])


def poisoned_like(x):
    """An output in x's layout (contiguous) filled with NaN: an element the kernel forgets to write fails the test."""
    return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)


def table(rows=64, rotary_dim=32, base=10000.0):
    return ropekit.cos_sin_table(rows, rotary_dim, base=base, device=DEVICE)


def position_case(kind, batch, seqlen, rows):
    """(PositionSpec for the kernel, (batch, seq) int64 positions for the reference)."""
    if kind == "offset":
        return PositionSpec(SCALAR_OFFSET, 5), ref.token_positions(batch, seqlen, offsets=5)
    if kind == "seq-offsets":
        offsets = torch.randint(0, rows - seqlen, (batch,))
        return (PositionSpec(SEQ_OFFSETS, 0, offsets.to(DEVICE, torch.int32)),
                ref.token_positions(batch, seqlen, offsets=offsets))
    if kind == "ids":
        ids = torch.randint(0, rows, (batch, seqlen))
        return PositionSpec(POSITION_IDS, 0, ids.to(DEVICE)), ids
    if kind == "ids-broadcast":  # one row of ids shared by the batch: a stride-0 view
        ids = torch.randperm(rows)[:seqlen]
        return (PositionSpec(POSITION_IDS, 0, ids.to(DEVICE).expand(batch, seqlen)), ids.expand(batch, seqlen))
    raise AssertionError(kind)


def run(q4, k4, cos, sin, spec, rotary_dim, *, out_q4=None, out_k4=None, **kwargs):
    rcuda.rope_cuda(q4, k4, cos, sin, out_q=out_q4, out_k=out_k4, positions=spec, rotary_dim=rotary_dim, **kwargs)
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------------------------------
# The correctness matrix
# --------------------------------------------------------------------------------------------------------------------

HEADS = {"gqa-8q-2k": (8, 2), "mqa-4q-1k": (4, 1), "q-only-3": (3, 0)}
# (head_dim, rotary_dim): full (16-byte path), partial (16-byte path + tail copy), odd (element-wise path in fp16/bf16,
# 16-byte path in fp32, + tail)
ROTARY = {"full-64": (64, 64), "partial-64of128": (128, 64), "odd-24of40": (40, 24)}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@gpu_only
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("positions", ["offset", "seq-offsets", "ids"])
@pytest.mark.parametrize("rotary", list(ROTARY))
@pytest.mark.parametrize("pairing", ["neox", "gptj"])
@pytest.mark.parametrize("layout", list(PERMUTE))
def test_matches_reference(kernels, layout, pairing, rotary, positions, heads, dtype):
    batch, seqlen, rows = 2, 7, 64
    (hq, hk), (head_dim, rotary_dim), dtype = HEADS[heads], ROTARY[rotary], DTYPES[dtype]
    interleaved = pairing == "gptj"
    q, q4 = make(layout, batch, seqlen, hq, head_dim, dtype)
    k, k4 = make(layout, batch, seqlen, hk, head_dim, dtype) if hk else (None, None)
    out_q = poisoned_like(q)
    out_k = poisoned_like(k) if hk else None
    cos, sin = table(rows, rotary_dim)
    spec, pos = position_case(positions, batch, seqlen, rows)
    q_before = q.clone()
    run(q4, k4, cos, sin, spec, rotary_dim, out_q4=out_q.permute(PERMUTE[layout]),
        out_k4=out_k.permute(PERMUTE[layout]) if hk else None, interleaved=interleaved)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out_q.permute(PERMUTE[layout]), ref.rope(q4, pos, **kw))
    if hk:
        assert_close_to_reference(out_k.permute(PERMUTE[layout]), ref.rope(k4, pos, **kw))
    assert torch.equal(q, q_before), "out of place modified its input"
    # the tail past rotary_dim is copied bit for bit
    assert torch.equal(out_q[..., rotary_dim:], q[..., rotary_dim:])


@gpu_only
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rotary", list(ROTARY))
@pytest.mark.parametrize("pairing", ["neox", "gptj"])
def test_in_place_rotates_and_leaves_the_tail_alone(kernels, pairing, rotary, dtype):
    (head_dim, rotary_dim), dtype = ROTARY[rotary], DTYPES[dtype]
    q, q4 = make("bshd", 3, 5, 4, head_dim, dtype)
    k, k4 = make("bshd", 3, 5, 2, head_dim, dtype)
    q_in, k_in = q.clone(), k.clone()
    cos, sin = table(64, rotary_dim)
    spec, pos = position_case("seq-offsets", 3, 5, 64)
    interleaved = pairing == "gptj"
    run(q4, k4, cos, sin, spec, rotary_dim, out_q4=q4, out_k4=k4, interleaved=interleaved, copy_tail=False)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(q, ref.rope(q_in, pos, **kw))
    assert_close_to_reference(k, ref.rope(k_in, pos, **kw))
    assert torch.equal(q[..., rotary_dim:], q_in[..., rotary_dim:])


@gpu_only
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("pairing", ["neox", "gptj"])
def test_conjugate_is_the_inverse_rotation(kernels, pairing, dtype):
    dtype = {**DTYPES, "fp64": torch.float64}[dtype]
    q, q4 = make("bshd", 2, 6, 4, 64, dtype)
    cos, sin = table(64, 64, base=1e6)
    spec, pos = position_case("ids", 2, 6, 64)
    interleaved = pairing == "gptj"
    out = poisoned_like(q)
    run(q4, None, cos, sin, spec, 64, out_q4=out, interleaved=interleaved, conjugate=True)
    assert_close_to_reference(out, ref.rope(q4, pos, base=1e6, interleaved=interleaved, conjugate=True))
    back = poisoned_like(q)
    run(out, None, cos, sin, spec, 64, out_q4=back, interleaved=interleaved)
    assert_close_to_reference(back, ref.rope(out, pos, base=1e6, interleaved=interleaved))
    if dtype != torch.bfloat16:  # forward after conjugate gives the input back, to the dtype's rounding
        assert_close_to_reference(back, q4.double().cpu())


@gpu_only
@pytest.mark.parametrize("cos_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("pairing", ["neox", "gptj"])
def test_cos_sin_given_per_token(kernels, pairing, cos_dtype):
    """transformers' full-width rows (batch, seq, rotary_dim), broadcast over the batch with a 0 stride; the two
    channels of a pair read their own columns, so rows need not be duplicated halves (M-RoPE-style rows)."""
    interleaved = pairing == "gptj"
    batch, seqlen, head_dim, rotary_dim = 2, 5, 64, 48
    q, q4 = make("bshd", batch, seqlen, 4, head_dim, torch.bfloat16)
    k, k4 = make("bshd", batch, seqlen, 1, head_dim, torch.bfloat16)
    cos_row = torch.randn(1, seqlen, rotary_dim, dtype=torch.float64)
    sin_row = torch.randn(1, seqlen, rotary_dim, dtype=torch.float64)
    dtype = DTYPES[cos_dtype]
    cos = cos_row.to(DEVICE, dtype).expand(batch, seqlen, rotary_dim)
    sin = sin_row.to(DEVICE, dtype).expand(batch, seqlen, rotary_dim)
    out_q, out_k = poisoned_like(q), poisoned_like(k)
    run(q4, k4, cos, sin, PositionSpec(), rotary_dim, out_q4=out_q, out_k4=out_k, interleaved=interleaved,
        cos_per_token=True)
    c, s = cos.to(torch.float64).cpu()[:, :, None, :], sin.to(torch.float64).cpu()[:, :, None, :]
    assert_close_to_reference(out_q, ref.rope_from_cos_sin(q4, c, s, interleaved=interleaved))
    assert_close_to_reference(out_k, ref.rope_from_cos_sin(k4, c, s, interleaved=interleaved))


@gpu_only
@pytest.mark.parametrize("view, vectorized", [
    ("contiguous", 1),
    ("head-dim-slice", 1),  # stride_h = head_dim + 16: still on the 16-byte grid
    ("shifted-pointer", 0),  # starts one element in: element-wise path
    ("head-dim-not-innermost", 0),  # stride_d != 1
    ("broadcast-ids", 1),
    ("expanded-all-strides-0", 0),  # e.g. the gradient of out.sum(): one element seen everywhere
])
def test_strided_views_and_which_path_runs(kernels, view, vectorized):
    batch, seqlen, heads, head_dim = 2, 6, 4, 64
    if view == "head-dim-not-innermost":
        stored = torch.randn(batch, seqlen, head_dim, heads, device=DEVICE, dtype=torch.float16)
        q4 = stored.transpose(2, 3)
    elif view == "expanded-all-strides-0":
        q4 = torch.randn(1, 1, 1, 1, device=DEVICE, dtype=torch.float16).expand(batch, seqlen, heads, head_dim)
    else:
        _, q4 = make("bshd", batch, seqlen, heads, head_dim, torch.float16,
                     pad=16 if view == "head-dim-slice" else 0, shift=1 if view == "shifted-pointer" else 0)
    cos, sin = table(64, head_dim)
    spec, pos = position_case("ids-broadcast" if view == "broadcast-ids" else "ids", batch, seqlen, 64)
    out = poisoned_like(q4)
    launch = rcuda.launch_info(q4, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=head_dim)
    assert launch["vectorized"] == vectorized, launch
    assert_close_to_reference(out, ref.rope(q4, pos))


@gpu_only
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_fused_qkv_slices(kernels, inplace):
    """q and k as head slices of one projection output (batch, seq, hq + 2 hk, d): v must stay untouched."""
    hq, hk, head_dim = 8, 2, 64
    qkv = torch.randn(2, 5, hq + 2 * hk, head_dim, device=DEVICE, dtype=torch.bfloat16)
    before = qkv.clone()
    q4, k4 = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
    cos, sin = table(64, head_dim)
    spec, pos = position_case("ids", 2, 5, 64)
    out_q, out_k = (q4, k4) if inplace else (poisoned_like(q4), poisoned_like(k4))
    launch = rcuda.launch_info(q4, k4, cos, sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=head_dim)
    assert launch["vectorized"] == 1, launch
    assert_close_to_reference(out_q, ref.rope(before[:, :, :hq], pos))
    assert_close_to_reference(out_k, ref.rope(before[:, :, hq:hq + hk], pos))
    assert torch.equal(qkv[:, :, hq + hk:], before[:, :, hq + hk:]), "v was written"


@gpu_only
@pytest.mark.parametrize("shape", [
    "b1-s1-h1-d8",
    "b3-s5-h64+64-d128-fp16",  # more threads than one block row holds: heads loop
    "b1-s3-h2-d512-gptj-fp64",  # 256 pair groups per head
    "b70000-s1-h1-d16",  # more sequences than grid.y allows: the batch loop
    "b2-s1000-h2+1-d32-r8",  # many tokens per block, long tail
])
def test_launch_shapes(kernels, shape):
    fields = shape.split("-")
    batch, seqlen = int(fields[0][1:]), int(fields[1][1:])
    heads = [int(h) for h in fields[2][1:].split("+")]
    head_dim = int(fields[3][1:])
    rotary_dim = next((int(f[1:]) for f in fields[4:] if f.startswith("r")), head_dim)
    dtype = torch.float16 if "fp16" in fields else torch.float64 if "fp64" in fields else torch.float32
    interleaved = "gptj" in fields
    q, q4 = make("bshd", batch, seqlen, heads[0], head_dim, dtype)
    k, k4 = make("bshd", batch, seqlen, heads[1], head_dim, dtype) if len(heads) > 1 else (None, None)
    rows = seqlen + 8
    cos, sin = table(rows, rotary_dim)
    spec, pos = position_case("seq-offsets", batch, seqlen, rows)
    out_q = poisoned_like(q)
    out_k = poisoned_like(k) if k is not None else None
    run(q4, k4, cos, sin, spec, rotary_dim, out_q4=out_q, out_k4=out_k, interleaved=interleaved)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out_q, ref.rope(q4, pos, **kw))
    if k is not None:
        assert_close_to_reference(out_k, ref.rope(k4, pos, **kw))


@gpu_only
def test_positions_outside_the_table_give_nan_and_nothing_else(kernels):
    rows, head_dim, rotary_dim = 16, 64, 32
    q, q4 = make("bshd", 1, 6, 2, head_dim, torch.float32)
    cos, sin = table(rows, rotary_dim)
    ids = torch.tensor([[0, rows - 1, rows, -1, 3, 2**40]])
    out = poisoned_like(q)
    run(q4, None, cos, sin, PositionSpec(POSITION_IDS, 0, ids.to(DEVICE)), rotary_dim, out_q4=out)
    outside = torch.tensor([False, False, True, True, False, True])
    rotated = out[..., :rotary_dim].cpu()
    assert torch.isnan(rotated[0, outside]).all()
    inside_ids = ids[:, ~outside]
    assert_close_to_reference(out[:, ~outside.to(out.device)],
                              ref.rope(q4[:, ~outside.to(q4.device)], inside_ids, rotary_dim=rotary_dim))
    assert torch.equal(out[..., rotary_dim:], q[..., rotary_dim:]), "the tail is copied whatever the position"


@gpu_only
def test_addresses_past_2_to_the_31_elements(kernels):
    """A small view whose second sequence starts 2**31 elements into its buffer: int32 offsets would wrap."""
    needed = (2**31 + 4096) * 2
    if torch.cuda.mem_get_info()[0] < needed + (1 << 30):
        pytest.skip("needs about 5 GB of free GPU memory")
    buffer = torch.zeros(2**31 + 4096, dtype=torch.bfloat16, device=DEVICE)
    q4 = buffer.as_strided((2, 3, 2, 64), (2**31, 128, 64, 1))
    q4.copy_(torch.randn(2, 3, 2, 64, device=DEVICE))
    cos, sin = table(64, 64)
    spec, pos = position_case("seq-offsets", 2, 3, 64)
    out = poisoned_like(q4)
    run(q4, None, cos, sin, spec, 64, out_q4=out)
    assert_close_to_reference(out, ref.rope(q4, pos))
    q_in = q4.clone()
    run(q4, None, cos, sin, spec, 64, out_q4=q4)  # in place, far past 2**31
    assert_close_to_reference(q4, ref.rope(q_in, pos))
    del buffer


# --------------------------------------------------------------------------------------------------------------------
# Through the public API (backend="cuda"), autograd included
# --------------------------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("layout", list(PERMUTE))
def test_apply_rope_backend_cuda(kernels, layout):
    q, _ = make(layout, 2, 5, 4, 64, torch.bfloat16)
    k, _ = make(layout, 2, 5, 2, 64, torch.bfloat16)
    cos, sin = table(64, 48)
    offsets = torch.tensor([3, 11], device=DEVICE)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=offsets, layout=layout, rotary_dim=48,
                                      backend="cuda")
    pos = ref.token_positions(2, 5, offsets=offsets.cpu())
    for out, x in ((out_q, q), (out_k, k)):
        want = ref.rope(x.permute(PERMUTE[layout]), pos, rotary_dim=48).permute(PERMUTE[layout])
        assert_close_to_reference(out, want)


@gpu_only
def test_gradcheck_through_the_cuda_kernel_in_float64(kernels):
    q = torch.randn(2, 3, 2, 16, dtype=torch.float64, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 3, 1, 16, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = ropekit.cos_sin_table(32, 12, device=DEVICE, dtype=torch.float64)
    offsets = torch.tensor([0, 7], device=DEVICE)

    def f(q, k):
        return ropekit.apply_rope(q, k, cos, sin, positions=offsets, rotary_dim=12, interleaved=True, backend="cuda")

    assert torch.autograd.gradcheck(f, (q, k))


@gpu_only
def test_launch_parameters_logged_at_debug(kernels, caplog):
    q, q4 = make("bshd", 1, 4, 2, 64, torch.bfloat16)
    cos, sin = table(64, 64)
    with caplog.at_level(logging.DEBUG, logger="ropekit"):
        run(q4, None, cos, sin, PositionSpec(), 64, out_q4=poisoned_like(q))
    assert any("ropekit cuda:" in r.getMessage() and "vectorized" in r.getMessage() for r in caplog.records)


@gpu_only
def test_launch_errors_surface_as_python_exceptions(kernels):
    # An impossible block (2048 threads) makes the launch itself fail; the binding must raise, not carry on.
    # (the driver reports it as an invalid configuration or, for the block size, an invalid value)
    with pytest.raises(RuntimeError, match="invalid configuration|cudaErrorInvalidConfiguration|"
                                           "cudaErrorInvalidValue|invalid argument"):
        kernels.cos_sin_table(16, 8, 10000.0, False, torch.cuda.current_device(), 2048)
    # Arguments the kernel cannot take are refused by the binding before launching.
    q, q4 = make("bshd", 1, 2, 2, 32, torch.float16)
    cos, sin = table(8, 32)
    with pytest.raises(RuntimeError, match="out_q must have q's dtype"):
        run(q4, None, cos, sin, PositionSpec(), 32, out_q4=torch.empty_like(q, dtype=torch.float32))


# --------------------------------------------------------------------------------------------------------------------
# CUDA graphs: positions live on the device, nothing syncs
# --------------------------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("mode", ["seq-offsets", "ids"])
def test_cuda_graph_capture_and_replay_with_new_positions(kernels, mode):
    batch, heads_q, heads_k, head_dim, rows = 16, 8, 2, 128, 8192
    q = torch.randn(batch, 1, heads_q, head_dim, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(batch, 1, heads_k, head_dim, device=DEVICE, dtype=torch.bfloat16)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    cos, sin = table(rows, head_dim)
    if mode == "seq-offsets":
        positions = torch.randint(0, rows - 1, (batch,), device=DEVICE)
        spec = PositionSpec(SEQ_OFFSETS, 0, positions)
    else:
        positions = torch.randint(0, rows, (batch, 1), device=DEVICE)
        spec = PositionSpec(POSITION_IDS, 0, positions)

    def step():
        rcuda.rope_cuda(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=head_dim)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        positions.copy_(torch.randint(0, rows - 1, positions.shape, device=DEVICE))
        q.copy_(torch.randn_like(q))
        out_q.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        pos = (ref.token_positions(batch, 1, offsets=positions.cpu()) if mode == "seq-offsets"
               else positions.cpu())
        assert_close_to_reference(out_q, ref.rope(q, pos))
        assert_close_to_reference(out_k, ref.rope(k, pos))


# --------------------------------------------------------------------------------------------------------------------
# Next to Triton v4
# --------------------------------------------------------------------------------------------------------------------

V4_CASES = [
    ("bshd-neox-bf16-gqa", "bshd", False, torch.bfloat16, 128, 128, "seq-offsets"),
    ("sbhd-gptj-fp16", "sbhd", True, torch.float16, 64, 64, "ids"),
    ("bhsd-neox-fp32-partial", "bhsd", False, torch.float32, 128, 64, "offset"),
    ("bshd-gptj-bf16-odd", "bshd", True, torch.bfloat16, 40, 24, "ids"),
    ("bshd-neox-fp64", "bshd", False, torch.float64, 64, 64, "offset"),
]


@gpu_only
@pytest.mark.parametrize("conjugate", [False, True], ids=["forward", "conjugate"])
@pytest.mark.parametrize("case", V4_CASES, ids=[c[0] for c in V4_CASES])
def test_agrees_with_triton_v4_and_reports_bitwise_equality(kernels, case, conjugate, record_property, capsys):
    from ropekit.triton.launch import rope_v4

    _, layout, interleaved, dtype, head_dim, rotary_dim, kind = case
    q, q4 = make(layout, 4, 33, 8, head_dim, dtype)
    k, k4 = make(layout, 4, 33, 2, head_dim, dtype)
    cos, sin = table(128, rotary_dim)
    spec, pos = position_case(kind, 4, 33, 128)
    outs = {}
    for name, launcher in (("cuda", rcuda.rope_cuda), ("triton", rope_v4)):
        out_q, out_k = poisoned_like(q4), poisoned_like(k4)
        launcher(q4, k4, cos, sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=rotary_dim,
                 interleaved=interleaved, conjugate=conjugate)
        outs[name] = (out_q, out_k)
    torch.cuda.synchronize()
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved, conjugate=conjugate)
    equal = True
    for index, x in enumerate((q4, k4)):
        want = ref.rope(x, pos, **kw)
        got_cuda, got_triton = outs["cuda"][index], outs["triton"][index]
        assert_close_to_reference(got_cuda, want)
        assert_close_to_reference(got_triton, want)
        # whatever the rounding details, the two kernels are at most one output ulp apart (plus, for fp32/fp64
        # outputs, one ulp of the largest value for pairs that cancel)
        gap = (got_cuda.double() - got_triton.double()).abs().cpu()
        slack = torch.finfo(dtype).eps * float(want.abs().max()) if dtype in (torch.float32, torch.float64) else 0.0
        assert bool((gap <= ulp(got_triton.double().cpu(), dtype) + slack).all())
        equal = equal and torch.equal(got_cuda, got_triton)
    record_property("bitwise_equal_to_triton_v4", equal)
    with capsys.disabled():
        print(f"\n[cuda vs triton v4] {case[0]} {'conjugate' if conjugate else 'forward'}: "
              f"{'bitwise equal' if equal else 'NOT bitwise equal (within one ulp)'}")


# --------------------------------------------------------------------------------------------------------------------
# The table kernel
# --------------------------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("rotary_dim", [128, 64, 6])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 1e6])
def test_table_kernel_is_accurate_up_to_position_1e6(kernels, base, rotary_dim):
    max_positions = 1_000_001
    cos, sin = rcuda.cos_sin_table_cuda(max_positions, rotary_dim, base)
    assert cos.shape == (max_positions, rotary_dim // 2) and cos.dtype == torch.float32
    # float64 on the CPU at a sample of rows: the first ones, the notebook's, the last, and random ones
    rows = torch.cat((torch.arange(0, 4096), torch.tensor([32000, 999_999, 1_000_000]),
                      torch.randint(0, max_positions, (4096,))))
    want_cos, want_sin = cos_sin_at(rows, inverse_frequencies(rotary_dim, base), dtype=torch.float64)
    got_cos, got_sin = cos[rows.to(DEVICE)].double().cpu(), sin[rows.to(DEVICE)].double().cpu()
    assert float((got_cos - want_cos).abs().max()) <= 2e-7
    assert float((got_sin - want_sin).abs().max()) <= 2e-7


@gpu_only
def test_fast_sincosf_table_is_wrong_at_large_positions(kernels):
    """The teaching variant (float32 angle + __sincosf) drifts with the position: fine near 0, visibly wrong at 1e6."""
    cos, sin = rcuda.cos_sin_table_cuda(1_000_001, 128, fast=True)
    rows = torch.tensor([10, 1_000_000])
    want_cos, _ = cos_sin_at(rows, inverse_frequencies(128), dtype=torch.float64)
    error = (cos[rows.to(DEVICE)].double().cpu() - want_cos).abs().amax(dim=1)
    assert float(error[0]) < 1e-5
    assert float(error[1]) > 1e-3


# --------------------------------------------------------------------------------------------------------------------
# The subset tools/sanitize_cuda.sh runs under compute-sanitizer memcheck: every path once, exact-size buffers.
# --------------------------------------------------------------------------------------------------------------------

SANITIZE = {
    "bshd-neox-bf16-gqa-vector": ("bshd", False, torch.bfloat16, 128, 128, "seq-offsets", (8, 2)),
    "sbhd-gptj-fp16-partial-vector": ("sbhd", True, torch.float16, 128, 64, "ids", (4, 4)),
    "bhsd-neox-fp32-odd-scalar": ("bhsd", False, torch.float32, 40, 24, "ids-broadcast", (3, 1)),
    "bshd-gptj-fp64-q-only": ("bshd", True, torch.float64, 64, 64, "offset", (2, 0)),
}


@gpu_only
@pytest.mark.parametrize("case", list(SANITIZE))
def test_sanitizer_subset_rope(kernels, case):
    layout, interleaved, dtype, head_dim, rotary_dim, kind, (hq, hk) = SANITIZE[case]
    rows = 40
    q, q4 = make(layout, 3, 9, hq, head_dim, dtype)
    k, k4 = make(layout, 3, 9, hk, head_dim, dtype) if hk else (None, None)
    cos, sin = table(rows, rotary_dim)
    spec, pos = position_case(kind, 3, 9, rows)
    out_q = poisoned_like(q)
    out_k = poisoned_like(k) if hk else None
    run(q4, k4, cos, sin, spec, rotary_dim, out_q4=out_q.permute(PERMUTE[layout]),
        out_k4=out_k.permute(PERMUTE[layout]) if hk else None, interleaved=interleaved)
    assert_close_to_reference(out_q.permute(PERMUTE[layout]),
                              ref.rope(q4, pos, rotary_dim=rotary_dim, interleaved=interleaved))
    # in place, and positions past both ends of the table (masked: never read)
    ids = torch.randint(-5, rows + 5, (3, 9), device=DEVICE)
    run(q4, k4, cos, sin, PositionSpec(POSITION_IDS, 0, ids), rotary_dim, out_q4=q4, out_k4=k4,
        interleaved=interleaved, copy_tail=False)
    # per-token cos/sin rows, broadcast over the batch
    cos_rows = torch.randn(1, 9, rotary_dim, device=DEVICE).expand(3, 9, rotary_dim)
    run(q4, k4, cos_rows, cos_rows, PositionSpec(), rotary_dim, out_q4=out_q.permute(PERMUTE[layout]),
        out_k4=out_k.permute(PERMUTE[layout]) if hk else None, interleaved=interleaved, cos_per_token=True)


@gpu_only
@pytest.mark.parametrize("fast", [False, True], ids=["accurate", "fast"])
def test_sanitizer_subset_table(kernels, fast):
    cos, sin = rcuda.cos_sin_table_cuda(1001, 10, fast=fast)
    want_cos, want_sin = cos_sin_at(torch.arange(1001), inverse_frequencies(10), dtype=torch.float64)
    bound = 1e-3 if fast else 2e-7
    assert float((cos.double().cpu() - want_cos).abs().max()) <= bound
    assert float((sin.double().cpu() - want_sin).abs().max()) <= bound


@gpu_only
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_k_is_rotated_when_q_has_no_heads(kernels, inplace):
    """Hq = 0 (a call that rotates only keys): the extension sizes its launch from q, so k must still be rotated."""
    q = torch.randn(2, 5, 0, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 5, 2, 64, device="cuda", dtype=torch.bfloat16)
    cos, sin = table(16, 64)
    k_before = k.clone()
    _, out_k = ropekit.apply_rope(q, k, cos, sin, positions=3, backend="cuda", inplace=inplace)
    positions = torch.arange(3, 8, device="cuda").expand(2, 5)
    assert_close_to_reference(out_k, ref.rope(k_before, positions))
    assert (out_k is k) == inplace
