"""Quantise on write: ropekit.rope_and_cache into float8 e4m3 / e5m2 and int8 caches, at one scale a tensor, one a kv
head, or one a (token, head) computed from the rotated head vector and written beside the cache (vLLM's
``fp8_per_token_head`` / ``int8_per_token_head``). Each format is checked by a reader round trip: written by ropekit,
read back by the reference dequantiser (stored value times its scale, found at the token's slot) and compared with
the float64 truth within half a spacing of the format; v, which passes through, bit for bit. Both backends; scale
caches allocated heads first (their transposed views), a float8 q, under torch.compile and in CUDA graphs."""

import pytest
import torch
import triton
import triton.language as tl

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference, ulp
from ropekit.triton import fused_tiles
from capture import cuda_graph_of
from conftest import DEVICE, gpu_only

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
RANGES = {E4M3: (-448.0, 448.0), INT8: (-128.0, 127.0)}
FORMATS = {"e4m3": (E4M3, "fp8_e4m3"), "e5m2": (E5M2, "fp8_e5m2"), "int8": (INT8, "auto")}


def spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between neighbouring values of the format at ``|values|`` (float64)."""
    return torch.ones_like(values, dtype=torch.float64) if dtype == INT8 else ulp(values, dtype)


def case(tokens=6, hk=2, d=16, dtype=torch.bfloat16, cache_dtype=E4M3, num_blocks=3, block_size=4, skip=(2,)):
    """k and v slices of one projection, caches (and scale caches) filled with sentinel bytes, a slot mapping with
    padding tokens."""
    kv = torch.randn(tokens, 2 * hk * d, device=DEVICE).to(dtype) * 3
    k, v = kv[:, :hk * d].view(tokens, hk, d), kv[:, hk * d:].view(tokens, hk, d)
    q = torch.randn(tokens, 3, d, device=DEVICE).to(dtype)

    def sentinel(*shape, dtype):
        return torch.randint(0, 100, shape, device=DEVICE, dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 \
            else torch.randn(*shape, device=DEVICE).to(dtype)

    caches = [sentinel(num_blocks, block_size, hk, d, dtype=cache_dtype) for _ in range(2)]
    scale_caches = [torch.full((num_blocks, block_size, hk), -7.0, device=DEVICE) for _ in range(2)]
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[list(skip)] = -1
    return q, k, v, caches, scale_caches, slots.to(DEVICE)


def scales_at(mode: str, k_scale, v_scale, scale_caches, slots, hk):
    """The reader's scales for the written tokens, ``(written, hk, 1)`` float64: found at the token's slot (per
    (token, head)), or the static ones."""
    written = slots[slots >= 0]
    if mode == "token_head":
        return [c.view(-1, hk)[written].double().cpu()[..., None] for c in scale_caches]
    return [s.double().cpu().reshape(-1)[:, None].expand(hk, 1).expand(written.numel(), hk, 1)
            for s in (k_scale, v_scale)]


def assert_untouched(before, after, slots):
    """Every slot no token names holds its bytes (caches and scale caches alike)."""
    flat_before, flat_after = (t.reshape(-1, *t.shape[2:]).cpu() for t in (before, after))
    untouched = torch.ones(flat_after.shape[0], dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    assert torch.equal(flat_after[untouched].contiguous().view(torch.uint8),
                       flat_before[untouched].contiguous().view(torch.uint8))


@pytest.mark.parametrize("mode", ["tensor", "head", "token_head"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_reader_round_trip(fmt, mode, backend):
    """Write with ropekit, read back with the reference dequantiser: k within half a spacing of the format (plus the
    float32 math's own error) of the float64 truth, v and its per-(token, head) scales bit for bit."""
    cache_dtype, kv_cache_dtype = FORMATS[fmt]
    hk = 2
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(hk=hk, cache_dtype=cache_dtype)
    before = [t.clone() for t in (k_cache, v_cache, *scale_caches)]
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    positions = torch.tensor([0, 3, 1, 31, 7, 2], device=DEVICE)
    kwargs = dict(kv_cache_dtype=kv_cache_dtype)
    k_scale = v_scale = None
    largest = ref.CACHE_FORMATS[cache_dtype][1]
    if mode == "token_head":
        kwargs.update(k_scale_cache=scale_caches[0], v_scale_cache=scale_caches[1],
                      kv_cache_dtype={"e4m3": "fp8_per_token_head", "int8": "int8_per_token_head"}.get(fmt, "auto"))
    else:  # static scales that keep the values inside the format
        size = 1 if mode == "tensor" else hk
        k_scale = (torch.rand(size, device=DEVICE) + 1) * 20 / largest
        v_scale = (torch.rand(size, device=DEVICE) + 1) * 20 / largest
        kwargs.update(k_scale=k_scale, v_scale=v_scale)
    ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                           positions=positions, layout="thd", cu_seqlens=torch.tensor([0, 6], device=DEVICE),
                           max_seqlen=6, **kwargs)
    written = (slots >= 0).cpu()
    k_read_scale, v_read_scale = scales_at(mode, k_scale, v_scale, scale_caches, slots, hk)
    truth_k = ref.rope_table(k, cos, sin, positions.cpu())[written]
    truth_v = v.double().cpu()[written]
    got_k = ref.dequantise(k_cache.view(-1, hk, 16)[slots[slots >= 0]], k_read_scale)
    quotient = truth_k / k_read_scale
    error = (got_k - truth_k).abs() / k_read_scale
    bound = spacing(quotient, cache_dtype) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
    assert bool((error <= bound).all()), float((error / bound).max())
    if mode == "token_head":
        # the scale: max|x| over the head vector / the format's largest value, float32
        assert torch.equal(v_read_scale, ref.token_head_scale(truth_v, cache_dtype))
        torch.testing.assert_close(k_read_scale, ref.token_head_scale(truth_k, cache_dtype), rtol=1e-6, atol=0)
        assert bool((quotient.abs().amax(-1) <= largest * (1 + 1e-6)).all())
    got_v = v_cache.view(-1, hk, 16)[slots[slots >= 0]].double().cpu()
    assert torch.equal(got_v, ref.quantise(truth_v, v_read_scale, cache_dtype))
    for b, a in zip(before, (k_cache, v_cache, *scale_caches)):
        assert_untouched(b, a, slots)
    if mode != "token_head":
        for b, a in zip(before[2:], scale_caches):
            assert torch.equal(a, b)  # static scales: the scale caches are not touched (not passed)


def written_by_each_backend(q, k, v, cos, sin, caches, scale_caches, slots, token_head: bool, **kwargs) -> dict:
    """What each backend writes from one ``rope_and_cache`` call of one token batch, into its own copies of the caches
    (and, per (token, head), of the scale caches): {backend: [out_q, k_cache, v_cache, k scales, v scales], each as
    its bytes}."""
    written = {}
    for backend in ropekit.device.BACKENDS:
        outputs = [t.clone() for t in (*caches, *scale_caches)]
        call = dict(kwargs, **(dict(k_scale_cache=outputs[2], v_scale_cache=outputs[3]) if token_head else {}))
        with ropekit.device.set_backend(backend):
            out_q, _ = ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=outputs[0],
                                              v_cache=outputs[1], slot_mapping=slots, **call)
        written[backend] = [t.view(torch.uint8) for t in (out_q, *outputs)]
    return written


@pytest.mark.parametrize("mode", ["tensor", "head", "token_head"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_both_backends_store_the_same_bytes(fmt, mode):
    """The native backend (PyTorch ops) and the Triton kernel (the interpreter on a CPU) write the same caches, scale
    caches and float8 q, byte for byte (k in float32 math, one rounding: no summation order differs without QK-norm)."""
    cache_dtype, kv_cache_dtype = FORMATS[fmt]
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(cache_dtype=cache_dtype)
    cos, sin = ropekit.cos_sin_table(16, 12, device=DEVICE)  # partial rotary
    kwargs = dict(kv_cache_dtype=kv_cache_dtype)
    if mode != "token_head":  # (per (token, head), the scale caches are each backend's own copies)
        size = 1 if mode == "tensor" else 2
        kwargs.update(k_scale=torch.full((size,), 0.03, device=DEVICE),
                      v_scale=torch.full((size,), 0.07, device=DEVICE))
    if cache_dtype != INT8:
        kwargs.update(q_dtype=cache_dtype, q_scale=torch.tensor([0.01], device=DEVICE))
    written = written_by_each_backend(q, k, v, cos, sin, (k_cache, v_cache), scale_caches, slots,
                                      mode == "token_head", positions=2, interleaved=True, **kwargs)
    for native, kernel in zip(*written.values()):
        assert torch.equal(native, kernel)


EDGE_VALUES = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 3.0, -3.0, 1e-30, -1e-30, 3e38, -3e38,
               0.5, -0.5, 448.0, -2.0, 7.0]


@pytest.mark.parametrize("mode", ["head", "token_head"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_both_backends_divide_edge_values_alike(fmt, mode):
    """Infinities, NaN, signed zeros and values near float32's largest, divided by the scales at the division's edges:
    static per-head scales of infinity (quotients 0 of x's sign, NaN for an infinite x) and 0 (infinities, NaN for a
    zero x), or per-(token, head) scales of a head that holds an infinity (its scale infinite). The Triton kernels
    (the interpreter) store the native backend's bytes, which are torch's float32 division's, saturated."""
    cache_dtype, kv_cache_dtype = FORMATS[fmt]
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(hk=2, cache_dtype=cache_dtype, skip=())
    k.zero_()  # (a rotated k's float32 roundings may differ between torch's ops and a GPU kernel's fused multiply-adds)
    v[:, 0] = torch.tensor(EDGE_VALUES, device=DEVICE).to(v.dtype)
    v[:, 1] = -v[:, 0]
    kwargs = dict(kv_cache_dtype=kv_cache_dtype)
    if mode == "token_head":
        kwargs["kv_cache_dtype"] = {"e4m3": "fp8_per_token_head", "int8": "int8_per_token_head"}.get(fmt, "auto")
    else:
        kwargs.update(k_scale=torch.ones(2, device=DEVICE), v_scale=torch.tensor([float("inf"), 0.0], device=DEVICE))
    written = written_by_each_backend(q, k, v, *ropekit.cos_sin_table(8, 16, device=DEVICE), (k_cache, v_cache),
                                      scale_caches, slots, mode == "token_head", **kwargs)
    if mode == "token_head":
        assert torch.isinf(written["native"][4].view(torch.float32)).any()  # a head's scale is infinite
    for native, kernel in zip(*(caches[1:] for caches in written.values())):  # the caches and their scales
        assert torch.equal(native, kernel)


def hard_maxima(largest: float, count: int = 96) -> torch.Tensor:
    """float32 absolute maxima whose quotient by ``largest`` a bare product with the rounded reciprocal misrounds,
    and the edges: 0, the smallest normal float32, the quotients around it (where a correction could be inexact),
    float32's largest."""
    generator = torch.Generator().manual_seed(3)
    drawn = torch.exp2(torch.rand(200_000, generator=generator, dtype=torch.float64) * 200 - 100).float()
    inverse = torch.tensor(1.0 / largest, dtype=torch.float64).float()
    wrong = drawn[(drawn * inverse) != (drawn / largest)][:count]
    assert wrong.numel() == count
    tiny = torch.finfo(torch.float32).tiny
    near_floor = (torch.tensor(largest * tiny, dtype=torch.float64).float() +
                  torch.arange(-3, 4) * torch.tensor(largest * tiny).float().double().mul(2.0**-23)).float()
    return torch.cat([wrong, near_floor, torch.tensor([0.0, tiny, torch.finfo(torch.float32).max])])


@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_a_per_token_head_scale_is_the_correctly_rounded_quotient(fmt, backend):
    """Each head's scale is ``max(amax / format max, smallest normal)`` with the quotient correctly rounded to
    float32, as torch's float32 division gives it: at maxima a product with the rounded reciprocal misrounds, and
    around the floor."""
    cache_dtype = FORMATS[fmt][0]
    largest = {"e4m3": 448.0, "int8": 127.0}[fmt]
    maxima = hard_maxima(largest)
    heads = maxima.numel()
    v = torch.zeros(1, 1, heads, 16, device=DEVICE)
    v[0, 0, :, 3] = -maxima.to(DEVICE)  # each head's absolute maximum, the other channels zero
    k = torch.zeros(1, 1, heads, 16, device=DEVICE)
    caches = [torch.zeros(1, 1, heads, 16, device=DEVICE, dtype=cache_dtype) for _ in range(2)]
    scales = [torch.zeros(1, 1, heads, device=DEVICE) for _ in range(2)]
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    kv_cache_dtype = "int8_per_token_head" if fmt == "int8" else "fp8_per_token_head"
    ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], kv_cache_dtype=kv_cache_dtype,
                           slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE), k_scale_cache=scales[0],
                           v_scale_cache=scales[1])
    want = torch.clamp(maxima / largest, min=torch.finfo(torch.float32).tiny)
    assert torch.equal(scales[1].flatten().cpu(), want)


@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_an_all_zero_head_gets_a_finite_scale(fmt, backend):
    """amax == 0: the scale is the floor (the smallest normal float32), the stored values 0, the read-back 0."""
    cache_dtype = FORMATS[fmt][0]
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(cache_dtype=cache_dtype, skip=())
    k[1] = 0
    v[1, 0] = 0
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                           k_scale_cache=scale_caches[0], v_scale_cache=scale_caches[1])
    slot = int(slots[1])
    tiny = torch.finfo(torch.float32).tiny
    assert torch.equal(scale_caches[0].view(-1, 2)[slot].cpu(), torch.full((2,), tiny))
    assert float(scale_caches[1].view(-1, 2)[slot, 0]) == tiny and float(scale_caches[1].view(-1, 2)[slot, 1]) > tiny
    assert not k_cache.view(-1, 2, 16)[slot].double().any() and not v_cache.view(-1, 2, 16)[slot, 0].double().any()


ROUNDING = [1.0625, 1.1875, 17.0, 19.0, 2.0**-15 * 3, 2.0**-17, 2.0**-18, 57344.0, 60000.0, 61440.0, -1e6,
            float("inf"), -0.0, 0.0, float("nan"), -2.0**-16]
INT8_ROUNDING = [0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.4, 127.6, -128.4, -129.0, 300.0, float("-inf"), 3.49, -0.0,
                 float("nan"), 7.0]


@pytest.mark.parametrize("fmt", ["e5m2", "int8"])
def test_rounding_of_the_format(fmt, backend):
    """v passes through, so with scale 1 its stored values are the format's rounding itself: ties to even,
    subnormals, saturation (infinities too), signed zeros and NaN (int8: NaN stores 0)."""
    cache_dtype = FORMATS[fmt][0]
    values = torch.tensor(ROUNDING if fmt == "e5m2" else INT8_ROUNDING, device=DEVICE)
    k = torch.zeros(1, 1, 1, 16, device=DEVICE)
    k_cache, v_cache = (torch.zeros(1, 1, 1, 16, device=DEVICE, dtype=cache_dtype) for _ in range(2))
    one = torch.ones(1, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    ropekit.rope_and_cache(k, k, values.view(1, 1, 1, 16), cos, sin, k_cache=k_cache, v_cache=v_cache,
                           slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE), k_scale=one, v_scale=one)
    want = ref.quantise(values.cpu(), 1.0, cache_dtype).to(cache_dtype)
    assert torch.equal(v_cache.cpu().flatten().view(torch.uint8), want.view(torch.uint8))


# per-head scales whose quotients a product with the reciprocal gets wrong: with 1/7, (k + 0.5) * 7 lands an ulp past
# the tie; 3 * 2**-110's reciprocal is near float32's largest; 5 * 2**-140 is subnormal (its reciprocal overflows)
DIVISION_SCALES = (7.0, 3 * 2.0**-110, 5 * 2.0**-140)


def int8_ties_stored(scales) -> tuple[torch.Tensor, torch.Tensor]:
    """Quotients on the ties of the int8 grid, ``(k + 0.5) * scale`` for every k, as one token's v (k zero) through
    ``rope_and_cache`` into an int8 cache at ``v_scale=scales`` (float32: one a kv head, or one for the whole cache,
    the kv heads then as many as DIVISION_SCALES): (the values, ``(heads, 255)`` float32; their stored codes)."""
    heads = len(DIVISION_SCALES)
    ties = torch.arange(-128, 127, dtype=torch.float64) + 0.5
    scale_of_head = scales.double().expand(heads)
    values = (ties[None, :] * scale_of_head[:, None]).float()
    assert torch.equal(values.double() / scale_of_head[:, None], ties.expand(heads, -1))  # each quotient is a tie
    v = torch.zeros(1, 1, heads, 256, device=DEVICE)
    v[0, 0, :, :255] = values.to(DEVICE)
    k = torch.zeros(1, 1, heads, 16, device=DEVICE)
    k_cache = torch.zeros(1, 1, heads, 16, device=DEVICE, dtype=INT8)
    v_cache = torch.zeros(1, 1, heads, 256, device=DEVICE, dtype=INT8)
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                           slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE),
                           k_scale=torch.ones(1, device=DEVICE), v_scale=scales.to(DEVICE))
    return values, v_cache.view(heads, 256)[:, :255].cpu()


def test_a_scale_divides_as_the_division_rounds(backend):
    """The stored int8 code of ``v / scale`` is the correctly rounded quotient's: quotients on the ties of the int8
    grid store the even neighbour at each of DIVISION_SCALES, one a kv head."""
    scales = torch.tensor(DIVISION_SCALES, dtype=torch.float32)
    values, stored = int8_ties_stored(scales)
    ties = torch.arange(-128, 127, dtype=torch.float64) + 0.5
    assert torch.equal(stored, torch.round(ties).to(INT8).expand(len(DIVISION_SCALES), -1))  # ties to even
    assert torch.equal(stored, ref.quantise(values, scales.double()[:, None], INT8).to(INT8))


@pytest.mark.parametrize("scale", DIVISION_SCALES)
def test_one_scale_a_tensor_divides_as_the_division_rounds(scale, backend):
    """The same ties at one scale for the whole cache (the store's single float rather than a tile of them): each
    stores its even neighbour."""
    _, stored = int8_ties_stored(torch.tensor([scale], dtype=torch.float32))
    ties = torch.arange(-128, 127, dtype=torch.float64) + 0.5
    assert torch.equal(stored, torch.round(ties).to(INT8).expand(len(DIVISION_SCALES), -1))


@triton.jit
def _reciprocal_mismatches(counts, start, stop, BLOCK: tl.constexpr):
    """For the positive float32 scales with bits [start, stop) (BLOCK of them a program), added to ``counts``: how
    many reciprocals are compared (scales in [2**-126, 2**126)) and how many of :func:`fused_tiles.reciprocal`'s
    differ from the GPU's correctly rounded division; then how many quotients are compared and how many of
    :func:`fused_tiles.divided` with that reciprocal differ from the division's, for two dividends a scale (sign,
    exponent in [-8, 8) and significand from a hash of all the scale's bits, its exponent's too). Only quotients in
    float32's normal range count: below it and past it are the division's documented limits. (divided's correction
    also repairs a reciprocal an ulp off for most dividends: the reciprocals' own count is what catches one.)"""
    bits = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    scale = (bits & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    normal = (bits < stop) & (scale >= 1.1754943508222875e-38) & (scale < 8.507059173023462e37)
    got = fused_tiles.reciprocal(scale, True).to(tl.uint32, bitcast=True)
    inverse_differs = normal & (got != tl.div_rn(1.0, scale).to(tl.uint32, bitcast=True))
    compared = tl.zeros([BLOCK], dtype=tl.int32)
    differ = tl.zeros([BLOCK], dtype=tl.int32)
    for salt in tl.static_range(2):
        mixed = (((bits ^ (bits >> 15)) + salt * 0x5BD1E995) * 0x9E3779B1) & 0xFFFFFFFF
        exponent = 119 + ((mixed >> 23) & 15)
        x = ((mixed & 0x807FFFFF) | (exponent << 23)).to(tl.uint32).to(tl.float32, bitcast=True)
        want = tl.div_rn(x, scale)
        quotient = fused_tiles.divided(x, scale, True)
        inside = (bits < stop) & (tl.abs(want) >= 1.1754943508222875e-38) & (tl.abs(want) <= 3.4028234663852886e38)
        compared += inside.to(tl.int32)
        differ += (inside & (quotient.to(tl.uint32, bitcast=True) != want.to(tl.uint32, bitcast=True))).to(tl.int32)
    tl.atomic_add(counts, tl.sum(normal.to(tl.int32)))
    tl.atomic_add(counts + 1, tl.sum(inverse_differs.to(tl.int32)))
    tl.atomic_add(counts + 2, tl.sum(compared))
    tl.atomic_add(counts + 3, tl.sum(differ))


@gpu_only
def test_the_gpu_reciprocal_is_the_division_over_every_scale():
    """NVFP4's block-scale division takes the GPU's approximate reciprocal refined by one Newton step. Over every
    positive finite float32 scale, subnormal to the largest: the reciprocal is the correctly rounded division's
    wherever the scale's magnitude is in [2**-126, 2**126), and, with two dividends a scale, the quotient is the
    division's wherever that lies in float32's normal range (the rescaled scales included): of the two dividends a
    scale, at least 90 % have their quotient there."""
    counts = torch.zeros(4, dtype=torch.int64, device="cuda")
    start, stop, block = 1, 0x7F800000, 1024
    for first in range(start, stop, 1 << 30):
        last = min(first + (1 << 30), stop)
        _reciprocal_mismatches[(triton.cdiv(last - first, block),)](counts, first, last, BLOCK=block)
    inverses, inverses_differ, quotients, quotients_differ = counts.tolist()
    assert inverses == 0x7E800000 - 0x00800000 and inverses_differ == 0, (inverses, inverses_differ)
    assert quotients > 1.8 * (stop - start) and quotients_differ == 0, (quotients, quotients_differ)


# the Triton kernels' division stores NaN (int8, NVFP4: 0) where a quotient passes float32's range: every guard
# measured 1.036-1.046x on the H200's float8 decode (ropekit.triton.fused_tiles.divided)
PAST_FLOAT32 = "the Triton kernels' known limit: a quotient past float32's range is not saturated"
FLOAT32_MAX = torch.finfo(torch.float32).max
REFERENCE_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0}


def assert_saturates_past_float32(stored, want, past, backend):
    """``stored`` holds ``want`` (both uint8 views) everywhere on the native backend. On the Triton backend it holds
    it wherever the quotient is within float32's range (``past`` False) and differs from it at every other place:
    the known limit, then an expected failure."""
    if backend != "triton":
        assert torch.equal(stored, want)
        return
    assert bool(past.any()) and torch.equal(stored[~past], want[~past])
    assert bool((stored[past] != want[past]).all())
    pytest.xfail(PAST_FLOAT32)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_quotient_past_float32_saturates(fmt, backend):
    """A finite value whose quotient by a small static scale lies past float32's range (its product with the
    reciprocal overflows) stores the format's saturated value of its sign, in the cache and in a float8 q; not NaN
    (float8) or 0 (int8). Values of both signs up to float32's largest, at scales 1e-10 and 2**-120 (the one
    rescaled before its reciprocal is taken: its products overflow to infinity, which saturates on both backends).
    The native backend; on the Triton kernels the limit is checked to be exactly those quotients at 1e-10."""
    cache_dtype = FORMATS[fmt][0]
    magnitudes = torch.tensor([3.4e38, 1e38, 2e30, 1e29, 5.0, 0.0])
    values = torch.cat([magnitudes, -magnitudes, torch.tensor([1e31, -1e31, 7e37, -7e37])])  # 16 values
    v = values.view(1, 1, 1, 16).expand(1, 1, 2, 16).contiguous().to(DEVICE)
    k = torch.zeros(1, 1, 2, 16, device=DEVICE)
    scales = torch.tensor([1e-10, 2.0**-120])
    k_cache, v_cache = (torch.zeros(1, 1, 2, 16, device=DEVICE, dtype=cache_dtype) for _ in range(2))
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    q_dtype = cache_dtype if fmt != "int8" else None
    q_scale = scales[1:].to(DEVICE) if q_dtype else None
    out_q, _ = ropekit.rope_and_cache(v[:, :, :1], k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE),
                                      k_scale=torch.ones(1, device=DEVICE), v_scale=scales.to(DEVICE),
                                      q_dtype=q_dtype, q_scale=q_scale)
    if q_dtype:
        truth = ref.rope_table(v[0, :, :1].cpu(), cos.cpu(), sin.cpu(), torch.zeros(1, dtype=torch.int64))
        want_q = ref.quantise(truth.flatten(), scales[1].double(), q_dtype).to(q_dtype)
        assert torch.equal(out_q.view(16).cpu().view(torch.uint8), want_q.view(torch.uint8))
    want = ref.quantise(values[None], scales[:, None].double(), cache_dtype).to(cache_dtype)
    assert not torch.isnan(want.float()).any() and torch.equal(want[:, 0].float().abs(),
                                                                torch.full((2,), REFERENCE_MAX[fmt]))
    past = (values[None].double() / scales[:, None].double()).abs() > FLOAT32_MAX
    past[1] = False  # at 2**-120 the rescaled products overflow to infinity, which saturates
    assert_saturates_past_float32(v_cache.view(2, 16).cpu().view(torch.uint8), want.view(torch.uint8), past, backend)


def test_a_uint8_cache_holds_the_bytes_kv_cache_dtype_names():
    """vLLM allocates float8 caches as uint8: ``kv_cache_dtype`` says which float8 their bytes are."""
    q, k, v, _, _, slots = case(skip=())
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    scale = torch.tensor([0.01], device=DEVICE)
    stored = {}
    for kv_cache_dtype, cache_dtype in (("fp8_e5m2", torch.uint8), ("auto", E5M2), ("fp8", torch.uint8),
                                        ("fp8_e4m3", E4M3)):
        k_cache, v_cache = (torch.zeros(3, 4, 2, 16, device=DEVICE, dtype=cache_dtype) for _ in range(2))
        ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                               slot_mapping=slots, k_scale=scale, v_scale=scale, kv_cache_dtype=kv_cache_dtype)
        stored[kv_cache_dtype] = v_cache.view(torch.uint8)
    assert torch.equal(stored["fp8_e5m2"], stored["auto"])
    assert torch.equal(stored["fp8"], stored["fp8_e4m3"])
    assert not torch.equal(stored["fp8"], stored["fp8_e5m2"])


@pytest.mark.parametrize("cache_dtype", [E4M3, INT8])
@pytest.mark.parametrize("one_element", [(1,), (), (1, 1)], ids=["1", "0d", "1x1"])
@pytest.mark.parametrize("per_head", ["v", "k"])
def test_per_head_and_per_tensor_scales_mix(per_head, one_element, cache_dtype):
    """A one-element scale beside a per-head one (either way round, of any one-element shape): each is read as
    given, so each head of each cache holds its values over its own scale (the one-element one read for every
    head: a stride of 0, not the element after it, which a larger buffer holds here)."""
    q, k, v, (k_cache, v_cache), _, slots = case(cache_dtype=cache_dtype, skip=())
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    one = torch.tensor([0.05, 1e-30], device=DEVICE)[:1].view(one_element)  # a trap beyond its one element
    heads = torch.tensor([0.02, 0.5], device=DEVICE)
    k_scale, v_scale = (one, heads) if per_head == "v" else (heads, one)
    ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                           k_scale=k_scale, v_scale=v_scale)
    k_rotated = ref.rope_table(k.double().cpu(), cos.cpu(), sin.cpu(), torch.arange(k.shape[0]))
    for stored, values, scale in ((k_cache, k_rotated, k_scale), (v_cache, v.double().cpu(), v_scale)):
        got = stored.view(-1, 2, 16)[slots].cpu()
        quotient = (values / scale.cpu().double().reshape(-1)[:, None]).clamp(*RANGES[cache_dtype])  # saturating
        if stored is k_cache:  # rotated in float32: its quotient may round to the format's neighbour
            error = (got.double() - quotient).abs()
            assert bool((error <= spacing(quotient, cache_dtype) / 2 + 1e-3 * (1 + quotient.abs())).all())
        else:
            assert torch.equal(got.double(), ref.quantise(v.double().cpu(), scale.cpu().reshape(-1)[:, None].double(),
                                                          cache_dtype).double())


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_a_float8_q_reads_back_within_half_a_spacing(fmt, backend):
    """q_dtype: q rotated (and QK-normed) straight into float8 at one scale, as float8 attention takes it; read back
    as stored × q_scale, within half a spacing (plus float32 math) of the float64 truth; the tail too."""
    q_dtype = FORMATS[fmt][0]
    q, k, v, (k_cache, v_cache), _, slots = case(cache_dtype=torch.bfloat16)
    weight = torch.rand(16, device=DEVICE) + 0.5
    cos, sin = ropekit.cos_sin_table(16, 8, device=DEVICE)  # partial rotary: the tail is quantised too
    q_scale = torch.tensor([0.02], device=DEVICE)
    out_q, _ = ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      slot_mapping=slots, positions=3, q_weight=weight, k_weight=weight,
                                      q_dtype=q_dtype, q_scale=q_scale)
    assert out_q.dtype == q_dtype and out_q.shape == (1, *q.shape)
    positions = torch.arange(3, 3 + q.shape[0])
    truth = ref.rope_table(ref.rms_norm(q, weight, eps=1e-6), cos, sin, positions)
    quotient = truth / 0.02
    error = (ref.dequantise(out_q[0], 0.02) - truth).abs() / 0.02
    bound = spacing(quotient, q_dtype) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
    assert bool((error <= bound).all()), float((error / bound).max())


def near_midpoints(dtype: torch.dtype, scale: float, count: int = 32) -> torch.Tensor:
    """float32 values x whose product with the float32 reciprocal of ``scale`` and whose quotient by it (each rounded
    to float32) round to different values of the format: x within a few float32 spacings of ``scale`` times a
    midpoint between two of the format's values, kept where the two roundings part."""
    if dtype == INT8:
        grid = torch.arange(-100.0, 101.0, dtype=torch.float64)
    else:
        grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
        grid = grid[torch.isfinite(grid)].unique()
        grid = grid[(grid.abs() >= 0.25) & (grid.abs() <= 256)]
    middles = ((grid[1:] + grid[:-1]) / 2 * scale).float()
    middles = middles[middles != 0]  # (0's neighbours in bits are NaNs and the smallest subnormals)
    steps = torch.arange(-6, 7, dtype=torch.int32)
    x = (middles.view(torch.int32)[:, None] + steps[None, :]).view(torch.float32).flatten()
    inverse = torch.reciprocal(torch.tensor(scale, dtype=torch.float32))
    parted = ref.quantise(x * inverse, 1.0, dtype) != ref.quantise(x / scale, 1.0, dtype)  # (float32 quotients)
    return x[parted][:count]


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_tile_at_one_scale_turns_by_the_angles_over_the_scale(fmt, x_dtype, backend):
    """A float8 q, and k into a cache at one per-tensor scale, are rotated by cos and sin times the scale's
    reciprocal (float32, correctly rounded; the products in the math dtype): at position 0 (cos 1, sin 0) a rotated
    channel stores the format's rounding of x * (1 / scale), one float32 rounding (float64 inputs of float32 values:
    the product is exact, then rounded once). The values are chosen where that and the quotient x / scale store
    different values; the channels past rotary_dim store the quotient's, as does k written beside its own output (a
    second store of the rotated values)."""
    dtype, kv_cache_dtype = FORMATS[fmt]
    scale, rotary_dim = 7.0, 8
    x = near_midpoints(dtype, scale)
    assert x.numel() == 32
    tokens = 4
    values = torch.cat([x.view(tokens, 1, 8)] * 2, -1).to(DEVICE)  # each value rotated, and in the tail
    inverse = torch.reciprocal(torch.tensor(scale, dtype=torch.float32))
    turned, divided = (ref.quantise(quotients, 1.0, dtype) for quotients in (values.cpu() * inverse,
                                                                             values.cpu() / scale))
    want = torch.cat([turned[..., :rotary_dim], divided[..., rotary_dim:]], -1)
    cos, sin = ropekit.cos_sin_table(1, rotary_dim, device=DEVICE)
    one = torch.tensor([scale], device=DEVICE)
    for write_k in (False, True):
        k_cache = torch.zeros(tokens, 1, 1, 16, device=DEVICE, dtype=dtype)
        out_q, out_k = ropekit.rope_and_cache(
            values[None].to(x_dtype), values[None].to(x_dtype), None, cos, sin, k_cache=k_cache, slot_mapping=torch.arange(tokens,
            device=DEVICE), k_scale=one, kv_cache_dtype=kv_cache_dtype, positions=torch.zeros(
            1, tokens, dtype=torch.int64, device=DEVICE), rotary_dim=rotary_dim, write_k=write_k,
            **({} if dtype == INT8 else dict(q_dtype=dtype, q_scale=one)))
        stored = k_cache.view(tokens, 1, 16).cpu().double()
        assert torch.equal(stored, divided if write_k else want), write_k
        if dtype != INT8:
            assert torch.equal(out_q[0].cpu().double(), want)
    assert bool((turned[..., :rotary_dim] != divided[..., :rotary_dim]).all())


@pytest.mark.parametrize("bad,error,name", [
    (dict(q_dtype=torch.int8, q_scale="one"), TypeError, "q_dtype"),
    (dict(q_dtype=E4M3, q_scale="one", inplace=True), ValueError, "q_dtype"),
    (dict(q_scale="one"), ValueError, "q_scale"),
    (dict(q_dtype=E5M2, q_scale="two"), TypeError, "q_scale"),
    (dict(q_dtype=E5M2), TypeError, "q_scale"),
], ids=["int8", "inplace", "scale-without-dtype", "scale-shape", "no-scale"])
def test_a_float8_q_is_validated_by_name(bad, error, name):
    call = _valid_call(cache_dtype=torch.float32, dynamic=False)
    scales = {"one": torch.ones(1, device=DEVICE), "two": torch.ones(2, device=DEVICE)}
    call.update({key: scales.get(value, value) if isinstance(value, str) else value for key, value in bad.items()})
    before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(error, match=name):
        ropekit.rope_and_cache(**call)
    for key, t in before.items():
        assert torch.equal(call[key].view(torch.uint8), t.view(torch.uint8)), key


def test_torch_compile_fullgraph_writes_the_scales():
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(cache_dtype=INT8, dtype=torch.float32)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    ids = torch.tensor([[0, 3, 1, 15, 7, 2]], device=DEVICE)
    q_scale = torch.tensor([0.01], device=DEVICE)
    eager = [t.clone() for t in (k_cache, v_cache, *scale_caches)]

    def step(q, k, v, k_cache, v_cache, k_scales, v_scales, slots, ids):
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          positions=ids, k_scale_cache=k_scales, v_scale_cache=v_scales,
                                          kv_cache_dtype="int8_per_token_head", q_dtype=E5M2, q_scale=q_scale)
        return out_q.float() * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(q[None], k[None], v[None], k_cache, v_cache, *scale_caches, slots, ids)
    want = step(q[None], k[None], v[None], *eager, slots, ids)
    torch.testing.assert_close(got, want)
    for a, b in zip((k_cache, v_cache, *scale_caches), eager):
        assert torch.equal(a, b)


# --- a per-(token, head) scale cache allocated heads first, seen through its transposed view ----------------------

# a per-(token, head) scale in each format: vLLM's names, and the e5m2 cache ("auto": its dtype says) with scale caches
PER_TOKEN_HEAD = {"fp8_per_token_head": E4M3, "int8_per_token_head": INT8, "auto": E5M2}
# FlashInfer's page table over 3 blocks of 4 rows for 5 tokens (token 3 padding), and the flat slot
# (block * 4 + row) each token's row is: request 0 owns block 2, request 1 blocks 0 and 1
PAGE_TABLE = dict(kv_indices=[2, 0, 1], kv_indptr=[0, 1, 3], batch_indices=[0, 0, 1, -1, 1],
                  cache_positions=[0, 3, 4, 0, 6])
PAGE_TABLE_SLOTS = [8, 11, 4, -1, 6]


def page_table_on(device=DEVICE) -> dict:
    return {name: torch.tensor(values, device=device, dtype=torch.int32) for name, values in PAGE_TABLE.items()}


def float32_quotient(x, scale) -> torch.Tensor:
    """``x / scale`` as the quantising store divides: float32 operands, the quotient correctly rounded to float32
    (float64 values of it)."""
    return (x.float().cpu() / torch.as_tensor(scale).float().cpu()).double()


def heads_first(scale_caches):
    """Scale caches allocated ``(num_blocks, Hkv, block_size)`` with ``scale_caches``' values, as the
    ``.transpose(1, 2)`` views the call takes (``(num_blocks, block_size, Hkv)``, not contiguous)."""
    views = [s.transpose(1, 2).contiguous().transpose(1, 2) for s in scale_caches]
    assert all(not s.is_contiguous() and s.stride(1) == 1 for s in views)
    return views


def in_layout(cache, kv_layout):
    """An NHD cache's values allocated in ``kv_layout`` (HND: ``(num_blocks, Hkv, block_size, D)``)."""
    return cache.transpose(1, 2).contiguous() if kv_layout == "HND" else cache.clone()


def as_nhd(cache, kv_layout):
    return cache.transpose(1, 2) if kv_layout == "HND" else cache


def assert_per_token_head_reads_back(k_cache, v_cache, k_scales, v_scales, truth_k, truth_v, slots, cache_dtype):
    """The reference reader at each written token's slot (``(num_blocks, block_size, Hkv, D)`` caches and
    ``(num_blocks, block_size, Hkv)`` scales, any strides): k within half a spacing (plus float32 math) of the float64
    truth at its scale, v the format's rounding of the float32 quotient v / its scale (as the store divides: a
    quotient within float32's rounding of a tie of the format rounds from the float32 value), the scales max|x| / the
    format's largest."""
    hk, d = k_cache.shape[2:]
    written = slots[slots >= 0]
    k_scale, v_scale = (s.reshape(-1, hk)[written].double().cpu()[..., None] for s in (k_scales, v_scales))
    got_k = ref.dequantise(k_cache.reshape(-1, hk, d)[written], k_scale)
    quotient = truth_k / k_scale
    bound = spacing(quotient, cache_dtype) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
    assert bool(((got_k - truth_k).abs() / k_scale <= bound).all())
    torch.testing.assert_close(k_scale, ref.token_head_scale(truth_k, cache_dtype), rtol=1e-6, atol=0)
    assert torch.equal(v_scale, ref.token_head_scale(truth_v, cache_dtype))
    got_v = v_cache.reshape(-1, hk, v_cache.shape[-1])[written].double().cpu()
    assert torch.equal(got_v, ref.quantise(float32_quotient(truth_v, v_scale), 1.0, cache_dtype))


@pytest.mark.parametrize("kv_layout,address", [("NHD", "slot_mapping"), ("HND", "slot_mapping"),
                                               ("HND", "page_table")])
@pytest.mark.parametrize("kv_cache_dtype", list(PER_TOKEN_HEAD))
def test_a_scale_cache_allocated_heads_first_is_written_through_its_transposed_view(kv_cache_dtype, kv_layout,
                                                                                    address, backend):
    """docs/fused.md: a ``(num_blocks, Hkv, block_size)`` scale-cache allocation is passed as its ``.transpose(1, 2)``
    view. Written so (beside an NHD or an HND cache, through a slot mapping or FlashInfer's page table), the caches
    hold the bytes and the scales the values that the same call into NHD-allocated caches and scale caches writes;
    the reference reader finds each token's scale at ``[block, row, head]`` of the view (``[block, head, row]`` of
    the allocation) and reads back the float64 truth; every other slot keeps its bytes."""
    cache_dtype = PER_TOKEN_HEAD[kv_cache_dtype]
    hk = 3  # (3 heads: the allocation's strides differ from an NHD one's in every axis but the blocks')
    q, k, v, nhd_caches, nhd_scales, slots = case(tokens=5, hk=hk, cache_dtype=cache_dtype, skip=(3,))
    if address == "page_table":
        at = page_table_on()
        slots = torch.tensor(PAGE_TABLE_SLOTS, device=DEVICE)
    else:
        at = dict(slot_mapping=slots)
    caches = [in_layout(c, kv_layout) for c in nhd_caches]
    scales = heads_first(nhd_scales)
    before = [t.clone() for t in (*nhd_caches, *nhd_scales)]
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    positions = torch.tensor([[0, 3, 1, 15, 7]], device=DEVICE)

    def call(caches, scales, kv_layout):
        return ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=caches[0], v_cache=caches[1],
                                      k_scale_cache=scales[0], v_scale_cache=scales[1], positions=positions,
                                      kv_cache_dtype=kv_cache_dtype, kv_layout=kv_layout, **at)[0]

    want_q = call(nhd_caches, nhd_scales, "NHD")
    got_q = call(caches, scales, kv_layout)
    assert torch.equal(got_q, want_q)
    for got, want in zip(caches, nhd_caches):
        assert torch.equal(as_nhd(got, kv_layout).view(torch.uint8), want.view(torch.uint8))
    for got, want in zip(scales, nhd_scales):
        assert torch.equal(got, want)
    keep = (slots >= 0).cpu()
    assert_per_token_head_reads_back(*(as_nhd(c, kv_layout) for c in caches), *scales,
                                     ref.rope_table(k, cos, sin, positions[0].cpu())[keep], v.double().cpu()[keep],
                                     slots, cache_dtype)
    for b, a in zip(before, (*(as_nhd(c, kv_layout) for c in caches), *scales)):
        assert_untouched(b, a, slots)


def assert_float8_q_reads_back(out_q, truth, q_scale: float, q_dtype):
    """A float8 q read back as stored x q_scale: within half a spacing (plus float32 math) of the float64 truth."""
    quotient = truth / q_scale
    error = (ref.dequantise(out_q, q_scale) - truth).abs() / q_scale
    bound = spacing(quotient, q_dtype) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
    assert bool((error <= bound).all()), float((error / bound).max())


def test_torch_compile_fullgraph_writes_a_heads_first_scale_cache_and_a_float8_q():
    """torch.compile(fullgraph=True) of FlashInfer's form beside vLLM's per-(token, head) scales: an HND float8 cache
    through the page table, the scales written through the transposed views of ``(num_blocks, Hkv, block_size)``
    allocations (graph inputs the custom op mutates, not contiguous), and a float8 q at a device-resident q_scale:
    the eager call's bytes, and the reference reader's values."""
    hk = 3
    q, k, v, nhd_caches, nhd_scales, _ = case(tokens=5, hk=hk, cache_dtype=E4M3)
    table, slots = page_table_on(), torch.tensor(PAGE_TABLE_SLOTS, device=DEVICE)
    caches, scales = [in_layout(c, "HND") for c in nhd_caches], heads_first(nhd_scales)
    eager_caches, eager_scales = [c.clone() for c in caches], heads_first(nhd_scales)
    before = [t.clone() for t in (*nhd_caches, *nhd_scales)]
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    positions = torch.tensor([[0, 3, 1, 15, 7]], device=DEVICE)
    q_scale = torch.tensor([0.02], device=DEVICE)

    def step(q, k, v, k_cache, v_cache, k_scales, v_scales, positions, q_scale, kv_indices, kv_indptr, batch_indices,
             cache_positions):
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, kv_layout="HND",
                                          k_scale_cache=k_scales, v_scale_cache=v_scales, positions=positions,
                                          kv_cache_dtype="fp8_per_token_head", q_dtype=E4M3, q_scale=q_scale,
                                          kv_indices=kv_indices, kv_indptr=kv_indptr, batch_indices=batch_indices,
                                          cache_positions=cache_positions)
        return out_q

    want_q = step(q[None], k[None], v[None], *eager_caches, *eager_scales, positions, q_scale, *table.values())
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got_q = compiled(q[None], k[None], v[None], *caches, *scales, positions, q_scale, *table.values())
    assert got_q.dtype == E4M3 and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    for a, b in zip(caches, eager_caches):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    for a, b in zip(scales, eager_scales):
        assert torch.equal(a, b)
    pos = positions[0].cpu()
    assert_float8_q_reads_back(got_q[0], ref.rope_table(q, cos, sin, pos), 0.02, E4M3)
    keep = (slots >= 0).cpu()
    nhd_views = [as_nhd(c, "HND") for c in caches]
    assert_per_token_head_reads_back(*nhd_views, *scales, ref.rope_table(k, cos, sin, pos)[keep],
                                     v.double().cpu()[keep], slots, E4M3)
    for b, a in zip(before, (*nhd_views, *scales)):
        assert_untouched(b, a, slots)


@pytest.mark.backend("triton")
def test_a_repeated_call_reads_new_scales_and_indices_through_its_plan(monkeypatch):
    """What a CUDA graph replays is the planned launch: a repeated call signature goes straight to it (validation not
    run), and it reads q_scale, the static k and v scales, the positions and the slot mapping where they lie, so new
    values written into them in place are the ones used: the float8 q and the float8 caches hold the bytes the native
    backend writes from the new values, and read back to the float64 truth."""
    from ropekit.fused import validate

    q, k, v, (k_cache, v_cache), _, slots = case(tokens=5, cache_dtype=E4M3, skip=(1,))
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    positions = torch.tensor([[0, 3, 1, 15, 7]], device=DEVICE)
    q_scale, k_scale, v_scale = (torch.tensor([s], device=DEVICE) for s in (0.05, 0.04, 0.1))

    def call(k_cache, v_cache):
        return ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      slot_mapping=slots, positions=positions, k_scale=k_scale, v_scale=v_scale,
                                      q_dtype=E5M2, q_scale=q_scale)[0]

    call(k_cache, v_cache)  # validated, planned
    monkeypatch.setattr(validate, "rotary_arguments", lambda *a: (_ for _ in ()).throw(AssertionError("validated")))
    positions.copy_(torch.tensor([[30, 2, 9, 0, 21]]))
    slots.copy_(torch.tensor([11, -1, 0, 5, 7]))
    for scale, value in ((q_scale, 0.02), (k_scale, 0.015), (v_scale, 0.03)):
        scale.fill_(value)
    before = [c.clone() for c in (k_cache, v_cache)]
    native = [c.clone() for c in before]
    got_q = call(k_cache, v_cache)
    monkeypatch.undo()
    with ropekit.device.set_backend("native"):
        want_q = call(*native)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    for a, b in zip((k_cache, v_cache), native):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    pos = positions[0].cpu()
    assert_float8_q_reads_back(got_q[0], ref.rope_table(q, cos, sin, pos), 0.02, E5M2)
    keep, written = (slots >= 0).cpu(), slots[slots >= 0]
    truth_k = ref.rope_table(k, cos, sin, pos)[keep]
    quotient = (truth_k / 0.015).clamp(-448.0, 448.0)  # (the store saturates at e4m3's largest value)
    bound = spacing(quotient, E4M3) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
    assert bool(((ref.dequantise(k_cache.view(-1, 2, 16)[written], 1.0) - quotient).abs() <= bound).all())
    assert torch.equal(v_cache.view(-1, 2, 16)[written].double().cpu(),
                       ref.quantise(float32_quotient(v.double().cpu()[keep], v_scale), 1.0, E4M3))
    for b, a in zip(before, (k_cache, v_cache)):
        assert_untouched(b, a, slots)


@gpu_only
@pytest.mark.parametrize("kv_cache_dtype,kv_layout", [("auto", "NHD"), ("fp8_e4m3", "HND"),
                                                      ("fp8_per_token_head", "HND"), ("int8_per_token_head", "NHD")])
@pytest.mark.parametrize("q_fmt", ["e4m3", "e5m2"])
def test_cuda_graph_float8_q_replays_with_new_positions_slots_and_scales(q_fmt, kv_cache_dtype, kv_layout):
    """A decode step writing a float8 q (``q_dtype``, ``q_scale``) beside a bf16, float8 or int8 cache, captured once:
    between replays q_scale, the static k and v scales, the positions, the slots and the inputs change in place
    (device-resident; per (token, head), the scales are written through transposed views of ``(num_blocks, Hkv,
    block_size)`` allocations). Each replay writes the eager call's bytes (q, caches, scales) and q and k read back
    to the float64 truth."""
    batch, hq, hk, d, block, num_blocks = 64, 32, 8, 128, 16, 64
    q_dtype = FORMATS[q_fmt][0]
    cache_dtype = {"auto": torch.bfloat16, "fp8_e4m3": E4M3, "fp8_per_token_head": E4M3,
                   "int8_per_token_head": INT8}[kv_cache_dtype]
    per_token_head = kv_cache_dtype.endswith("per_token_head")
    q, k, v = (torch.randn(batch, 1, h, d, device=DEVICE, dtype=torch.bfloat16) for h in (hq, hk, hk))
    caches = [in_layout(torch.zeros(num_blocks, block, hk, d, device=DEVICE, dtype=cache_dtype), kv_layout)
              for _ in range(2)]
    if per_token_head:
        scale_caches = heads_first([torch.zeros(num_blocks, block, hk, device=DEVICE) for _ in range(2)])
        scales = dict(k_scale_cache=scale_caches[0], v_scale_cache=scale_caches[1])
    else:
        scales = dict(k_scale=torch.tensor([0.02], device=DEVICE), v_scale=torch.tensor([0.05], device=DEVICE))
    q_scale = torch.tensor([0.02], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8192, d, base=500000.0, device=DEVICE)
    positions = torch.randint(0, 8192, (batch,), device=DEVICE)
    slots = torch.randperm(num_blocks * block, device=DEVICE)[:batch]
    out = {}

    def step(k_cache=caches[0], v_cache=caches[1], scales=scales):
        return ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                      positions=positions, kv_layout=kv_layout, kv_cache_dtype=kv_cache_dtype,
                                      q_dtype=q_dtype, q_scale=q_scale, **scales)[0]

    graph = cuda_graph_of(lambda: out.__setitem__("q", step()))
    for replay in range(3):
        positions.copy_(torch.randint(0, 8192, (batch,), device=DEVICE))
        slots.copy_(torch.randperm(num_blocks * block, device=DEVICE)[:batch])
        slots[replay] = -1
        q_scale.fill_((0.03, 0.05, 0.5)[replay])  # |q| < 6 stays inside e4m3's range
        if not per_token_head:
            scales["k_scale"].fill_((0.03, 0.1, 1.0)[replay])
            scales["v_scale"].fill_((0.02, 0.04, 0.2)[replay])
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        before = [as_nhd(c, kv_layout).clone() for c in caches]
        eager_caches = [c.clone() for c in caches]
        eager_scales = dict(zip(scales, heads_first(list(scales.values())))) if per_token_head else scales
        want_q = step(*eager_caches, eager_scales)
        graph.replay()
        torch.cuda.synchronize()
        assert out["q"].dtype == q_dtype and torch.equal(out["q"].view(torch.uint8), want_q.view(torch.uint8))
        for a, b in zip(caches, eager_caches):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if per_token_head:
            for name in scales:
                assert torch.equal(scales[name], eager_scales[name])
        pos = ref.token_positions(batch, 1, offsets=positions.cpu())
        assert_float8_q_reads_back(out["q"], ref.rope_table(q, cos, sin, pos), float(q_scale), q_dtype)
        keep, written = (slots >= 0).cpu(), slots[slots >= 0]
        truth_k = ref.rope_table(k, cos, sin, pos)[:, 0][keep]
        k_cache, v_cache = (as_nhd(c, kv_layout) for c in caches)
        if per_token_head:
            assert_per_token_head_reads_back(k_cache, v_cache, *scale_caches, truth_k,
                                             v[:, 0].double().cpu()[keep], slots, cache_dtype)
        else:
            stored_k, stored_v = (c.reshape(-1, hk, d)[written] for c in (k_cache, v_cache))
            truth_v = v[:, 0].double().cpu()[keep]
            if cache_dtype == torch.bfloat16:
                assert_close_to_reference(stored_k, truth_k)
                assert torch.equal(stored_v.double().cpu(), truth_v)
            else:
                quotient = truth_k / float(scales["k_scale"])
                bound = spacing(quotient, cache_dtype) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)
                assert bool(((ref.dequantise(stored_k, 1.0) - quotient).abs() <= bound).all())
                assert torch.equal(stored_v.double().cpu(),
                                   ref.quantise(float32_quotient(truth_v, scales["v_scale"]), 1.0, cache_dtype))
        for b, a in zip(before, (k_cache, v_cache)):
            assert_untouched(b, a, slots)


# --- validation -------------------------------------------------------------------------------------------------------

def _valid_call(cache_dtype=E4M3, dynamic=True):
    q, k, v, (k_cache, v_cache), scale_caches, slots = case(cache_dtype=cache_dtype, dtype=torch.float32)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    call = dict(q=q[None], k=k[None], v=v[None], cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=slots)
    if dynamic:
        call.update(k_scale_cache=scale_caches[0], v_scale_cache=scale_caches[1])
    return call


BAD = [
    ("kv_cache_dtype", "fp8_inc", ValueError, dict()),
    ("kv_cache_dtype", "nvfp4", TypeError, dict()),  # the cache is e4m3, not NVFP4's bytes
    ("kv_cache_dtype", "fp8_e5m2", TypeError, dict()),  # the cache is e4m3
    ("kv_cache_dtype", 8, ValueError, dict()),
    ("kv_cache_dtype", "fp8_per_token_head", ValueError, dict(dynamic=False, scales=True)),
    ("k_scale_cache", "float16", TypeError, dict()),
    ("k_scale_cache", "shape", ValueError, dict()),
    ("v_scale_cache", "shape", ValueError, dict()),
    ("v_scale_cache", None, ValueError, dict()),
    ("k_scale_cache", "plain cache", ValueError, dict(cache_dtype=torch.float32)),
    ("k_scale", "three", TypeError, dict(dynamic=False)),
    ("k_scale_cache", "aliases v_scale_cache", ValueError, dict()),
    ("k_cache", "int16", TypeError, dict()),
]


@pytest.mark.parametrize("name,bad,error,setup", BAD, ids=[f"{n}-{b}" for n, b, _, _ in BAD])
def test_errors_name_the_argument_and_write_nothing(name, bad, error, setup):
    setup = dict(setup)
    scales = setup.pop("scales", False)
    call = _valid_call(**setup)
    if scales or name == "k_scale":
        call.update(k_scale=torch.ones(1, device=DEVICE), v_scale=torch.ones(1, device=DEVICE))
    swaps = {"float16": lambda: call[name].half(), "shape": lambda: call[name][:, :2],
             "three": lambda: torch.ones(3, device=DEVICE),
             "plain cache": lambda: torch.zeros(3, 4, 2, device=DEVICE),
             "aliases v_scale_cache": lambda: call["v_scale_cache"],
             "int16": lambda: call["k_cache"].view(torch.uint8).to(torch.int16)}
    call[name] = swaps[bad]() if isinstance(bad, str) and bad in swaps else bad
    before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(error, match=name):
        ropekit.rope_and_cache(**call)
    for key, t in before.items():
        assert torch.equal(call[key].view(torch.uint8), t.view(torch.uint8)), key


# --- NVFP4 ------------------------------------------------------------------------------------------------------------

def nvfp4_case(tokens=6, hk=2, d=64, num_blocks=3, block_size=4, kv_layout="NHD", skip=(2,)):
    """bf16 q, k, v; NVFP4 caches ``(blocks, rows, hk, d / 2)`` bytes and block-scale caches ``(blocks, rows, hk,
    d / 16)`` e4m3 (HND: heads second), all filled with sentinel bytes; a slot mapping with padding tokens."""
    q, k, v = (torch.randn(tokens, h, d, device=DEVICE).to(torch.bfloat16) * 3 for h in (3, hk, hk))
    shape = (num_blocks, hk, block_size) if kv_layout == "HND" else (num_blocks, block_size, hk)
    caches = [torch.randint(0, 256, (*shape, d // 2), device=DEVICE, dtype=torch.uint8) for _ in range(2)]
    block_scales = [torch.randint(0, 100, (*shape, d // 16), device=DEVICE, dtype=torch.uint8).view(E4M3)
                    for _ in range(2)]
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[list(skip)] = -1
    return q, k, v, caches, block_scales, slots.to(DEVICE)


def at_slots(cache, slots, kv_layout):
    """The written tokens' rows of a cache or block-scale cache ``(written, hk, ...)``, NHD or HND."""
    nhd = cache.transpose(1, 2) if kv_layout == "HND" else cache
    return nhd.reshape(-1, *nhd.shape[2:])[slots[slots >= 0]]


def assert_nvfp4_reads_back(stored, block_scales, global_scale, truth):
    """The reader (e2m1 x block scale x global scale) within half an e2m1 spacing of the float64 truth, at the
    block's scale (plus the float32 math's error)."""
    read = ref.nvfp4_dequantise(stored, block_scales, global_scale)
    scale = (block_scales.cpu().view(E4M3).double() * float(global_scale)).repeat_interleave(16, -1)
    quotient = truth / scale
    error = (read - truth).abs() / scale
    bound = ref.e2m1_spacing(quotient) / 2 + 1e-5 * quotient.abs().clamp(min=1)
    assert bool((error <= bound).all()), float((error / bound).max())


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("pairing,rotary_dim", [("neox", 64), ("neox", 32), ("gptj", 48)],
                         ids=["neox-full", "neox-partial", "gptj-partial"])
def test_nvfp4_reader_round_trip(pairing, rotary_dim, kv_layout, backend):
    """Write NVFP4 with ropekit, read back as FlashInfer's attention reads it (e2m1 x e4m3 block scale x global
    scale, found at the token's slot): k within half an e2m1 spacing of the float64 truth at its block's scale, the
    block scales e4m3(amax / (6 global)) of the truth; v (passed through) byte for byte the float64 reference's;
    every other slot untouched."""
    hk, d = 2, 64
    q, k, v, (k_cache, v_cache), (k_blocks, v_blocks), slots = nvfp4_case(hk=hk, d=d, kv_layout=kv_layout)
    before = [t.clone() for t in (k_cache, v_cache, k_blocks, v_blocks)]
    cos, sin = ropekit.cos_sin_table(32, rotary_dim, device=DEVICE)
    positions = torch.tensor([0, 3, 1, 31, 7, 2], device=DEVICE)
    k_scale, v_scale = torch.tensor([2.0**-6], device=DEVICE), torch.tensor([2.0**-7], device=DEVICE)
    ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                           k_scale=k_scale, v_scale=v_scale, k_scale_cache=k_blocks, v_scale_cache=v_blocks,
                           kv_cache_dtype="nvfp4", kv_layout=kv_layout, positions=positions, layout="thd",
                           cu_seqlens=torch.tensor([0, 6], device=DEVICE), max_seqlen=6,
                           interleaved=pairing == "gptj")
    written = (slots >= 0).cpu()
    truth_k = ref.rope_table(k, cos, sin, positions.cpu(), interleaved=pairing == "gptj")[written]
    stored_k, blocks_k = at_slots(k_cache, slots, kv_layout), at_slots(k_blocks, slots, kv_layout)
    assert_nvfp4_reads_back(stored_k, blocks_k, 2.0**-6, truth_k)
    want_blocks = ref.nvfp4_quantise(truth_k, 2.0**-6)[1]
    assert bool(((blocks_k.cpu().double() - want_blocks).abs() <= ref.e4m3(want_blocks).abs() / 8).all())
    values, blocks = ref.nvfp4_quantise(v.double().cpu()[written], 2.0**-7)
    assert torch.equal(at_slots(v_blocks, slots, kv_layout).cpu().double(), blocks)
    assert torch.equal(ref.nvfp4_dequantise(at_slots(v_cache, slots, kv_layout), blocks.to(E4M3), 2.0**-7),
                       values * blocks.repeat_interleave(16, -1) * 2.0**-7)
    for b, a in zip(before, (k_cache, v_cache, k_blocks, v_blocks)):
        assert_untouched(*(t.transpose(1, 2) if kv_layout == "HND" else t for t in (b, a)), slots)


def test_nvfp4_a_zero_block_scale_stores_zeros_of_the_values_signs(backend):
    """A block whose amax / (6 global) rounds to e4m3's zero (values up to 0.5 at a global scale of 100: 8.3e-4,
    below half e4m3's smallest subnormal) stores the scale 0 and zeros of its values' signs (a NaN a zero), where
    e2m1 of the values themselves would not be zero; a block beside it at a normal scale stores its codes. (A
    negative NaN's sign is not asked for: a GPU's arithmetic returns its canonical, positive NaN.)"""
    v = torch.tensor([0.5, -0.5, 0.4, -0.3, float("nan"), -0.2, 0.0, -0.0] * 2 + [600.0, -300.0] * 8)
    v = v.view(1, 1, 1, 32).to(DEVICE)
    k = torch.zeros_like(v)
    k_cache, v_cache = (torch.full((1, 1, 1, 16), 0x77, dtype=torch.uint8, device=DEVICE) for _ in range(2))
    k_blocks, v_blocks = (torch.full((1, 1, 1, 2), 0x33, dtype=torch.uint8, device=DEVICE).view(E4M3)
                          for _ in range(2))
    g = torch.tensor([100.0], device=DEVICE)
    ropekit.rope_and_cache(k, k, v, *ropekit.cos_sin_table(1, 32, device=DEVICE), k_cache=k_cache, v_cache=v_cache,
                           slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE), k_scale=g, v_scale=g,
                           k_scale_cache=k_blocks, v_scale_cache=v_blocks, kv_cache_dtype="nvfp4")
    assert v_blocks.view(torch.uint8).flatten().tolist() == [0, 0x38]  # 0; e4m3(600 / 600) = 1.0
    nibbles = [0x0, 0x8, 0x0, 0x8, 0x0, 0x8, 0x0, 0x8] * 2 + [0x7, 0xD] * 8  # -300 / 100 = -3: code 5, signed
    want = [low | high << 4 for low, high in zip(nibbles[0::2], nibbles[1::2])]
    assert v_cache.flatten().tolist() == want


def test_nvfp4_both_backends_store_the_same_bytes():
    """The native backend and the Triton kernel write the same NVFP4 bytes and block scales, through FlashInfer's
    page table into an HND cache, GPT-J pairing, partial rotary, QK-norm and a float8 q beside it."""
    q, k, v, caches, blocks, _ = nvfp4_case(tokens=5, d=48, kv_layout="HND")
    weight = torch.rand(48, device=DEVICE) + 0.5
    cos, sin = ropekit.cos_sin_table(16, 32, device=DEVICE)
    page_table = dict(kv_indices=torch.tensor([2, 0, 1], device=DEVICE), kv_indptr=torch.tensor([0, 1, 3],
                                                                                                 device=DEVICE),
                      batch_indices=torch.tensor([0, 0, 1, -1, 1], device=DEVICE),
                      cache_positions=torch.tensor([0, 3, 4, 0, 6], device=DEVICE))
    written = {}
    for backend in ropekit.device.BACKENDS:
        outputs = [t.clone() for t in (*caches, *blocks)]
        with ropekit.device.set_backend(backend):
            out_q, _ = ropekit.rope_and_cache(
                q, k, v, cos, sin, k_cache=outputs[0], v_cache=outputs[1], k_scale_cache=outputs[2],
                v_scale_cache=outputs[3], k_scale=torch.tensor([0.003], device=DEVICE),
                v_scale=torch.tensor([0.01], device=DEVICE), kv_cache_dtype="nvfp4", kv_layout="HND",
                positions=torch.tensor([[1, 2, 3, 4, 5]], device=DEVICE), layout="thd",
                cu_seqlens=torch.tensor([0, 5], device=DEVICE), max_seqlen=5, interleaved=True, q_weight=weight,
                k_weight=weight, q_dtype=E4M3, q_scale=torch.tensor([0.02], device=DEVICE), **page_table)
        written[backend] = [t.view(torch.uint8) for t in (out_q, *outputs)]
    for native, kernel in zip(*written.values()):
        assert torch.equal(native, kernel)


@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head", "nvfp4", "fp8", "auto"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_v_in_programs_of_its_own_stores_the_same_bytes(kv_cache_dtype, kv_layout):
    """v's head vectors in programs of their own (``FusedConfig.v_apart``, the model's choice at decode where the
    cache's scales are reduced, and at a plain prefill with a scale per (token, head)) or in k's programs: the same
    caches, scale caches and q, byte for byte, through a slot mapping with padding tokens (and, HND, a page table)
    into 3 kv heads, so that a head block is partial."""
    from ropekit.triton.configs import FusedConfig
    from ropekit.triton.fused import forced_fused_config

    nvfp4 = kv_cache_dtype == "nvfp4"
    if nvfp4:
        q, k, v, caches, scale_caches, slots = nvfp4_case(tokens=5, hk=3, d=32, kv_layout=kv_layout)
    else:
        cache_dtype = {"int8_per_token_head": INT8, "auto": torch.bfloat16}.get(kv_cache_dtype, E4M3)
        q, k, v, caches, scale_caches, slots = case(tokens=5, hk=3, d=16, cache_dtype=cache_dtype)
        if kv_layout == "HND":
            caches = [c.transpose(1, 2).contiguous() for c in caches]  # (blocks, heads, rows, channels)
    per_token_head = kv_cache_dtype.endswith("per_token_head") or nvfp4
    kwargs = dict(kv_cache_dtype=kv_cache_dtype)
    if kv_cache_dtype in ("fp8", "nvfp4"):
        kwargs.update(k_scale=torch.tensor([0.03], device=DEVICE), v_scale=torch.tensor([0.07], device=DEVICE))
    if kv_layout == "HND":  # through FlashInfer's page table, the caches' heads second
        kwargs.update(kv_layout="HND", kv_indices=torch.tensor([2, 0, 1], device=DEVICE),
                      kv_indptr=torch.tensor([0, 1, 3], device=DEVICE),
                      batch_indices=torch.tensor([0, 0, 1, -1, 1], device=DEVICE),
                      cache_positions=torch.tensor([0, 3, 4, 0, 6], device=DEVICE))
    else:
        kwargs.update(slot_mapping=slots)
    cos, sin = ropekit.cos_sin_table(16, q.shape[-1], device=DEVICE)
    written = []
    for v_apart in (False, True):
        outputs = [t.clone() for t in (*caches, *scale_caches)]
        call = dict(kwargs, **(dict(k_scale_cache=outputs[2], v_scale_cache=outputs[3]) if per_token_head else {}))
        with ropekit.device.set_backend("triton"), forced_fused_config(FusedConfig(1, 2, 4, v_apart=v_apart)):
            out_q, _ = ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=outputs[0],
                                              v_cache=outputs[1], positions=torch.arange(5, device=DEVICE)[None],
                                              **call)
        written.append([t.view(torch.uint8) for t in (out_q, *outputs)])
    for apart, together in zip(*written):
        assert torch.equal(apart, together)
    assert not torch.equal(written[1][2], caches[1].view(torch.uint8))  # v was written at all


E2M1_ROUNDING = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, float("nan"), 0.2, 0.3, -5.1, 2.9, 1.0, 0.5]
E2M1_STORED = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, 0.0, 0.0, 0.5, -6.0, 3.0, 1.0, 0.5]


def nvfp4_v_round_trip(values: torch.Tensor, global_scale: float = 1.0) -> tuple[list, torch.Tensor]:
    """``values`` ``(heads, 16)`` as one token's v (k zero) through ``rope_and_cache`` into an NVFP4 cache at
    ``global_scale`` (the block-scale caches filled with 0x55 first, so an unwritten scale shows): (the heads' block
    scales as e4m3 values, the v values read back in float64, over the global scale)."""
    heads = values.shape[0]
    v = values.view(1, 1, heads, 16).to(DEVICE)
    k = torch.zeros_like(v)
    caches = [torch.zeros(1, 1, heads, 8, device=DEVICE, dtype=torch.uint8) for _ in range(2)]
    blocks = [torch.full((1, 1, heads, 1), 0x55, device=DEVICE, dtype=torch.uint8) for _ in range(2)]
    one = torch.ones(1, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], k_scale_cache=blocks[0],
                           v_scale_cache=blocks[1], k_scale=one, v_scale=one * global_scale, kv_cache_dtype="nvfp4",
                           slot_mapping=torch.zeros(1, dtype=torch.int64, device=DEVICE), interleaved=True)
    return blocks[1].view(E4M3).flatten().tolist(), ref.nvfp4_dequantise(caches[1][0, 0], blocks[1][0, 0], 1.0)


def test_nvfp4_rounding_of_the_format(backend):
    """v passes through: a block whose amax is 6 at global scale 1 has block scale 1, so its stored values are e2m1's
    own rounding: to nearest, ties to the even code (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4), saturating at 6,
    signed zeros, NaN as zero (and not counted in amax); a block of zeros gets block scale 0 and stores zeros of its
    signs."""
    block_scales, read = nvfp4_v_round_trip(torch.tensor([E2M1_ROUNDING, [0.0] * 8 + [-0.0] * 8]))
    assert block_scales == [1.0, 0.0]
    want = torch.tensor([E2M1_STORED, [0.0] * 8 + [-0.0] * 8], dtype=torch.float64)
    assert torch.equal(read, want) and torch.equal(torch.signbit(read), torch.signbit(want))


def test_nvfp4_rounding_next_to_every_midpoint(backend):
    """One float32 ulp either side of each midpoint between e2m1's magnitudes (and on it), both signs, in blocks whose
    amax is 6 (block scale 1 at global scale 1): the stored values are the float64 reference's e2m1 rounding."""
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = torch.cat([torch.nextafter(midpoints, torch.tensor(0.0)), midpoints,
                      torch.nextafter(midpoints, torch.tensor(8.0))])
    sixes = torch.tensor([[6.0, -6.0]]).expand(3, 2)
    values = torch.cat([torch.cat([near, -near]).view(3, 14), sixes], 1)  # 3 blocks of 16, each with amax 6
    block_scales, read = nvfp4_v_round_trip(values)
    assert block_scales == [1.0, 1.0, 1.0]
    want = ref.e2m1(values.double())
    assert torch.equal(read, want) and torch.equal(torch.signbit(read), torch.signbit(want))


def test_nvfp4_a_quotient_past_float32_saturates(backend):
    """At a small global scale a block's e4m3 scale saturates at 448, and a value's quotient by 448 x the global
    scale can lie past float32's range: it stores e2m1's largest magnitude, 6, of its sign (not NaN's zero). The
    native backend; the Triton kernels' known limit is an expected failure."""
    values = torch.tensor([3.4e38, -3.4e38, 2e38, -2e38, 1e37, -1e37, 0.0, -0.0] * 2).view(1, 16)
    block_scales, read = nvfp4_v_round_trip(values, global_scale=1e-10)
    assert block_scales == [448.0]
    global_scale = torch.tensor(1e-10, dtype=torch.float32).double()  # as the kernel reads it
    want = ref.nvfp4_quantise(values, global_scale.item())[0]
    assert want[0, :4].abs().tolist() == [6.0] * 4
    past = (values.double() / (448 * global_scale)).abs() > FLOAT32_MAX
    assert_saturates_past_float32(read, want * 448, past, backend)
    assert torch.equal(torch.signbit(read), torch.signbit(want))


def test_nvfp4_under_torch_compile_fullgraph_writes_the_block_scales():
    q, k, v, (k_cache, v_cache), (k_blocks, v_blocks), slots = nvfp4_case(d=32)
    cos, sin = ropekit.cos_sin_table(16, 32, device=DEVICE)
    ids = torch.tensor([[0, 3, 1, 15, 7, 2]], device=DEVICE)
    scale = torch.tensor([0.002], device=DEVICE)
    eager = [t.clone() for t in (k_cache, v_cache, k_blocks, v_blocks)]

    def step(q, k, v, k_cache, v_cache, k_blocks, v_blocks):
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          positions=ids, k_scale_cache=k_blocks, v_scale_cache=v_blocks,
                                          k_scale=scale, v_scale=scale, kv_cache_dtype="nvfp4")
        return out_q.float() * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(q[None], k[None], v[None], k_cache, v_cache, k_blocks, v_blocks)
    want = step(q[None], k[None], v[None], *eager)
    torch.testing.assert_close(got, want)
    for a, b in zip((k_cache, v_cache, k_blocks, v_blocks), eager):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


NVFP4_BAD = [
    ("k", "head size 40", dict(d=40)),
    ("v", "head size 40", dict(v_dim=40)),
    ("rotary_dim", "neox 48", dict(rotary_dim=48)),
    ("k_scale_cache", None, dict()),
    ("k_scale_cache", "float32", dict()),
    ("k_scale_cache", "shape", dict()),
    ("v_scale_cache", "shape", dict()),
    ("k_scale", "per head", dict()),
    ("k_scale", None, dict()),
    ("k_cache", "unpacked", dict()),
]


@pytest.mark.parametrize("name,bad,setup", NVFP4_BAD, ids=[f"{n}-{b}" for n, b, _ in NVFP4_BAD])
def test_nvfp4_errors_name_the_argument_and_write_nothing(name, bad, setup):
    d, v_dim, rotary_dim = setup.get("d", 64), setup.get("v_dim", 64), setup.get("rotary_dim", 32)
    q, k, _, (k_cache, v_cache), (k_blocks, v_blocks), slots = nvfp4_case(d=d)
    v = torch.randn(*k.shape[:-1], v_dim, device=DEVICE).to(k.dtype)
    v_cache = torch.zeros(*v_cache.shape[:-1], v_dim // 2, device=DEVICE, dtype=torch.uint8)
    v_blocks = torch.zeros(*v_blocks.shape[:-1], max(v_dim // 16, 1), device=DEVICE, dtype=E4M3)
    cos, sin = ropekit.cos_sin_table(8, rotary_dim, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    call = dict(q=q[None], k=k[None], v=v[None], cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                k_scale_cache=k_blocks, v_scale_cache=v_blocks, k_scale=one, v_scale=one, slot_mapping=slots,
                kv_cache_dtype="nvfp4")
    swaps = {"float32": lambda: call[name].float(), "shape": lambda: call[name][..., :1],
             "per head": lambda: torch.ones(2, device=DEVICE),
             "unpacked": lambda: torch.zeros(3, 4, 2, 64, device=DEVICE, dtype=torch.uint8)}
    if bad in swaps or bad is None:
        call[name] = swaps[bad]() if bad in swaps else None
    before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises((TypeError, ValueError), match=name):
        ropekit.rope_and_cache(**call)
    for key, t in before.items():
        assert torch.equal(call[key].view(torch.uint8), t.view(torch.uint8)), key


# --- on a GPU ---------------------------------------------------------------------------------------------------------

@gpu_only
def _special_values() -> torch.Tensor:
    """256 float32 values of both signs: zeros, infinities, NaNs (a quiet one and one with a payload), the largest
    and smallest float32, every format's largest value and the midpoints past it, int8's ties and its saturation
    edges, and float8 ties of e4m3 and e5m2 around 1 and in their subnormals."""
    magnitudes = torch.tensor([0.0, float("inf"), float("nan"), 3.4028234663852886e38, 1.401298464324817e-45,
                               448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 61441.0, 1e30, 127.0, 127.49, 127.5, 128.0,
                               128.5, 129.0, 0.5, 1.5, 2.5, 126.5, 1.0625, 1.1875, 1.125, 1.375, 2.0**-9, 3 * 2.0**-10,
                               2.0**-16, 3 * 2.0**-17, 2.0**-7])
    magnitudes = torch.cat([magnitudes, torch.nextafter(magnitudes[5:], torch.tensor(0.0)),
                            torch.nextafter(magnitudes[5:], torch.tensor(float("inf")))])
    signed = torch.cat([magnitudes, -magnitudes])
    payload = torch.tensor([0x7FC00001, 0xFFC00001 - 2**32], dtype=torch.int32).view(torch.float32)
    values = torch.cat([signed, payload])
    return torch.cat([values, torch.zeros(256 - values.numel())])


SPECIAL_VALUES = _special_values()


@pytest.mark.parametrize("fmt", ["e5m2", "e4m3", "int8"])
def test_native_conversion_gives_the_integer_rounding_bits(fmt, monkeypatch):
    """On a GPU with its own float8 conversion (and int8's saturating one): a million float32 bit patterns (every
    exponent, NaNs of both signs) and a row of special values (zeros, infinities and NaNs of both signs, saturation
    edges, ties: :data:`SPECIAL_VALUES`) stored through v stay bitwise what the integer rounding stores."""
    from ropekit.triton import fused
    from ropekit.triton.launch import plans

    if not fused.native_fp8(DEVICE):
        pytest.skip("this GPU converts to float8 with integer arithmetic only")
    g = torch.Generator(device="cpu").manual_seed(0)
    bits = torch.randint(-2**31, 2**31, (4096, 256), generator=g, dtype=torch.int64).to(torch.int32)
    bits[0] = SPECIAL_VALUES.view(torch.int32)  # random patterns hold no infinity, zero or tie: the first row does
    values = bits.view(torch.float32).to(DEVICE).view(1, 4096, 1, 256)
    k = torch.zeros(1, 4096, 1, 16, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(4096, 16, device=DEVICE)
    slots = torch.arange(4096, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    stored = []
    for native in (True, False):
        monkeypatch.setattr(fused, "native_fp8", lambda device, native=native: native)
        plans.clear()  # the conversion is chosen when a call is planned
        k_cache = torch.zeros(256, 16, 1, 16, device=DEVICE, dtype=FORMATS[fmt][0])
        v_cache = torch.zeros(256, 16, 1, 256, device=DEVICE, dtype=FORMATS[fmt][0])
        ropekit.rope_and_cache(k, k, values, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                               k_scale=one, v_scale=one)
        stored.append(v_cache.view(torch.uint8).clone())
    assert torch.equal(stored[0], stored[1])


# Tiles that give a thread 1, 2, 4 and more values of a store (k's 8 heads, q's 32, head_dim 64): the GPU's float8
# conversion packs values in pairs, and what the compiler makes of a pair depends on how many a thread holds.
_STORE_TILES = [(1, 32, 4), (1, 16, 4), (1, 8, 1), (1, 8, 2), (4, 8, 4), (1, 4, 4), (2, 1, 2), (1, 1, 4), (8, 2, 8),
                (1, 2, 8)]


@gpu_only
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_quantised_stores_give_the_native_backends_bytes_at_every_tile(fmt):
    """A decode step (64 tokens, Llama-3-8B's 32 q and 8 kv heads at head_dim 64) writing a float8 q (e4m3, or the
    cache's float8 format) and k into a quantised cache at one scale each, at tiles that give a thread from one to
    many values: every tile stores the native backend's bytes, saturated values of both signs included. (With
    e5m2, ptxas once turned every other byte of a 2-value-a-thread tile into the stack pointer's: -inf.)"""
    from ropekit.triton.configs import FusedConfig
    from ropekit.triton.fused import forced_fused_config

    cache_dtype, kv_cache_dtype = FORMATS[fmt]
    q_dtype = cache_dtype if cache_dtype != INT8 else E4M3
    tokens, hq, hk, d = 64, 32, 8, 64
    q = torch.randn(1, tokens, hq, d, device=DEVICE, dtype=torch.bfloat16) * 4
    k = torch.randn(1, tokens, hk, d, device=DEVICE, dtype=torch.bfloat16) * 4
    k[:, ::7] *= 1e4  # past every format's largest value once scaled
    cos, sin = ropekit.cos_sin_table(8192, d, device=DEVICE)
    positions = torch.randint(0, 8192, (1, tokens), device=DEVICE)
    slots = torch.randperm(4 * tokens, device=DEVICE)[:tokens]
    scales = [torch.full((1,), s, device=DEVICE) for s in (0.25, 0.125)]

    def step():
        cache = torch.zeros(4 * tokens, 1, hk, d, device=DEVICE, dtype=cache_dtype)
        out_q, _ = ropekit.rope_and_cache(q, k, None, cos, sin, positions=positions, k_cache=cache,
                                          slot_mapping=slots, k_scale=scales[1], q_dtype=q_dtype, q_scale=scales[0],
                                          kv_cache_dtype=kv_cache_dtype)
        return out_q.view(torch.uint8), cache.view(torch.uint8)

    with ropekit.device.set_backend("native"):
        want = step()
    for tile in _STORE_TILES:
        with forced_fused_config(FusedConfig(*tile)):
            got = step()
        for name, a, b in zip(("q", "k cache"), got, want):
            assert torch.equal(a, b), (tile, name, int((a != b).sum()))


@gpu_only
@pytest.mark.parametrize("kv_cache_dtype", ["fp8_per_token_head", "int8_per_token_head", "fp8_e5m2", "nvfp4"])
def test_cuda_graph_decode_step_replays_with_new_slots_and_scales(kv_cache_dtype):
    """A decode step captured once, the scales device-resident (written per token and head, or read): replays with
    new positions, slots and inputs give the eager step's bytes."""
    batch, hq, hk, d, block = 64, 32, 8, 128, 16
    cache_dtype = {"fp8_per_token_head": E4M3, "int8_per_token_head": INT8, "fp8_e5m2": torch.uint8,
                   "nvfp4": torch.uint8}[kv_cache_dtype]
    nvfp4 = kv_cache_dtype == "nvfp4"
    q, k, v = (torch.randn(batch, 1, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hk, hk))
    caches = [torch.zeros(64, block, hk, d // 2 if nvfp4 else d, device="cuda", dtype=cache_dtype) for _ in range(2)]
    dynamic = kv_cache_dtype.endswith("per_token_head") or nvfp4  # scale caches written
    scales = ([torch.zeros(64, block, hk, *((d // 16,) if nvfp4 else ()), device="cuda", dtype=E4M3 if nvfp4
                           else torch.float32) for _ in range(2)] if dynamic
              else [torch.full((hk,), 0.02, device="cuda") for _ in range(2)])
    cos, sin = ropekit.cos_sin_table(8192, d, base=500000.0, device="cuda")
    positions = torch.randint(0, 8192, (batch,), device="cuda")
    slots = torch.randperm(64 * block, device="cuda")[:batch]
    scale_args = (dict(k_scale_cache=scales[0], v_scale_cache=scales[1]) if dynamic
                  else dict(k_scale=scales[0], v_scale=scales[1]))
    if nvfp4:  # the global scales, device-resident
        scale_args.update(k_scale=torch.tensor([0.002], device="cuda"), v_scale=torch.tensor([0.002], device="cuda"))

    def step(k_cache, v_cache, **scale_args):
        ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                               positions=positions, kv_cache_dtype=kv_cache_dtype, **scale_args)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile outside the capture
            step(*caches, **scale_args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(*caches, **scale_args)
    for _ in range(3):
        positions.copy_(torch.randint(0, 8192, (batch,), device="cuda"))
        slots.copy_(torch.randperm(64 * block, device="cuda")[:batch])
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        eager = [t.clone() for t in caches]
        eager_scales = dict({key: t.clone() if key.endswith("cache") else t for key, t in scale_args.items()}) \
            if dynamic else scale_args
        step(*eager, **eager_scales)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(caches, eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if dynamic:
            for key in scale_args:
                assert torch.equal(scale_args[key].view(torch.uint8), eager_scales[key].view(torch.uint8))


def test_each_format_is_chosen_for_in_a_bucket_of_its_own(monkeypatch):
    """A float8 rounding, an int8 rounding and a per-(token, head) scale cost differently: the launch choice (and the
    autotune's disk cache) keeps them apart, not under one "one-byte cache" bucket."""
    from ropekit.triton import choice
    from ropekit.triton.launch import plans

    seen = []
    choose = choice.choose_fused
    monkeypatch.setattr(choice, "choose_fused", lambda shape, *a, **kw: seen.append(shape) or choose(shape, *a, **kw))
    for fmt, mode in (("e4m3", "tensor"), ("e5m2", "tensor"), ("int8", "tensor"), ("e4m3", "token_head"),
                      ("int8", "token_head")):
        plans.clear()
        cache_dtype, kv_cache_dtype = FORMATS[fmt]
        q, k, v, (k_cache, v_cache), scale_caches, slots = case(cache_dtype=cache_dtype)
        cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
        if mode == "token_head":
            kwargs = dict(k_scale_cache=scale_caches[0], v_scale_cache=scale_caches[1],
                          kv_cache_dtype=f"{'fp8' if fmt == 'e4m3' else fmt}_per_token_head")
        else:
            one = torch.ones(1, device=DEVICE)
            kwargs = dict(k_scale=one, v_scale=one, kv_cache_dtype=kv_cache_dtype)
        with ropekit.device.set_backend("triton"):
            ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                   positions=torch.arange(6, device=DEVICE), layout="thd",
                                   cu_seqlens=torch.tensor([0, 6], device=DEVICE), max_seqlen=6, **kwargs)
    buckets = {choice.fused_bucket(shape) for shape in seen}
    assert len(seen) == 5 and len(buckets) == 5, seen


def test_a_rocm_build_converts_with_integer_arithmetic(monkeypatch):
    """A ROCm build reports its GPUs as "cuda" with a compute capability, but compiles no PTX: the stores there take
    the integer rounding (float8 and int8), and an NVIDIA GPU of capability 8.9 its own conversions."""
    from ropekit.triton import fused

    monkeypatch.setattr(fused._device, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert not fused.native_fp8("cuda")
    monkeypatch.setattr(torch.version, "hip", None)
    assert fused.native_fp8("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not fused.native_fp8("cuda")
