"""ropekit.rope_and_cache: rotated q out (or in place), rotated k and untouched v written straight into a paged or a
contiguous cache, optionally float8 and QK-normed, in one launch; against the float64 reference, with every slot it
must not write left bit for bit, and validation that leaves cache and inputs unchanged."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference, ulp
from conftest import DEVICE, gpu_only

FP8 = torch.float8_e4m3fn


def paged_case(tokens, hq, hk, d, dtype, *, num_blocks=6, block_size=4, v_dim=None, skip=(), cache_dtype=None):
    """q, k, v as slices of one packed projection; a paged cache filled with random (sentinel) values; a
    slot_mapping that scatters the tokens over the blocks, with the tokens in ``skip`` mapped to -1."""
    v_dim = v_dim or d
    qkv = torch.randn(tokens, hq * d + hk * d + hk * v_dim, device=DEVICE).to(dtype)
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hk) * d].view(tokens, hk, d)
    v = qkv[:, (hq + hk) * d:].view(tokens, hk, v_dim)
    cache_dtype = cache_dtype or dtype
    k_cache = torch.randn(num_blocks, block_size, hk, d, device=DEVICE).to(cache_dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, v_dim, device=DEVICE).to(cache_dtype)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[list(skip)] = -1
    return q, k, v, k_cache, v_cache, slots.to(DEVICE)


def assert_paged(cache_before, cache_after, values64, slots, *, scale=None):
    """Written slots hold the reference (within the dtype's bound, or e4m3 rounding of value / scale); every other
    slot is unchanged bit for bit."""
    flat_after = cache_after.view(-1, *cache_after.shape[2:])
    flat_before = cache_before.view(-1, *cache_before.shape[2:])
    written = slots[slots >= 0].cpu()
    untouched = torch.ones(flat_after.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(flat_after.cpu()[untouched].view(torch.uint8), flat_before.cpu()[untouched].view(torch.uint8))
    want = values64[slots.cpu() >= 0]
    got = flat_after.cpu()[written]
    if scale is None:
        assert_close_to_reference(got, want)
    else:
        quotient = want / float(scale)
        error = (got.to(torch.float64) - quotient).abs()
        assert bool((error <= ulp(quotient, FP8)).all()), float((error / ulp(quotient, FP8)).max())


@pytest.mark.parametrize("interleaved", [False, True])
def test_paged_prefill_varlen(interleaved):
    """thd with cu_seqlens: three sequences, tokens at per-sequence offsets, two padding tokens (slot -1)."""
    q, k, v, k_cache, v_cache, slots = paged_case(9, 4, 2, 16, torch.bfloat16, skip=(4, 8))
    before = k_cache.clone(), v_cache.clone()
    cu = torch.tensor([0, 4, 5, 9], device=DEVICE)
    offsets = torch.tensor([0, 17, 3], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(32, 16, device=DEVICE)
    out_q, out_k = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          positions=offsets, layout="thd", cu_seqlens=cu, max_seqlen=4,
                                          interleaved=interleaved)
    assert out_k is None
    pos = ref.varlen_positions(cu, offsets=offsets.cpu())
    assert_close_to_reference(out_q, ref.rope_table(q, cos, sin, pos, interleaved=interleaved))
    assert_paged(before[0], k_cache, ref.rope_table(k, cos, sin, pos, interleaved=interleaved), slots)
    assert_paged(before[1], v_cache, v.double().cpu(), slots)
    assert torch.equal(v_cache.view(-1, 2, 16)[slots[slots >= 0]].cpu(), v[slots >= 0].cpu())  # v bit for bit


def test_paged_decode_in_place_with_qk_norm_and_partial_rotary():
    """Decode: one token per sequence (bshd, seq 1) at per-sequence positions, QK-norm and partial rotary in the
    same launch, q and k rotated in place (write_k)."""
    batch, hq, hk, d, rot = 5, 4, 2, 16, 8
    q, k, v, k_cache, v_cache, slots = paged_case(batch, hq, hk, d, torch.float32, skip=(2,))
    q, k, v = q[:, None], k[:, None], v[:, None]
    q0, k0 = q.clone(), k.clone()
    before = k_cache.clone(), v_cache.clone()
    qw, kw = torch.randn(d, device=DEVICE), torch.randn(d, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(64, rot, device=DEVICE)
    positions = torch.tensor([3, 60, 0, 17, 8], device=DEVICE)
    out_q, out_k = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          positions=positions, q_weight=qw, k_weight=kw, weight_offset=1.0,
                                          inplace=True, write_k=True)
    assert out_q is q and out_k is k
    pos = ref.token_positions(batch, 1, offsets=positions.cpu())
    want_q = ref.rope_table(ref.rms_norm(q0, qw, eps=1e-6, weight_offset=1.0), cos, sin, pos)
    want_k = ref.rope_table(ref.rms_norm(k0, kw, eps=1e-6, weight_offset=1.0), cos, sin, pos)
    assert_close_to_reference(q, want_q)
    assert_close_to_reference(k, want_k)
    assert_paged(before[0], k_cache, want_k[:, 0], slots)
    assert_paged(before[1], v_cache, v[:, 0].double().cpu(), slots)


@pytest.mark.parametrize("offsets", [2, "tensor"])
def test_contiguous_cache_at_per_sequence_offsets(offsets):
    batch, seq, hq, hk, d, max_seq = 2, 3, 2, 1, 16, 8
    q, k = torch.randn(batch, seq, hq, d, device=DEVICE), torch.randn(batch, seq, hk, d, device=DEVICE)
    v = torch.randn(batch, seq, hk, 8, device=DEVICE)  # v's head size may differ from k's
    k_cache, v_cache = torch.randn(batch, max_seq, hk, d, device=DEVICE), torch.randn(batch, max_seq, hk, 8,
                                                                                      device=DEVICE)
    before = k_cache.clone(), v_cache.clone()
    cache_offsets = 2 if offsets == 2 else torch.tensor([5, 0], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(32, d, device=DEVICE)
    out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      cache_offsets=cache_offsets, positions=cache_offsets)
    offs = torch.as_tensor(cache_offsets).cpu().expand(batch)
    pos = ref.token_positions(batch, seq, offsets=offs)
    assert_close_to_reference(out_q, ref.rope_table(q, cos, sin, pos))
    want_k = ref.contiguous_cache_write(before[0], ref.rope_table(k, cos, sin, pos), offs)
    want_v = ref.contiguous_cache_write(before[1], v, offs)
    assert_close_to_reference(k_cache, want_k)
    assert torch.equal(v_cache.cpu().double(), want_v)  # untouched rows and v itself: bit for bit


def test_fp8_cache_within_e4m3_rounding():
    q, k, v, k_cache, v_cache, slots = paged_case(6, 2, 2, 16, torch.bfloat16, skip=(1,), cache_dtype=FP8)
    before = k_cache.clone(), v_cache.clone()
    k_scale = torch.tensor([0.05], device=DEVICE)
    v_scale = torch.tensor([0.003], device=DEVICE)  # large quotients: some saturate at 448
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    ids = torch.tensor([0, 3, 1, 15, 7, 2], device=DEVICE)
    ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                           slot_mapping=slots, k_scale=k_scale, v_scale=v_scale, positions=ids[None])
    want_k = ref.rope_table(k, cos, sin, ids.cpu())
    assert_paged(before[0], k_cache, want_k, slots, scale=k_scale)
    # v: exactly (v / scale), correctly rounded to fp32, then to e4m3 (ties to even, saturating)
    quotient = v.float().cpu() / v_scale.cpu()
    written = slots >= 0
    want_v = ref.e4m3(quotient.double())[written.cpu()]
    got_v = v_cache.view(-1, 2, 16)[slots[written]].cpu().double()
    assert torch.equal(got_v, want_v)
    assert bool((got_v.abs() == 448).any())


def test_e4m3_rounding_bits():
    """v passes through, so with scale 1 its stored bits are the kernel's e4m3 rounding, against torch's on ties,
    subnormals, saturation (infinities too), signed zeros and NaN."""
    values = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 2.0**-7 * 1.5, 2.0**-10, 3 * 2.0**-10, 448.0, 464.0, 1e6,
                           -1e6, float("inf"), -0.0, 0.0, float("nan"), -2.0**-9], device=DEVICE)
    k = torch.zeros(1, 1, 1, 16, device=DEVICE)
    k_cache, v_cache = (torch.zeros(1, 1, 1, 16, device=DEVICE, dtype=FP8) for _ in range(2))
    one = torch.ones(1, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(1, 16, device=DEVICE)
    slot = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    ropekit.rope_and_cache(k, k, values.view(1, 1, 1, 16), cos, sin, k_cache=k_cache, v_cache=v_cache,
                           slot_mapping=slot, k_scale=one, v_scale=one)
    assert torch.equal(v_cache.view(torch.uint8).cpu().flatten(),
                       ref.e4m3(values.double().cpu()).to(FP8).view(torch.uint8).flatten())


def test_q_without_heads_still_gets_the_returned_k_tail(backend):
    """Out of place with partial rotary, q of no heads (an empty tensor, whose data pointer may equal its output's)
    is not "in place": the returned k carries its channels past rotary_dim."""
    q, k, v, k_cache, v_cache, slots = paged_case(3, 1, 1, 16, torch.float32)
    q = q[:, :0]
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    _, out_k = ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      slot_mapping=slots, positions=2, write_k=True)
    assert torch.equal(out_k[0, ..., 8:], k[..., 8:])


def test_torch_compile_fullgraph():
    q, k, v, k_cache, v_cache, slots = paged_case(5, 2, 1, 16, torch.float32)
    caches = k_cache.clone(), v_cache.clone()
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    ids = torch.tensor([[0, 3, 1, 15, 7]], device=DEVICE)

    def step(q, k, v, k_cache, v_cache, slots, ids):
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          positions=ids)
        return out_q * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(q[None], k[None], v[None], k_cache, v_cache, slots, ids)
    want = step(q[None], k[None], v[None], *caches, slots, ids)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(k_cache, caches[0])
    torch.testing.assert_close(v_cache, caches[1])


# --- validation --------------------------------------------------------------------------------------------------------

def _valid_call():
    q, k, v, k_cache, v_cache, slots = paged_case(4, 2, 2, 16, torch.float32)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    return dict(q=q[None], k=k[None], v=v[None], cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=slots, positions=3, inplace=True, write_k=True)


BAD = [
    (dict(slot_mapping="int32"), TypeError, "slot_mapping"),
    (dict(slot_mapping="long"), ValueError, "slot_mapping"),
    (dict(k_cache="heads"), ValueError, "k_cache"),
    (dict(k_cache="dtype"), TypeError, "k_cache"),
    (dict(v_cache="blocks"), ValueError, "v_cache"),
    (dict(v_cache="fp8"), TypeError, "v_cache"),
    (dict(cache_offsets=0), ValueError, "slot_mapping"),
    (dict(k_scale=0.5), TypeError, "k_scale"),
    (dict(q_weight=torch.ones(16)), TypeError, "k_weight"),
    (dict(v="tokens"), ValueError, "v"),
    (dict(k_cache="aliases v_cache"), ValueError, "k_cache"),
]


@pytest.mark.parametrize("change,error,name", BAD, ids=[f"{list(c)[0]}-{v if isinstance(v, (str, int, float)) else 'tensor'}" for c, _, n in BAD
                              for v in c.values()])
def test_errors_name_the_argument_and_write_nothing(change, error, name):
    call = _valid_call()
    swaps = {"int32": lambda: call["slot_mapping"].int(),
             "long": lambda: torch.cat((call["slot_mapping"], call["slot_mapping"][:1])),
             "heads": lambda: torch.zeros(6, 4, 3, 16, device=DEVICE),
             "dtype": lambda: call["k_cache"].double(), "blocks": lambda: torch.zeros(5, 4, 2, 16, device=DEVICE),
             "fp8": lambda: call["v_cache"].to(FP8), "tokens": lambda: call["v"][:, :3],
             "aliases v_cache": lambda: call["v_cache"]}
    for key, value in change.items():
        call[key] = swaps[value]() if isinstance(value, str) else (value.to(DEVICE) if isinstance(value, torch.Tensor)
                                                                   else value)
    before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(error, match=name):
        ropekit.rope_and_cache(**call)
    for key, t in before.items():
        assert torch.equal(call[key].view(torch.uint8), t.view(torch.uint8)), key


@pytest.mark.parametrize("bad", ["range", "duplicate"])
def test_check_mode_reads_slot_values(bad, monkeypatch):
    call = _valid_call()
    call["slot_mapping"] = torch.tensor([0, 24, 2, 3] if bad == "range" else [0, 5, 5, 3], device=DEVICE)
    before = call["k_cache"].clone()
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    with pytest.raises(ValueError, match="slot_mapping"):
        ropekit.rope_and_cache(**call)
    assert torch.equal(call["k_cache"], before)
    monkeypatch.setenv("ROPEKIT_CHECK", "0")
    if bad == "range":  # outside check mode a slot past the cache is skipped, never written out of bounds
        ropekit.rope_and_cache(**call)
        assert torch.equal(call["k_cache"].view(-1, 2, 16)[[1, 4, 5]], before.view(-1, 2, 16)[[1, 4, 5]])


# --- the real sizes, on a GPU ----------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("case", ["decode", "prefill", "decode-fp8-norm"])
def test_llama3_8b_shapes_on_gpu(case):
    """Llama-3-8B heads (32 q / 8 kv x 128, bf16), paged cache with block size 16: decode b64 at positions spread over
    0..8k, prefill b4 s4096 packed (thd); fp8 with QK-norm (Qwen3-8B heads)."""
    hq, hk, d, block = 32, 8, 128, 16
    decode = case.startswith("decode")
    tokens = 64 if decode else 4 * 4096
    q, k, v, k_cache, v_cache, slots = (t.cuda() for t in paged_case(
        tokens, hq, hk, d, torch.bfloat16, num_blocks=tokens // block * 2 + 8, block_size=block,
        cache_dtype=FP8 if "fp8" in case else torch.bfloat16))
    before = k_cache.clone(), v_cache.clone()
    cos, sin = ropekit.cos_sin_table(8192, d, base=500000.0, device="cuda")
    kwargs = {}
    if "fp8" in case:
        kwargs = dict(k_scale=torch.tensor([0.02], device="cuda"), v_scale=torch.tensor([0.02], device="cuda"),
                      q_weight=torch.randn(d, device="cuda"), k_weight=torch.randn(d, device="cuda"))
    if decode:
        positions = torch.randint(0, 8192, (tokens,), device="cuda")
        out_q, _ = ropekit.rope_and_cache(q[:, None], k[:, None], v[:, None], cos, sin, k_cache=k_cache,
                                          v_cache=v_cache, slot_mapping=slots, positions=positions, **kwargs)
        out_q, pos = out_q[:, 0], positions.cpu()
    else:
        cu = torch.arange(0, tokens + 1, 4096, device="cuda")
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                          layout="thd", cu_seqlens=cu, max_seqlen=4096, **kwargs)
        pos = ref.varlen_positions(cu)
    q64, k64 = q, k
    if "fp8" in case:
        q64 = ref.rms_norm(q, kwargs["q_weight"], eps=1e-6)
        k64 = ref.rms_norm(k, kwargs["k_weight"], eps=1e-6)
    assert_close_to_reference(out_q, ref.rope_table(q64, cos, sin, pos))
    scale = kwargs.get("k_scale")
    assert_paged(before[0], k_cache, ref.rope_table(k64, cos, sin, pos), slots,
                 scale=None if scale is None else scale.cpu())


@gpu_only
def test_cuda_graph_decode_step_replays_with_new_positions_and_slots():
    """A decode step captured once: positions, slots and inputs change in place between replays (device-resident),
    nothing syncs to the host inside the capture."""
    batch, hq, hk, d, block = 64, 32, 8, 128, 16
    q, k, v, k_cache, v_cache, slots = (t.cuda() for t in paged_case(batch, hq, hk, d, torch.bfloat16,
                                                                      num_blocks=64, block_size=block))
    q, k, v = q[:, None], k[:, None], v[:, None]
    cos, sin = ropekit.cos_sin_table(8192, d, base=500000.0, device="cuda")
    positions = torch.randint(0, 8192, (batch,), device="cuda")
    out = {}

    def step():
        out["q"], _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                             slot_mapping=slots, positions=positions)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile outside the capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        positions.copy_(torch.randint(0, 8192, (batch,), device="cuda"))
        slots.copy_(torch.randperm(64 * block, device="cuda")[:batch])
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        before = k_cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        pos = ref.token_positions(batch, 1, offsets=positions.cpu())
        assert_close_to_reference(out["q"], ref.rope_table(q, cos, sin, pos))
        assert_paged(before, k_cache, ref.rope_table(k, cos, sin, pos)[:, 0], slots)


@pytest.mark.backend("triton")
def test_a_repeated_decode_call_skips_validation_and_a_changed_one_is_validated(monkeypatch):
    """The eager fast path (a plan is a Triton launch): a call with a signature seen before goes straight to the
    launch (new values, right results); a call that differs in any shape, dtype or argument is validated again."""
    from ropekit.fused import validate
    call = _valid_call()
    call.update(q=call["q"].transpose(0, 1), k=call["k"].transpose(0, 1), v=call["v"].transpose(0, 1),
                positions=torch.tensor([3, 1, 7, 2], device=DEVICE), inplace=False, write_k=False)  # decode, b4
    ropekit.rope_and_cache(**call)  # validated, remembered

    def refuse(*args):
        raise AssertionError("validated again")

    monkeypatch.setattr(validate, "rotary_arguments", refuse)
    for _ in range(2):
        call["positions"].copy_(torch.randint(0, 16, (4,)))
        call["slot_mapping"].copy_(torch.randperm(24)[:4])
        before = call["k_cache"].clone()
        out_q, _ = ropekit.rope_and_cache(**call)
        pos = call["positions"].cpu()[:, None]
        assert_close_to_reference(out_q, ref.rope_table(call["q"], call["cos"], call["sin"], pos))
        assert_paged(before, call["k_cache"], ref.rope_table(call["k"], call["cos"], call["sin"], pos)[:, 0],
                     call["slot_mapping"])
    longer = torch.cat((call["slot_mapping"], call["slot_mapping"][:1]))
    with pytest.raises(AssertionError, match="validated again"):
        ropekit.rope_and_cache(**dict(call, slot_mapping=longer))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="slot_mapping"):
        ropekit.rope_and_cache(**dict(call, slot_mapping=longer))
    with pytest.raises(ValueError, match="autograd"):
        ropekit.rope_and_cache(**dict(call, q=call["q"].clone().requires_grad_()))
    # a shorter mapping after a remembered full-length call is validated again and covers the first tokens only
    before = call["k_cache"].clone()
    ropekit.rope_and_cache(**dict(call, slot_mapping=call["slot_mapping"][:3]))
    covered = torch.cat((call["slot_mapping"][:3], torch.full((1,), -1, device=DEVICE)))
    pos = call["positions"].cpu()[:, None]
    assert_paged(before, call["k_cache"], ref.rope_table(call["k"], call["cos"], call["sin"], pos)[:, 0], covered)


# --- the engines' conventions ----------------------------------------------------------------------------------------

def test_a_shorter_slot_mapping_caches_the_first_tokens_and_rotates_all():
    """vLLM's cache writes take the token count from slot_mapping: the tokens past it are a CUDA-graph batch's
    padding. They are rotated (q) and never cached."""
    q, k, v, k_cache, v_cache, slots = paged_case(6, 4, 2, 16, torch.float32)
    before = k_cache.clone(), v_cache.clone()
    positions = torch.tensor([5, 0, 9, 3, 1, 7], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    out_q, _ = ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=k_cache, v_cache=v_cache,
                                      slot_mapping=slots[:4], positions=positions[None])
    pos = positions.cpu()[:, None]
    assert_close_to_reference(out_q[0], ref.rope_table(q, cos, sin, pos[:, 0]))
    covered = torch.cat((slots[:4], torch.full((2,), -1, device=DEVICE)))
    assert_paged(before[0], k_cache, ref.rope_table(k, cos, sin, pos[:, 0]), covered)
    assert_paged(before[1], v_cache, v.double().cpu(), covered)


def test_a_uint8_cache_holds_e4m3_bytes_and_a_scale_beside_a_model_dtype_cache_is_unread():
    q, k, v, k_cache, v_cache, slots = paged_case(4, 4, 2, 16, torch.bfloat16, cache_dtype=FP8)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    scale = torch.tensor([0.5], device=DEVICE)
    as_bytes = k_cache.view(torch.uint8).clone(), v_cache.view(torch.uint8).clone()
    for caches in ((k_cache, v_cache), as_bytes):
        ropekit.rope_and_cache(q[None], k[None], v[None], cos, sin, k_cache=caches[0], v_cache=caches[1],
                               slot_mapping=slots, k_scale=scale, v_scale=scale, positions=3)
    assert torch.equal(as_bytes[0], k_cache.view(torch.uint8)) and torch.equal(as_bytes[1], v_cache.view(torch.uint8))
    plain = paged_case(4, 4, 2, 16, torch.bfloat16)
    caches = plain[3].clone(), plain[4].clone()
    for k_scale in (None, scale):  # engines pass their scales whatever the cache holds
        ropekit.rope_and_cache(plain[0][None], plain[1][None], plain[2][None], cos, sin, k_cache=caches[0],
                               v_cache=caches[1], slot_mapping=plain[5], k_scale=k_scale, v_scale=k_scale,
                               positions=3)
        if k_scale is None:
            first = caches[0].clone(), caches[1].clone()
    assert torch.equal(first[0], caches[0]) and torch.equal(first[1], caches[1])


@pytest.mark.parametrize("layout", ["combined", "HND", "padded-scales"])
def test_slot_mapping_into_caches_whose_blocks_are_not_their_rows(layout, backend):
    """A slot is block * block_size + row, and a block's rows need not be block_size rows of one axis: the halves of
    one (num_blocks, 2, block_size, heads, dim) tensor (FlashInfer's combined cache), the HND layout, and
    per-(token, head) scale caches whose blocks are padded. Every written row holds the reference; every other byte is
    unchanged."""
    tokens, hq, hk, d, num_blocks, block_size = 7, 4, 2, 16, 5, 4
    q, k, v, k_cache, v_cache, slots = paged_case(tokens, hq, hk, d, torch.bfloat16, num_blocks=num_blocks,
                                                  block_size=block_size, skip=(3,))
    cos, sin = ropekit.cos_sin_table(64, d, device=DEVICE)
    positions = torch.randint(0, 64, (tokens,), device=DEVICE)
    kwargs = dict(slot_mapping=slots, positions=positions, layout="thd", cu_seqlens=torch.tensor(
        [0, tokens], device=DEVICE), max_seqlen=tokens)
    want_k = ref.rope_table(k, cos, sin, positions.cpu())
    if layout == "padded-scales":
        caches = [torch.full((num_blocks, block_size, hk, d), 5, device=DEVICE, dtype=torch.int8) for _ in range(2)]
        padded = [torch.full((num_blocks, block_size + 3, hk), 7.0, device=DEVICE) for _ in range(2)]
        scales = [t[:, :block_size] for t in padded]  # each block's rows, then three rows of padding
        ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], k_scale_cache=scales[0],
                               v_scale_cache=scales[1], kv_cache_dtype="int8_per_token_head", **kwargs)
        written = slots[slots >= 0].cpu()
        unwritten = torch.ones(num_blocks * block_size, dtype=torch.bool)
        unwritten[written] = False
        for cache, scale, base, want in zip(caches, scales, padded, (want_k, v.double().cpu())):
            rows, row_scales = cache.view(-1, hk, d).cpu(), scale.reshape(-1, hk).cpu()
            got = rows[written].double() * row_scales[written, :, None]
            want = want[slots.cpu() >= 0]
            assert float((got - want).abs().max()) <= float(want.abs().amax()) / 127  # within int8's step
            assert bool((rows[unwritten] == 5).all()) and bool((row_scales[unwritten] == 7.0).all())
            assert bool((base[:, block_size:] == 7.0).all())  # the padding untouched
        return
    if layout == "combined":
        both = torch.randn(num_blocks, 2, block_size, hk, d, device=DEVICE).to(torch.bfloat16)
        k_cache, v_cache = both[:, 0], both[:, 1]
        flat = lambda c: c  # noqa: E731
        extra = {}
    else:
        k_cache = torch.randn(num_blocks, hk, block_size, d, device=DEVICE).to(torch.bfloat16)
        v_cache = torch.randn(num_blocks, hk, block_size, d, device=DEVICE).to(torch.bfloat16)
        flat = lambda c: c.transpose(1, 2)  # noqa: E731
        extra = dict(kv_layout="HND")
    before = flat(k_cache).contiguous(), flat(v_cache).contiguous()
    ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, **kwargs, **extra)
    assert_paged(before[0], flat(k_cache).contiguous(), want_k, slots)
    assert_paged(before[1], flat(v_cache).contiguous(), v.double().cpu(), slots)
