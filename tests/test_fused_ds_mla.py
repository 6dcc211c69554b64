"""DeepSeek's fp8_ds_mla latent-cache entry (vLLM's ``kv_cache_dtype="fp8_ds_mla"``, what FlashMLA's sparse attention
reads): ``mla_rope_and_cache`` rotates q_pe and k_pe and writes each token's entry ``[kv_c in e4m3 tiles | a float32
scale a tile of 128 channels | the rotated k_pe in the model's dtype]`` in one launch. Checked byte for byte against
the format's float64 reference (``ropekit.reference.ds_mla_entry``) and through its reader (``ds_mla_read``: each
e4m3 value times its tile's scale), on the Triton kernel and the native backend."""

import pytest
import torch

import ropekit
from ropekit import native, reference as ref
from ropekit.testing import assert_close_to_reference, ulp
from ropekit.triton import fused_tiles
from capture import cuda_graph_of, decode_page_table
from conftest import DEVICE

TILE = ref.DS_MLA_TILE


def entry_bytes(latent, rope_dim, dtype):
    return latent + 4 * (latent // TILE) + rope_dim * dtype.itemsize


def ds_case(tokens, heads, rope_dim, latent, dtype, num_blocks, block_size, seed=0):
    """q_pe (a slice of q), k_pe and kv_c (views of one projection, kv_c's tiles at unlike magnitudes, one tile all
    zeros), a uint8 cache of random bytes, shuffled slots with one -1."""
    g = torch.Generator().manual_seed(seed)
    q_pe = torch.randn(tokens, heads, rope_dim + 16, generator=g).to(dtype)[..., 16:].to(DEVICE)
    kv = torch.randn(tokens, latent + rope_dim, generator=g)
    kv[:, :latent] *= torch.logspace(-3, 3, latent // TILE).repeat_interleave(TILE)  # each tile its own scale
    kv[0, :TILE] = 0.0
    kv = kv.to(dtype).to(DEVICE)
    cache = torch.randint(0, 256, (num_blocks, block_size, entry_bytes(latent, rope_dim, dtype)), generator=g,
                          dtype=torch.uint8).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens].to(DEVICE)
    slots[min(1, tokens - 1)] = -1
    return q_pe, kv[:, latent:], kv[:, :latent], cache, slots


def check_entries(before, after, kv_c, want_k, slots, dtype):
    """Untouched rows keep their bytes; a written row's latent values and scales are the reference's bit for bit,
    its k_pe the float64 rotation's within the dtype's rounding; the reader gives kv_c within half an e4m3 spacing
    at the tile's scale (and the float32 quotient's rounding)."""
    latent = kv_c.shape[-1]
    flat_before, flat = before.reshape(-1, before.shape[-1]).cpu(), after.reshape(-1, after.shape[-1]).cpu()
    keep = (slots >= 0).cpu()
    written = slots.cpu()[keep]
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.equal(flat[untouched], flat_before[untouched])
    rows = flat[written]
    want = ref.ds_mla_entry(kv_c[keep].double(), want_k[keep], dtype)
    at = latent + 4 * (latent // TILE)
    assert torch.equal(rows[:, :at], want[:, :at])  # the e4m3 values and the float32 scales, bit for bit
    read_c, read_k = ref.ds_mla_read(rows, latent, dtype)
    assert_close_to_reference(read_k.to(dtype), want_k[keep])
    truth = kv_c[keep].double().cpu()
    scales = rows[:, latent:at].contiguous().view(torch.float32).double().repeat_interleave(TILE, -1)
    # (the format rounds the float32 quotient x / scale: half a spacing, plus that quotient's own rounding)
    quotient = truth / scales
    bound = (ulp(quotient, torch.float8_e4m3fn) / 2 + quotient.abs() * 2.0**-24) * scales
    assert bool(((read_c - truth).abs() <= bound).all())
    assert torch.equal(rows[0, latent:latent + 4].view(torch.float32), torch.tensor([2.0**-126]))  # a zero tile
    assert torch.equal(read_c[0, :TILE], torch.zeros(TILE, dtype=torch.float64))


def test_the_kernel_and_native_codes_agree():
    assert (native.PER_TILE, native.TILE_CHANNELS) == (fused_tiles.PER_TILE, fused_tiles.TILE_CHANNELS) == (4, TILE)
    assert native.PER_BLOCK == fused_tiles.PER_BLOCK and native.E4M3 == fused_tiles.E4M3


@pytest.mark.parametrize("shape", ["deepseek-512-64-bf16", "256-32-fp16"])
@pytest.mark.parametrize("inplace", [True, False], ids=["in-place", "out-of-place"])
def test_entries_by_slot_mapping_match_the_format(shape, inplace, backend):
    """DeepSeek's 512 + 64 in bf16 (the 656-byte entry) and another width: every written entry's bytes, the
    reader's round trip, q_pe and k_pe against the float64 rotation; the planned second call writes the same bytes."""
    latent, rope_dim, dtype = (512, 64, torch.bfloat16) if shape.startswith("deepseek") else (256, 32, torch.float16)
    q_pe, k_pe, kv_c, cache, slots = ds_case(6, 3, rope_dim, latent, dtype, num_blocks=3, block_size=4)
    assert cache.shape[-1] == (656 if shape.startswith("deepseek") else 328)
    cos, sin = ropekit.cos_sin_table(64, rope_dim, device=DEVICE)
    positions = torch.tensor([0, 7, 63, 12, 5, 40], device=DEVICE)
    q0, k0, before = q_pe.clone(), k_pe.clone(), cache.clone()
    call = dict(kv_cache_dtype="fp8_ds_mla", inplace=inplace)
    out_q, out_k = ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin, **call)
    want_q = ref.rope_table(q0, cos, sin, positions.cpu(), interleaved=True)
    want_k = ref.rope_table(k0[:, None], cos, sin, positions.cpu(), interleaved=True)[:, 0]
    assert_close_to_reference(out_q, want_q)
    assert_close_to_reference(out_k, want_k)
    if not inplace:
        assert torch.equal(q_pe, q0) and torch.equal(k_pe, k0)
    check_entries(before, cache, kv_c, want_k, slots, dtype)
    written = cache.clone()
    q_pe.copy_(q0), k_pe.copy_(k0)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin, **call)
    assert torch.equal(cache, written)


def test_entries_by_page_table_with_angles_without_a_table(backend):
    """FlashInfer's page table as the address map, the angles computed from YaRN's inverse frequencies at positions
    near 10^7 (no table), the entry as above."""
    tokens, block_size = 5, 4
    q_pe, k_pe, kv_c, cache, _ = ds_case(tokens, 2, 64, 512, torch.bfloat16, num_blocks=12, block_size=block_size)
    by = decode_page_table(tokens, 2, block_size, 12, DEVICE)
    batch, position = by["batch_indices"].long().cpu(), by["cache_positions"].long().cpu()
    page = by["kv_indices"].long().cpu()[by["kv_indptr"].long().cpu()[batch.clamp(min=0)] + position // block_size]
    slots = torch.where(batch >= 0, page * block_size + position % block_size, -1).to(DEVICE)
    inv_freq, _ = ropekit.rope_init({"rope_type": "yarn", "factor": 40.0, "rope_theta": 10000.0,
                                     "original_max_position_embeddings": 4096}, 64)
    positions = torch.tensor([9_999_999, 3, 4_000_000, 17, 1_048_576], device=DEVICE)
    k0, before = k_pe.clone(), cache.clone()
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, None, positions, inv_freq=inv_freq.to(DEVICE), scale=0.75,
                               kv_cache_dtype="fp8_ds_mla", **by)
    theta = positions.cpu().double()[:, None] * inv_freq.double()
    want_k = ref.rotate_pairs(k0.cpu()[:, None], torch.cos(theta)[:, None] * 0.75, torch.sin(theta)[:, None] * 0.75,
                              interleaved=True)[:, 0]
    assert_close_to_reference(k_pe, want_k)
    check_entries(before, cache, kv_c, want_k, slots, torch.bfloat16)


def test_a_tile_past_the_format_is_scaled_into_it_and_nan_is_not_counted(backend):
    """A tile whose values lie far past e4m3's 448 and one holding a NaN: each scale is its own tile's max|x| / 448
    (NaN not counted), the NaN stores a NaN, and the rest read back within half a spacing."""
    q_pe, k_pe, kv_c, cache, slots = ds_case(3, 1, 64, 512, torch.bfloat16, num_blocks=2, block_size=4)
    kv_c[2, :TILE] = torch.linspace(-5e4, 5e4, TILE, device=DEVICE)  # past e4m3's 448
    kv_c[2, TILE + 5] = float("nan")
    cos, sin = ropekit.cos_sin_table(16, 64, device=DEVICE)
    positions = torch.tensor([1, 2, 3], device=DEVICE)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin, kv_cache_dtype="fp8_ds_mla")
    row = cache.reshape(-1, 656)[int(slots[2])].cpu()
    scales = row[512:528].view(torch.float32)
    tiles = kv_c[2].float().cpu().view(4, TILE)
    amax = torch.where(tiles.isnan(), 0.0, tiles.abs()).amax(-1)
    assert torch.equal(scales, torch.maximum(amax / torch.full_like(amax, 448.0), torch.tensor(2.0**-126)))
    assert scales[0] > 100
    values = row[:512].view(torch.float8_e4m3fn).float()
    assert values[TILE + 5].isnan() and not values[:TILE + 5].isnan().any()


@pytest.mark.parametrize("change,error,words", [
    ("the pair form", ValueError, ["fp8_ds_mla", "pair"]),
    ("a float8 cache", ValueError, ["fp8_ds_mla", "torch.uint8"]),
    ("an entry of the bf16 latent cache's size", ValueError, ["fp8_ds_mla", "656"]),
    ("kv_c not whole tiles", ValueError, ["kv_c", "128"]),
    ("entries not 4-byte aligned", ValueError, ["kv_cache", "4 bytes"]),
    ("a misspelt name", ValueError, ["kv_cache_dtype", "fp8_ds_mla"]),
])
def test_refused_by_name_writing_nothing(change, error, words, backend):
    """Each refusal names the argument, after a planned legal call of the same shapes, and writes nothing."""
    q_pe, k_pe, kv_c, cache, slots = ds_case(4, 2, 64, 512, torch.bfloat16, num_blocks=2, block_size=4)
    cos, sin = ropekit.cos_sin_table(8, 64, device=DEVICE)
    positions = torch.arange(4, device=DEVICE)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin, kv_cache_dtype="fp8_ds_mla")
    kv_cache, name = cache, "fp8_ds_mla"
    if change == "the pair form":
        kv_cache = (cache[..., :512], cache[..., 512:])
    elif change == "a float8 cache":
        kv_cache = cache.view(torch.float8_e4m3fn)
    elif change == "an entry of the bf16 latent cache's size":
        kv_cache = torch.zeros(2, 4, 576 * 2, dtype=torch.uint8, device=DEVICE)
    elif change == "kv_c not whole tiles":
        kv_c = kv_c[:, :448]
        kv_cache = torch.zeros(2, 4, entry_bytes(448, 64, torch.bfloat16), dtype=torch.uint8, device=DEVICE)
    elif change == "entries not 4-byte aligned":
        kv_cache = torch.zeros(2, 4, 658, dtype=torch.uint8, device=DEVICE)[..., 2:]
    else:
        name = "fp8_ds-mla"
    caches = kv_cache if isinstance(kv_cache, tuple) else (kv_cache,)
    before = [t.clone() for t in (q_pe, k_pe, kv_c, *caches)]
    with pytest.raises(error) as raised:
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin, kv_cache_dtype=name)
    assert all(word in str(raised.value) for word in words), str(raised.value)
    for t, b in zip((q_pe, k_pe, kv_c, *caches), before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))


def test_torch_compile_and_a_cuda_graph_write_the_eager_bytes():
    """Under torch.compile(fullgraph=True), inductor on any device, the call writes the eager call's bytes (the
    custom op is given the entry cache itself and takes its views inside: views of one cache as three dtypes, written
    by the op, lost the rotated k_pe's bytes under inductor); on a GPU, DeepSeek's decode step (64 tokens, 128 heads)
    captured once writes at each replay, with new positions, slots and inputs, what an eager call writes."""
    tokens, heads = (64, 128) if DEVICE != "cpu" else (4, 2)
    q_pe, k_pe, kv_c, cache, slots = ds_case(tokens, heads, 64, 512, torch.bfloat16, num_blocks=32, block_size=64)
    cos, sin = ropekit.cos_sin_table(4096, 64, device=DEVICE)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)

    def step(q_pe, k_pe, kv_cache):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin,
                                   kv_cache_dtype="fp8_ds_mla")
        return q_pe.float() * 2

    eager = (q_pe.clone(), k_pe.clone(), cache.clone())
    want = step(*eager)
    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    got = (q_pe.clone(), k_pe.clone(), cache.clone())
    torch.testing.assert_close(compiled(*got), want, rtol=0, atol=0)
    for a, b in zip(got, eager):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if DEVICE == "cpu":
        return
    graph = cuda_graph_of(lambda: step(q_pe, k_pe, cache))
    for replay in range(2):
        positions.copy_(torch.randint(0, 4096, (tokens,), device=DEVICE))
        slots.copy_(torch.randperm(32 * 64, device=DEVICE)[:tokens])
        slots[replay] = -1
        for x in (q_pe, k_pe, kv_c):
            x.copy_(torch.randn_like(x) * (10.0 ** replay))
        eager = (q_pe.clone(), k_pe.clone(), cache.clone())
        step(*eager)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip((q_pe, k_pe, cache), eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_a_misaligned_cache_after_a_planned_call_of_the_same_shapes_is_refused_by_name(backend):
    """The plan of a legal call does not carry a cache whose entries start 2 bytes later (the same shapes and
    strides): validation refuses it by name, and nothing is written."""
    q_pe, k_pe, kv_c, _, slots = ds_case(2, 1, 8, 128, torch.bfloat16, num_blocks=1, block_size=2)
    entry = entry_bytes(128, 8, torch.bfloat16)
    pool = torch.zeros(2 * entry + 8, dtype=torch.uint8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    positions, slots = torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1], device=DEVICE)
    call = dict(kv_cache_dtype="fp8_ds_mla", inplace=False)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, pool[4:4 + 2 * entry].view(1, 2, entry), slots, positions, cos, sin,
                               **call)
    before = pool.clone()
    with pytest.raises(ValueError, match="kv_cache"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, pool[2:2 + 2 * entry].view(1, 2, entry), slots, positions, cos,
                                   sin, **call)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("latent", [128, 384])
def test_float64_inputs_whose_k_pe_would_sit_off_its_8_byte_alignment_are_refused_by_name(latent, backend):
    """float64 q_pe/k_pe/kv_c: with an odd number of tiles k_pe's values would start 4 bytes off their alignment (and
    an 8-byte-aligned cache is required): refused by name before any write; 512 channels work."""
    q_pe, k_pe, kv_c, _, slots = ds_case(2, 1, 8, latent, torch.float64, num_blocks=1, block_size=2)
    cache = torch.zeros(1, 2, entry_bytes(latent, 8, torch.float64), dtype=torch.uint8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE, dtype=torch.float64)
    positions, slots = torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="fp8_ds_mla.*kv_lora_rank"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache, slots, positions, cos, sin, kv_cache_dtype="fp8_ds_mla")
    assert not cache.any()


def test_a_misaligned_cache_under_torch_compile_is_refused_by_name():
    """A trace reads no storage offset: the op refuses the misaligned entry cache where it runs, by name, before it
    writes."""
    q_pe, k_pe, kv_c, _, slots = ds_case(2, 1, 8, 128, torch.bfloat16, num_blocks=1, block_size=2)
    entry = entry_bytes(128, 8, torch.bfloat16)
    pool = torch.zeros(2 * entry + 8, dtype=torch.uint8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE)
    positions, slots = torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1], device=DEVICE)

    def step(kv_cache):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin,
                                   kv_cache_dtype="fp8_ds_mla", inplace=False)

    with pytest.raises(Exception, match="kv_cache \\(fp8_ds_mla\\)"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(pool[2:2 + 2 * entry].view(1, 2, entry))
    assert not pool.any()


def test_float64_cache_4_bytes_off_after_a_planned_call_is_refused_by_name(backend):
    """float64 inputs read k_pe as 8-byte values: a cache 4 bytes off (4-byte aligned, not 8) after a planned legal
    call of the same shapes is not the plan's, and is refused by name before any write."""
    q_pe, k_pe, kv_c, _, _ = ds_case(2, 1, 8, 512, torch.float64, num_blocks=1, block_size=2)
    entry = entry_bytes(512, 8, torch.float64)
    pool = torch.zeros(2 * entry + 16, dtype=torch.uint8, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(8, 8, device=DEVICE, dtype=torch.float64)
    positions, slots = torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1], device=DEVICE)
    call = dict(kv_cache_dtype="fp8_ds_mla", inplace=False)
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, pool[8:8 + 2 * entry].view(1, 2, entry), slots, positions, cos, sin,
                               **call)
    before = pool.clone()
    with pytest.raises(ValueError, match="kv_cache"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, pool[4:4 + 2 * entry].view(1, 2, entry), slots, positions, cos,
                                   sin, **call)
    assert torch.equal(pool, before)
