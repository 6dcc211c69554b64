"""ropekit.mla_rope_and_cache: DeepSeek MLA's decoupled RoPE (GPT-J pairs, YaRN tables) on q_pe and the shared k_pe,
and ``[kv_c | rotated k_pe]`` written into the paged latent cache, in one launch; against the float64 reference, eager,
under torch.compile and replayed in CUDA graphs."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference, ulp
from capture import cuda_graph_of, decode_page_table
from conftest import DEVICE, gpu_only

FP8 = torch.float8_e4m3fn
YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


def yarn_tables(rope_dim, rows, device):
    inv_freq, attention_factor = ropekit.rope_init(YARN, rope_dim, max_position_embeddings=163840)
    return ropekit.cos_sin_table(rows, inv_freq=inv_freq, attention_scaling=attention_factor, device=device)


def mla_case(tokens, heads, rope_dim, latent, dtype, *, num_blocks, block_size, cache_dtype=None, device=DEVICE):
    q_pe = torch.randn(tokens, heads, rope_dim + 32, device=device).to(dtype)[..., 32:]  # a slice of q
    kv = torch.randn(tokens, latent + rope_dim, device=device).to(dtype)  # the projection's [kv_c | k_pe]
    kv_c, k_pe = kv[:, :latent], kv[:, latent:]
    kv_cache = torch.randn(num_blocks, block_size, latent + rope_dim, device=device).to(cache_dtype or dtype)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    return q_pe, k_pe, kv_c, kv_cache, slots


def check_cache(before, after, kv_c, k_pe64, slots, scale=None):
    latent = kv_c.shape[-1]
    flat_before, flat_after = before.view(-1, before.shape[-1]).cpu(), after.view(-1, after.shape[-1]).cpu()
    written = slots[slots >= 0].cpu()
    untouched = torch.ones(flat_after.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(flat_after[untouched].view(torch.uint8), flat_before[untouched].view(torch.uint8))
    rows = flat_after[written]
    keep = (slots >= 0).cpu()
    if scale is None:
        assert torch.equal(rows[:, :latent], kv_c[keep].cpu())
        assert_close_to_reference(rows[:, latent:], k_pe64[keep])
    else:
        assert torch.equal(rows[:, :latent].double(), ref.e4m3(kv_c[keep].float().cpu().double() / float(scale)))
        quotient = k_pe64[keep] / float(scale)
        assert bool(((rows[:, latent:].double() - quotient).abs() <= ulp(quotient, FP8)).all())


@pytest.mark.parametrize("form", ["cos_sin_cache", "tables-neox-out-of-place"])
def test_matches_reference(form, backend):
    tokens, heads, rope_dim, latent = 6, 3, 16, 32
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(tokens, heads, rope_dim, latent, torch.bfloat16, num_blocks=4,
                                                 block_size=4)
    slots[2] = -1
    q0, k0, before = q_pe.clone(), k_pe.clone(), kv_cache.clone()
    cos, sin = yarn_tables(rope_dim, 64, DEVICE)
    positions = torch.tensor([0, 63, 5, 17, 2, 40], device=DEVICE)
    interleaved = form == "cos_sin_cache"
    if form == "cos_sin_cache":  # vLLM's buffer in the model's dtype: [cos | sin] per position
        cache = torch.cat((cos, sin), -1).to(torch.bfloat16)
        out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos_sin_cache=cache)
        cos, sin = cache[:, :rope_dim // 2], cache[:, rope_dim // 2:]
        assert out_q is not None and out_q.data_ptr() == q_pe.data_ptr() and out_k.data_ptr() == k_pe.data_ptr()
    else:
        out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin,
                                                  interleaved=False, inplace=False)
        assert torch.equal(q_pe, q0) and torch.equal(k_pe, k0)
    pos = positions.cpu()
    want_q = ref.rope_table(q0, cos, sin, pos, interleaved=interleaved)
    want_k = ref.rope_table(k0[:, None], cos, sin, pos, interleaved=interleaved)[:, 0]
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    check_cache(before, kv_cache, kv_c, want_k, slots)


def test_fp8_latent_cache():
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(5, 2, 16, 32, torch.bfloat16, num_blocks=3, block_size=4,
                                                 cache_dtype=FP8)
    k0, before = k_pe.clone(), kv_cache.clone()
    scale = torch.tensor([0.01], device=DEVICE)
    cos, sin = yarn_tables(16, 32, DEVICE)
    positions = torch.tensor([1, 2, 30, 4, 0], device=DEVICE)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin, kv_cache_scale=scale)
    want_k = ref.rope_table(k0[:, None], cos, sin, positions.cpu(), interleaved=True)[:, 0]
    check_cache(before, kv_cache, kv_c, want_k, slots, scale=scale.cpu())


E5M2 = torch.float8_e5m2
# vLLM's kv_cache_dtype names for the latent cache: (the name, the cache as allocated, the format its bytes hold)
MLA_FORMATS = {"fp8": (FP8, FP8), "fp8_e4m3-uint8": (torch.uint8, FP8), "fp8_e5m2": (E5M2, E5M2),
               "fp8_e5m2-uint8": (torch.uint8, E5M2), "auto-e5m2": (E5M2, E5M2)}


@pytest.mark.parametrize("separate", [False, True], ids=["one-cache", "ckv-kpe"])
@pytest.mark.parametrize("name", list(MLA_FORMATS))
def test_float8_latent_cache_by_kv_cache_dtype_reads_back(name, separate, backend):
    """kv_cache_dtype as vLLM spells it: the latent cache in float8 e4m3 or e5m2 (or their uint8 bytes) at one
    kv_cache_scale, both parts through the same quantising store; the reader (stored x scale) gives kv_c as the
    format's rounding of kv_c / scale and the rotated k_pe within half a spacing (plus float32 math) of the truth."""
    allocated, fmt = MLA_FORMATS[name]
    kv_cache_dtype = name.split("-")[0]
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(5, 2, 16, 32, torch.bfloat16, num_blocks=3, block_size=4)
    kv_cache = torch.randint(0, 100, kv_cache.shape, device=DEVICE, dtype=torch.uint8)
    before = kv_cache.clone()
    stored = kv_cache if allocated == torch.uint8 else kv_cache.view(allocated)
    caches = (stored[..., :32], stored[..., 32:]) if separate else stored
    slots[1] = -1
    k0 = k_pe.clone()
    scale = torch.tensor([0.02], device=DEVICE)
    cos, sin = yarn_tables(16, 32, DEVICE)
    positions = torch.tensor([1, 2, 30, 4, 0], device=DEVICE)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, slots, positions, cos, sin, kv_cache_scale=scale,
                               kv_cache_dtype=kv_cache_dtype)
    want_k = ref.rope_table(k0[:, None], cos, sin, positions.cpu(), interleaved=True)[:, 0]
    flat, flat_before = kv_cache.view(-1, 48).cpu(), before.view(-1, 48).cpu()
    written, keep = slots[slots >= 0].cpu(), (slots >= 0).cpu()
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(flat[untouched], flat_before[untouched])
    rows = flat[written].view(fmt).double()
    assert torch.equal(rows[:, :32], ref.quantise(kv_c[keep].float().cpu().double(), 0.02, fmt))
    quotient = want_k[keep] / 0.02
    assert bool(((ref.dequantise(rows[:, 32:], 1.0) - quotient).abs()
                 <= ulp(quotient, fmt) / 2 + 1e-5 * quotient.abs().amax(-1, keepdim=True)).all())


@pytest.mark.parametrize("kv_cache_dtype,cache_dtype,error", [
    ("fp8_e5m2", FP8, TypeError), ("fp8", torch.float32, TypeError), ("nvfp4", torch.uint8, ValueError),
    ("fp8_per_token_head", FP8, ValueError), ("int8", torch.float32, ValueError)],
    ids=["e5m2-name-e4m3-cache", "fp8-name-model-dtype-cache", "nvfp4", "per-token-head", "unknown"])
def test_kv_cache_dtype_names_the_latent_cache_it_writes(kv_cache_dtype, cache_dtype, error):
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(4, 2, 16, 32, torch.float32, num_blocks=2, block_size=4,
                                                 cache_dtype=cache_dtype)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    before = [t.clone() for t in (q_pe, k_pe, kv_c, kv_cache)]
    with pytest.raises(error, match="kv_cache_dtype"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, torch.arange(4, device=DEVICE), cos, sin,
                                   kv_cache_scale=torch.ones(1, device=DEVICE), kv_cache_dtype=kv_cache_dtype)
    for t, b in zip((q_pe, k_pe, kv_c, kv_cache), before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("change,error,name", [
    ("kv_cache width", ValueError, "kv_cache"),
    ("slot int32", TypeError, "slot_mapping"),
    ("kv_c tokens", ValueError, "kv_c"),
    ("fp8 without scale", TypeError, "kv_cache_scale"),
    ("positions shape", ValueError, "positions"),
])
def test_errors_name_the_argument_and_write_nothing(change, error, name):
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(4, 2, 16, 32, torch.float32, num_blocks=2, block_size=4)
    positions = torch.arange(4, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 16, device=DEVICE)
    if change == "kv_cache width":
        kv_cache = kv_cache[..., :40]
    elif change == "slot int32":
        slots = slots.int()
    elif change == "kv_c tokens":
        kv_c = kv_c[:3]
    elif change == "fp8 without scale":
        kv_cache = kv_cache.to(FP8)
    else:
        positions = positions[None]
    before = [t.clone() for t in (q_pe, k_pe, kv_c, kv_cache)]
    with pytest.raises(error, match=name):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin)
    for t, b in zip((q_pe, k_pe, kv_c, kv_cache), before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("change,error,words", [
    # the docs' (max_position, rope_dim): a wider buffer would be split at the wrong column
    ("cos_sin_cache wider than rope_dim", ValueError, ["cos_sin_cache", "rope_dim"]),
    ("cos_sin_cache narrower than rope_dim", ValueError, ["cos_sin_cache", "rope_dim"]),
    # the rotation's checks speak of q, k, cos/sin and rotary_dim: the message says which arguments those are here
    ("k_pe dtype", TypeError, ["q is q_pe", "k is k_pe"]),
    ("cos/sin narrower than rope_dim / 2", ValueError, ["rotary_dim and head_dim are rope_dim"]),
    ("table too short (check mode)", ValueError, ["the two halves of cos_sin_cache"]),
])
def test_errors_name_this_calls_arguments(change, error, words, monkeypatch):
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(4, 2, 16, 32, torch.float32, num_blocks=2, block_size=4)
    positions = torch.arange(4, device=DEVICE)
    tables = dict(cos_sin_cache=torch.cat(ropekit.cos_sin_table(8, 16, device=DEVICE), -1))
    if change == "cos_sin_cache wider than rope_dim":
        tables = dict(cos_sin_cache=torch.cat(ropekit.cos_sin_table(8, 32, device=DEVICE), -1))
    elif change == "cos_sin_cache narrower than rope_dim":
        tables = dict(cos_sin_cache=torch.cat(ropekit.cos_sin_table(8, 8, device=DEVICE), -1))
    elif change == "k_pe dtype":
        k_pe = k_pe.double()
    elif change == "cos/sin narrower than rope_dim / 2":
        tables = dict(zip(("cos", "sin"), ropekit.cos_sin_table(8, 8, device=DEVICE)))
    else:
        monkeypatch.setenv("ROPEKIT_CHECK", "1")
        positions = torch.tensor([0, 1, 2, 8], device=DEVICE)
    before = [t.clone() for t in (q_pe, k_pe, kv_c, kv_cache)]
    with pytest.raises(error) as raised:
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, **tables)
    assert all(word in str(raised.value) for word in words), str(raised.value)
    for t, b in zip((q_pe, k_pe, kv_c, kv_cache), before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))


def test_engine_padding_a_longer_positions_a_shorter_slot_mapping_and_a_uint8_cache(backend):
    """vLLM's fused MLA write reads positions and slots for the first tokens (a CUDA-graph batch pads them) and keeps a
    float8 cache as uint8 bytes."""
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(4, 2, 16, 32, torch.bfloat16, num_blocks=3, block_size=4,
                                                 cache_dtype=FP8)
    q0, k0, before = q_pe.clone(), k_pe.clone(), kv_cache.clone()
    scale = torch.tensor([0.05], device=DEVICE)
    cos, sin = yarn_tables(16, 32, DEVICE)
    positions = torch.tensor([1, 20, 3, 7, 0, 0], device=DEVICE)  # two padded entries
    as_bytes = kv_cache.view(torch.uint8)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, as_bytes, slots[:3], positions, cos, sin, kv_cache_scale=scale)
    pos = positions[:4].cpu()
    assert_close_to_reference(q_pe, ref.rope_table(q0, cos, sin, pos, interleaved=True))
    want_k = ref.rope_table(k0[:, None], cos, sin, pos, interleaved=True)[:, 0]
    covered = torch.cat((slots[:3], torch.full((1,), -1, device=DEVICE)))
    check_cache(before, kv_cache, kv_c, want_k, covered, scale=scale.cpu())


@pytest.mark.parametrize("k_pe_rank", [2, 3])
def test_in_place_returns_q_pe_and_k_pe_themselves_on_every_call(k_pe_rank, backend):
    """In place the call returns the caller's q_pe and k_pe (k_pe as given, (tokens, 1, rope_dim) too), on the first
    call, which validates and plans, and on the planned calls after it; out of place, new tensors and k's
    (tokens, rope_dim)."""
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(3, 2, 16, 32, torch.bfloat16, num_blocks=2, block_size=4)
    k_pe = k_pe if k_pe_rank == 2 else k_pe[:, None]
    cos, sin = yarn_tables(16, 32, DEVICE)
    positions = torch.tensor([1, 2, 3], device=DEVICE)
    for _ in range(3):
        q_out, k_out = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin)
        assert q_out is q_pe and k_out is k_pe
    q_out, k_out = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin, inplace=False)
    assert q_out.data_ptr() != q_pe.data_ptr() and q_out.shape == q_pe.shape and k_out.shape == (3, 16)


@gpu_only
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8])
def test_deepseek_decode_shapes_on_gpu(cache_dtype):
    """MLA decode b64: 128 heads, 64 rope + 512 latent, bf16, block size 64 (vLLM's MLA default), YaRN."""
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(64, 128, 64, 512, torch.bfloat16, num_blocks=256, block_size=64,
                                                 cache_dtype=cache_dtype, device="cuda")
    q0, k0, before = q_pe.clone(), k_pe.clone(), kv_cache.clone()
    cos, sin = yarn_tables(64, 8192, "cuda")
    positions = torch.randint(0, 8192, (64,), device="cuda")
    scale = torch.tensor([0.02], device="cuda") if cache_dtype == FP8 else None
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin, kv_cache_scale=scale)
    want_k = ref.rope_table(k0[:, None], cos, sin, positions.cpu(), interleaved=True)[:, 0]
    assert_close_to_reference(q_pe, ref.rope_table(q0, cos, sin, positions.cpu(), interleaved=True))
    check_cache(before, kv_cache, kv_c, want_k, slots, scale=None if scale is None else scale.cpu())


@pytest.mark.parametrize("form", ["kv_cache", "kpe_cache"])
def test_a_cache_on_the_padding_of_positions_is_refused(form):
    """positions may be longer than the tokens (a CUDA-graph batch's padding); the whole tensor is the call's, so a
    cache lying on its unread tail is refused like any overlap, before anything is written."""
    tokens, heads, rope_dim, latent = 2, 2, 16, 16
    width = latent + rope_dim if form == "kv_cache" else rope_dim
    pool = torch.zeros(8 * tokens + 2 * 4 * width * 2, dtype=torch.uint8, device=DEVICE)
    positions = pool[:8 * (tokens + 2)].view(torch.int64)                        # two padding positions
    cache = pool[8 * tokens:].view(torch.bfloat16).view(2, 4, width)           # on the padding's bytes
    caches = cache if form == "kv_cache" else (torch.zeros(2, 4, latent, device=DEVICE, dtype=torch.bfloat16), cache)
    q_pe = torch.randn(tokens, heads, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    k_pe, kv_c = (torch.randn(tokens, n, device=DEVICE, dtype=torch.bfloat16) for n in (rope_dim, latent))
    cos, sin = ropekit.cos_sin_table(8, rope_dim, device=DEVICE)
    before = pool.clone()
    with pytest.raises(ValueError, match=f"{form}.*positions|positions.*{form}"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, torch.arange(tokens, device=DEVICE), positions, cos, sin)
    assert torch.equal(pool, before)


# --- torch.compile and CUDA graphs: every cache form (one kv_cache, FlashInfer's pair) and address map -------------

def slots_of(table, block_size):
    """The flat slot (``block * block_size + row``) each token of the page table names, int64, -1 where it writes
    nothing: what :func:`check_cache` reads."""
    b, p = table["batch_indices"].long(), table["cache_positions"].long()
    page = table["kv_indices"].long()[table["kv_indptr"].long()[b.clamp(min=0)] + p // block_size]
    return torch.where(b >= 0, page * block_size + p % block_size, -1)


# (the caches: vLLM's one kv_cache or FlashInfer's (ckv_cache, kpe_cache); the address map; the cache dtype)
MLA_CAPTURED = {"kv_cache-slot_mapping-bf16": ("one", "slots", torch.bfloat16),
                "ckv_kpe-slot_mapping-fp8": ("pair", "slots", FP8),
                "ckv_kpe-page_table-fp8": ("pair", "page_table", FP8),
                "kv_cache-page_table-bf16": ("one", "page_table", torch.bfloat16)}


def mla_captured_case(name, tokens, heads, rope_dim, latent, num_blocks, block_size, max_position):
    """One of MLA_CAPTURED's calls, all its indices and its scale device-resident: the inputs (k_pe and kv_c views
    of one projection), the caches (sentinel values), the address map (keyword arguments) and the positions (int64,
    two padding entries past the tokens, as an engine's CUDA-graph batch pads them)."""
    form, address, dtype = MLA_CAPTURED[name]
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(tokens, heads, rope_dim, latent, torch.bfloat16,
                                                 num_blocks=num_blocks, block_size=block_size, cache_dtype=dtype)
    slots[1] = -1
    caches = (kv_cache[..., :latent].contiguous(), kv_cache[..., latent:].contiguous()) if form == "pair" else kv_cache
    by = dict(slot_mapping=slots) if address == "slots" else dict(slot_mapping=None, **decode_page_table(
        tokens, 2, block_size, num_blocks, DEVICE))
    positions = torch.randint(0, max_position, (tokens + 2,), device=DEVICE)
    scale = torch.tensor([0.05], device=DEVICE) if dtype == FP8 else None
    return q_pe, k_pe, kv_c, caches, by, positions, scale


def mla_slots(by, block_size):
    return by["slot_mapping"] if by["slot_mapping"] is not None else slots_of(by, block_size)


def joined(caches):
    """The latent cache as one ``(num_blocks, block_size, latent + rope_dim)`` tensor (a copy for the pair)."""
    return torch.cat(caches, -1) if isinstance(caches, tuple) else caches


def assert_mla_step(got, want, before, q0, k0, kv_c, cos, sin, positions, slots, scale):
    """A captured or compiled step against the eager step (``want``: its q_pe, k_pe and caches, bit for bit) and
    the float64 reference (q_pe, k_pe, and the cache through :func:`check_cache`)."""
    for a, b in zip(got[:2] + (joined(got[2]),), want[:2] + (joined(want[2]),)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    pos = positions[:q0.shape[0]].cpu()
    want_k = ref.rope_table(k0[:, None], cos, sin, pos, interleaved=True)[:, 0]
    assert_close_to_reference(got[0], ref.rope_table(q0, cos, sin, pos, interleaved=True))
    assert_close_to_reference(got[1], want_k)
    check_cache(before, joined(got[2]), kv_c, want_k, slots, scale=None if scale is None else scale.cpu())


@pytest.mark.parametrize("name", list(MLA_CAPTURED))
def test_torch_compile_fullgraph(name):
    """mla_rope_and_cache under torch.compile(fullgraph=True), in place (q_pe, k_pe: graph inputs the custom op
    mutates, k_pe a view of the projection kv_c is read from) into each cache form through each address map, the
    indices, positions and scale graph inputs: q_pe, k_pe and the caches are the eager call's bit for bit and the
    float64 reference's."""
    block_size = 4
    q_pe, k_pe, kv_c, caches, by, positions, scale = mla_captured_case(name, 5, 2, 16, 32, 12, block_size, 32)
    cos, sin = yarn_tables(16, 32, DEVICE)
    q0, k0 = q_pe.clone(), k_pe.clone()
    pair = isinstance(caches, tuple)
    before = joined(caches).clone()
    eager = (q_pe.clone(), k_pe.clone(), tuple(c.clone() for c in caches) if pair else caches.clone())

    def step(q_pe, k_pe, kv_c, caches, by, positions, scale):
        out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, positions=positions, cos=cos, sin=sin,
                                                  kv_cache_scale=scale, **by)
        return out_q.float() * 2

    want = step(eager[0], eager[1], kv_c, eager[2], by, positions, scale)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(q_pe, k_pe, kv_c, caches, by, positions, scale)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_mla_step((q_pe, k_pe, caches), eager, before, q0, k0, kv_c, cos, sin, positions,
                    mla_slots(by, block_size), scale)


@gpu_only
@pytest.mark.parametrize("name", list(MLA_CAPTURED))
def test_cuda_graph_decode_step_replays_with_new_positions_slots_and_scale(name):
    """DeepSeek's MLA decode step (64 tokens, 128 heads, 64 rope + 512 latent, block size 64, YaRN) captured once
    into each cache form through each address map: between replays the positions, the slot mapping or page table,
    the float8 scale and the inputs change in place (device-resident); each replay writes what an eager call with
    the same values writes, bit for bit, and the float64 reference's values."""
    tokens, block_size = 64, 64
    q_pe, k_pe, kv_c, caches, by, positions, scale = mla_captured_case(name, tokens, 128, 64, 512, 256, block_size,
                                                                      8192)
    cos, sin = yarn_tables(64, 8192, DEVICE)
    pair = isinstance(caches, tuple)

    def step(q_pe=q_pe, k_pe=k_pe, caches=caches):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, positions=positions, cos=cos, sin=sin,
                                   kv_cache_scale=scale, **by)

    graph = cuda_graph_of(step)
    for replay in range(3):
        positions.copy_(torch.randint(0, 8192, positions.shape, device=DEVICE))
        if by["slot_mapping"] is not None:
            by["slot_mapping"].copy_(torch.randperm(256 * block_size, device=DEVICE)[:tokens])
            by["slot_mapping"][replay] = -1
        else:
            for n, t in decode_page_table(tokens, 2, block_size, 256, DEVICE).items():
                by[n].copy_(t)
        if scale is not None:
            scale.fill_((0.02, 0.1, 0.03)[replay])  # |x| / scale stays inside e4m3's range
        for x in (q_pe, k_pe, kv_c):
            x.copy_(torch.randn_like(x))
        q0, k0, before = q_pe.clone(), k_pe.clone(), joined(caches).clone()
        eager = (q_pe.clone(), k_pe.clone(), tuple(c.clone() for c in caches) if pair else caches.clone())
        step(*eager)
        graph.replay()
        torch.cuda.synchronize()
        assert_mla_step((q_pe, k_pe, caches), eager, before, q0, k0, kv_c, cos, sin, positions,
                        mla_slots(by, block_size), scale)


def yarn_frequencies(rope_dim, device):
    inv_freq, attention_factor = ropekit.rope_init(YARN, rope_dim, max_position_embeddings=163840)
    return inv_freq.to(device), float(attention_factor)


def rotated64(x, positions, inv_freq, scale):
    """``x (tokens, heads, dim)`` turned by GPT-J pairs at ``positions * inv_freq``, cos and sin times ``scale``:
    the float64 angles, on the CPU."""
    theta = positions.cpu().double()[:, None, None] * inv_freq.cpu().double()
    return ref.rotate_pairs(x.cpu(), torch.cos(theta) * scale, torch.sin(theta) * scale, interleaved=True)


@pytest.mark.parametrize("inplace", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("form", ["one-bf16", "pair-bf16", "one-fp8", "pair-fp8"])
def test_angles_without_a_table_at_long_positions(form, inplace, backend):
    """inv_freq= and scale=: cos and sin of ``position * inv_freq`` computed in the kernel (YaRN's frequencies; the
    scale is its attention factor, 1.0 in DeepSeek's config, so another value here), no table read, at positions up
    to 10^7; q_pe, k_pe and each cache form (bf16, or
    float8 e4m3 at kv_cache_scale through the reader) against the float64 angles; the planned second call writes the
    same bytes."""
    cache_dtype = FP8 if form.endswith("fp8") else torch.bfloat16
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(6, 3, 16, 32, torch.bfloat16, num_blocks=4, block_size=4,
                                                 cache_dtype=cache_dtype)
    slots[3] = -1
    caches = (kv_cache[..., :32].contiguous(), kv_cache[..., 32:].contiguous()) if form.startswith("pair") \
        else kv_cache
    scale = torch.tensor([0.02], device=DEVICE) if cache_dtype == FP8 else None
    inv_freq, attention_factor = yarn_frequencies(16, DEVICE)[0], 0.875
    positions = torch.tensor([0, 1_000, 163_839, 1_000_000, 5, 9_999_990], device=DEVICE)
    q0, k0, before = q_pe.clone(), k_pe.clone(), joined(caches).clone()
    call = dict(inv_freq=inv_freq, scale=attention_factor, inplace=inplace, kv_cache_scale=scale)
    out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, slots, positions, **call)
    if inplace:
        assert out_q is q_pe and out_k is k_pe
    else:
        assert torch.equal(q_pe, q0) and torch.equal(k_pe, k0)
    want_q = rotated64(q0, positions, inv_freq, attention_factor)
    want_k = rotated64(k0[:, None], positions, inv_freq, attention_factor)[:, 0]
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    written = joined(caches).clone()
    check_cache(before, written, kv_c, want_k, slots, scale=None if scale is None else scale.cpu())
    # the planned call, from the same inputs: the same bytes
    q_pe.copy_(q0), k_pe.copy_(k0)
    again = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, slots, positions, **call)
    for a, b in zip(again, (out_q, out_k)):
        assert torch.equal(a, b)
    assert torch.equal(joined(caches).view(torch.uint8), written.view(torch.uint8))


def test_angles_without_a_table_by_page_table_and_their_scale_in_the_plan(backend):
    """The table-free angles through FlashInfer's page table into (ckv_cache, kpe_cache); a planned call signature
    at another scale is planned anew (the scale is no tensor: the plan's key holds it), and a scale of 1.0 is the
    plain rotation."""
    tokens, block_size = 5, 4
    q_pe, k_pe, kv_c, kv_cache, _ = mla_case(tokens, 2, 16, 32, torch.float32, num_blocks=12,
                                             block_size=block_size)
    caches = (kv_cache[..., :32].contiguous(), kv_cache[..., 32:].contiguous())
    by = decode_page_table(tokens, 2, block_size, 12, DEVICE)
    inv_freq, _ = yarn_frequencies(16, DEVICE)
    positions = torch.tensor([7, 70_000, 3, 1_048_575, 12], device=DEVICE)
    q0, k0 = q_pe.clone(), k_pe.clone()
    for scale in (1.0, 1.25, 1.0):
        q_pe.copy_(q0), k_pe.copy_(k0)
        before = joined(caches).clone()
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, None, positions, inv_freq=inv_freq, scale=scale,
                                   **by)
        want_k = rotated64(k0[:, None], positions, inv_freq, scale)[:, 0]
        assert_close_to_reference(q_pe, rotated64(q0, positions, inv_freq, scale))
        assert_close_to_reference(k_pe, want_k)
        check_cache(before, joined(caches), kv_c, want_k, slots_of(by, block_size))


@pytest.mark.parametrize("change,error,words", [
    ("inv_freq and cos_sin_cache", ValueError, ["inv_freq", "cos_sin_cache"]),
    ("inv_freq and cos/sin", ValueError, ["inv_freq", "cos/sin"]),
    ("inv_freq narrower than rope_dim / 2", ValueError, ["inv_freq", "rotary_dim and head_dim are rope_dim"]),
    ("inv_freq 2-D", ValueError, ["inv_freq"]),
    ("inv_freq float16", TypeError, ["inv_freq"]),
    ("scale a string", TypeError, ["scale"]),
    ("scale without inv_freq", ValueError, ["scale"]),
])
def test_angles_without_a_table_refused_by_name_writing_nothing(change, error, words, backend):
    """Each refusal names the argument and writes nothing, also after a planned legal call of the same shapes."""
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(4, 2, 16, 32, torch.float32, num_blocks=2, block_size=4)
    positions = torch.arange(4, device=DEVICE)
    inv_freq, factor = yarn_frequencies(16, DEVICE)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, inv_freq=inv_freq, scale=factor)
    call = dict(inv_freq=inv_freq, scale=factor)
    if change == "inv_freq and cos_sin_cache":
        call["cos_sin_cache"] = torch.cat(ropekit.cos_sin_table(8, 16, device=DEVICE), -1)
    elif change == "inv_freq and cos/sin":
        call.update(zip(("cos", "sin"), ropekit.cos_sin_table(8, 16, device=DEVICE)))
    elif change == "inv_freq narrower than rope_dim / 2":
        call["inv_freq"] = inv_freq[:4]
    elif change == "inv_freq 2-D":
        call["inv_freq"] = inv_freq[None]
    elif change == "inv_freq float16":
        call["inv_freq"] = inv_freq.half()
    elif change == "scale a string":
        call["scale"] = "1.0"
    else:
        call = dict(zip(("cos", "sin"), ropekit.cos_sin_table(8, 16, device=DEVICE)), scale=1.5)
    before = [t.clone() for t in (q_pe, k_pe, kv_c, kv_cache)]
    with pytest.raises(error) as raised:
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, **call)
    assert all(word in str(raised.value) for word in words), str(raised.value)
    for t, b in zip((q_pe, k_pe, kv_c, kv_cache), before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))


def test_angles_without_a_table_under_torch_compile_and_in_a_cuda_graph():
    """The table-free call under torch.compile(fullgraph=True) writes the eager call's bytes; on a GPU, captured
    once, each replay at new device-resident positions and slots writes what an eager call writes."""
    q_pe, k_pe, kv_c, kv_cache, slots = mla_case(8, 4, 64, 512, torch.bfloat16, num_blocks=16, block_size=16,
                                                 cache_dtype=FP8)
    inv_freq, factor = yarn_frequencies(64, DEVICE)
    positions = torch.randint(0, 10_000_000, (8,), device=DEVICE)
    scale = torch.tensor([0.05], device=DEVICE)

    def step(q_pe, k_pe, kv_cache):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, inv_freq=inv_freq, scale=factor,
                                   kv_cache_scale=scale)
        return q_pe.float() * 2

    eager = (q_pe.clone(), k_pe.clone(), kv_cache.clone())
    want = step(*eager)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = (q_pe.clone(), k_pe.clone(), kv_cache.clone())
    torch.testing.assert_close(compiled(*got), want, rtol=0, atol=0)
    for a, b in zip(got, eager):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if DEVICE == "cpu":
        return
    graph = cuda_graph_of(lambda: step(q_pe, k_pe, kv_cache))
    for _ in range(2):
        positions.copy_(torch.randint(0, 10_000_000, (8,), device=DEVICE))
        slots.copy_(torch.randperm(16 * 16, device=DEVICE)[:8])
        for x in (q_pe, k_pe, kv_c):
            x.copy_(torch.randn_like(x))
        eager = (q_pe.clone(), k_pe.clone(), kv_cache.clone())
        step(*eager)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip((q_pe, k_pe, kv_cache), eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
