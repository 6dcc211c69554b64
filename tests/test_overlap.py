"""One overlap rule for every op: a written tensor (a cache, q or k in place) may share no byte with itself, another
written tensor or any tensor the call reads (q, k, v, the tables, positions, slot_mapping, cu_seqlens,
cache_offsets, the scales, the norm weights), whatever their dtypes. The refusal comes before anything is written
and names the caller's arguments; views that share a buffer without sharing a byte (slices of one packed qkv
projection, two halves of one cache allocation) stay accepted. A cache write is inference: with grad enabled, a
cache that requires grad is refused by name."""

import pytest
import torch

import ropekit
from ropekit.engines import FusedSetKVBufferArg
from conftest import DEVICE

FP8 = torch.float8_e4m3fn
T, HQ, HK, D, BLOCKS, BLOCK = 4, 2, 1, 16, 3, 4


def _call(variant="paged", dtype=torch.float32, cache_dtype=None, inplace=False, write_k=False):
    """A valid rope_and_cache call, every tensor its own allocation."""
    cache_dtype = cache_dtype or dtype
    g = dict(q=torch.randn(1, T, HQ, D, device=DEVICE).to(dtype), k=torch.randn(1, T, HK, D, device=DEVICE).to(dtype),
             v=torch.randn(1, T, HK, D, device=DEVICE).to(dtype), inplace=inplace, write_k=write_k)
    g["cos"], g["sin"] = ropekit.cos_sin_table(8, D, device=DEVICE)
    shape = (1, 8, HK, D) if variant == "contiguous" else (BLOCKS, BLOCK, HK, D)
    g["k_cache"] = torch.randn(shape, device=DEVICE).to(cache_dtype)
    g["v_cache"] = torch.randn(shape, device=DEVICE).to(cache_dtype)
    if variant == "contiguous":
        g["cache_offsets"] = torch.tensor([2], device=DEVICE)
    else:
        g["slot_mapping"] = torch.tensor([5, 0, 9, 2], device=DEVICE)
    if variant == "thd":
        for name in ("q", "k", "v"):
            g[name] = g[name][0]
        g.update(layout="thd", cu_seqlens=torch.tensor([0, 3, 4], device=DEVICE), max_seqlen=3,
                 positions=torch.tensor([1, 6], device=DEVICE))
    else:
        g["positions"] = torch.tensor([3], device=DEVICE)
    if variant == "norm":
        g["q_weight"], g["k_weight"] = torch.rand(D, device=DEVICE), torch.rand(D, device=DEVICE)
    if cache_dtype == FP8:
        g["k_scale"], g["v_scale"] = torch.tensor([0.5], device=DEVICE), torch.tensor([0.25], device=DEVICE)
    return g


def _inside(host: torch.Tensor, t: torch.Tensor, byte_offset: int = 0) -> torch.Tensor:
    """A copy of ``t`` (same shape, contiguous) whose bytes lie inside ``host``'s, from ``byte_offset``."""
    nbytes = t.numel() * t.element_size()
    alias = host.view(torch.uint8).view(-1)[byte_offset:byte_offset + nbytes].view(t.dtype).view(t.shape)
    alias.copy_(t)
    return alias


def _assert_refused(op, call: dict, names: tuple, *, error=ValueError):
    """The call raises naming ``names`` and leaves every tensor of the call bit for bit."""
    tensors = {n: t for n, t in call.items() if isinstance(t, torch.Tensor)}
    before = {n: t.clone() for n, t in tensors.items()}
    with pytest.raises(error, match=r"share memory|memory location") as caught:
        op(**call)
    for name in names:
        assert name in str(caught.value), (name, str(caught.value))
    for name, t in tensors.items():
        assert torch.equal(t.view(torch.uint8), before[name].view(torch.uint8)), name


def _own(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in its own allocation, with t's strides."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _warm(op, call: dict, cached: bool) -> None:
    """``cached``: run the same signature (shapes, strides, dtypes) first, every tensor in its own allocation, so that
    the refused call takes the cached path of a repeated signature."""
    if cached:
        op(**{n: (_own(t) if isinstance(t, torch.Tensor) else t) for n, t in call.items()})


# --- finding 1: a written cache against q and k that are not written --------------------------------------------------

@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-signature"])
@pytest.mark.parametrize("case", ["k_cache-over-q-out-of-place", "v_cache-over-k-out-of-place",
                                  "k-in-place-q-without-write_k"])
def test_written_cache_is_compared_with_q_and_k_that_are_only_read(case, cached):
    call = _call(inplace=case.startswith("k-in-place"))
    if case == "k_cache-over-q-out-of-place":  # the cache lies on q's second half
        call["k_cache"] = _inside(call["q"], call["k_cache"][:1], call["q"].nbytes // 2)
        call["v_cache"], call["slot_mapping"] = call["v_cache"][:1], torch.tensor([0, 1, 2, 3], device=DEVICE)
        names = ("k_cache", "q")
    elif case == "v_cache-over-k-out-of-place":
        call["v_cache"] = _inside(call["k"], call["v_cache"][:1]).view(1, BLOCK, HK, D)
        call["k_cache"], call["slot_mapping"] = call["k_cache"][:1], torch.tensor([0, 1, 2, 3], device=DEVICE)
        names = ("v_cache", "k")
    else:  # in place without write_k: q is written, k (head 0 of q) is only read
        call["k"] = call["q"][:, :, :1]
        names = ("q", "k")
    _warm(ropekit.rope_and_cache, call, cached)
    _assert_refused(ropekit.rope_and_cache, call, names)


def _mla_call(inplace):
    latent, rope = 8, 4
    return dict(q_pe=torch.randn(T, 2, rope, device=DEVICE), k_pe=torch.randn(T, rope, device=DEVICE),
                kv_c=torch.randn(T, latent, device=DEVICE), kv_cache=torch.randn(2, 4, latent + rope, device=DEVICE),
                slot_mapping=torch.tensor([1, 5, -1, 0], device=DEVICE), positions=torch.tensor([0, 3, 2, 7],
                                                                                                  device=DEVICE),
                cos_sin_cache=torch.cat(ropekit.cos_sin_table(8, rope, device=DEVICE), -1), inplace=inplace)


@pytest.mark.parametrize("partner", ["q_pe", "k_pe", "kv_c", "positions", "slot_mapping", "cos_sin_cache"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_mla_kv_cache_is_compared_with_every_input(partner, inplace):
    call = _mla_call(inplace)
    call[partner] = _inside(call["kv_cache"], call[partner], 8)
    _assert_refused(ropekit.mla_rope_and_cache, call, ("kv_cache", partner))


# --- findings 2 and 3: read-only inputs of any dtype against the written tensors --------------------------------------

READ = [("paged", "cos"), ("paged", "sin"), ("paged", "positions"), ("paged", "slot_mapping"), ("paged", "v"),
        ("contiguous", "cache_offsets"), ("thd", "cu_seqlens"), ("thd", "positions"), ("norm", "q_weight"),
        ("norm", "k_weight"), ("fp8", "k_scale"), ("fp8", "v_scale")]


@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-signature"])
@pytest.mark.parametrize("written", ["k_cache", "v_cache", "q-in-place"])
@pytest.mark.parametrize("variant,read", READ, ids=[f"{r}-{v}" for v, r in READ])
def test_every_read_input_is_compared_with_every_written_tensor(variant, read, written, cached):
    call = _call("paged" if variant == "fp8" else variant, cache_dtype=FP8 if variant == "fp8" else None,
                 inplace=written == "q-in-place")
    host = call["q" if written == "q-in-place" else written]
    call[read] = _inside(host, call[read], 8)
    _warm(ropekit.rope_and_cache, call, cached)
    _assert_refused(ropekit.rope_and_cache, call, (written.split("-")[0], read))


@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-signature"])
@pytest.mark.parametrize("written", ["k_cache", "v_cache", "q-in-place"])
@pytest.mark.parametrize("scale", ["k_scale", "v_scale"])
def test_a_scale_that_an_unquantised_cache_never_reads_is_not_compared(scale, written, cached):
    """Engines pass their scales whatever the cache holds: beside a float32 cache they are unread, so a scale lying
    inside a written tensor is accepted, and the call writes what it writes without it."""
    call = _call(inplace=written == "q-in-place")
    call[scale] = _inside(call["q" if written == "q-in-place" else written], torch.tensor([0.5], device=DEVICE), 8)
    without = {n: (_own(t) if isinstance(t, torch.Tensor) else t) for n, t in call.items() if n != scale}
    _warm(ropekit.rope_and_cache, call, cached)
    got, want = ropekit.rope_and_cache(**call), ropekit.rope_and_cache(**without)
    assert torch.equal(got[0], want[0])
    for name in ("q", "k_cache", "v_cache"):
        assert torch.equal(call[name], without[name]), name


@pytest.mark.parametrize("case", ["fp8-v_cache-on-bf16-v", "fp8-k_cache-on-in-place-bf16-q",
                                  "fp8-k_cache-on-the-last-byte-of-bf16-v"])
def test_overlaps_across_element_sizes_are_detected(case):
    """A float8 cache and bf16 activations carved from one byte pool: byte spans compare, not element indices."""
    call = _call(dtype=torch.bfloat16, cache_dtype=FP8, inplace="in-place" in case)
    if case == "fp8-v_cache-on-bf16-v":
        call["v_cache"] = _inside(call["v"], call["v_cache"][:1], 2)
        call["k_cache"], call["slot_mapping"] = call["k_cache"][:1], torch.tensor([0, 1, 2, 3], device=DEVICE)
        names = ("v_cache", "v")
    elif case == "fp8-k_cache-on-in-place-bf16-q":
        call["k_cache"] = _inside(call["q"], call["k_cache"][:2], 1)
        call["v_cache"], call["slot_mapping"] = call["v_cache"][:2], torch.tensor([0, 1, 2, 3], device=DEVICE)
        names = ("k_cache", "q")
    else:  # the cache's first byte is the second byte of v's last element
        pool = torch.zeros(call["k_cache"].nbytes + call["v"].nbytes, dtype=torch.uint8, device=DEVICE)
        call["v"] = _inside(pool, call["v"])
        call["k_cache"] = _inside(pool, call["k_cache"], call["v"].nbytes - 1)
        names = ("k_cache", "v")
    _assert_refused(ropekit.rope_and_cache, call, names)


# --- finding 4: qk_norm_rope in place against its weights and tables, and apply_rope in place -------------------------

@pytest.mark.parametrize("read", ["q_weight", "k_weight", "cos", "sin", "positions"])
def test_qk_norm_rope_in_place_is_compared_with_weights_and_tables(read):
    call = dict(q=torch.randn(1, T, HQ, D, device=DEVICE), k=torch.randn(1, T, HK, D, device=DEVICE),
                q_weight=torch.rand(D, device=DEVICE), k_weight=torch.rand(D, device=DEVICE),
                positions=torch.tensor([3], device=DEVICE), inplace=True)
    call["cos"], call["sin"] = ropekit.cos_sin_table(8, D, device=DEVICE)
    call[read] = _inside(call["q"], call[read])  # q's first token is the weight (or the table's first rows)
    _assert_refused(ropekit.qk_norm_rope, call, ("q", read))


@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-signature"])
@pytest.mark.parametrize("read", ["cos", "sin", "positions", "cu_seqlens"])
def test_apply_rope_in_place_is_compared_with_what_it_reads(read, cached):
    call = dict(q=torch.randn(T, HQ, D, device=DEVICE), k=torch.randn(T, HK, D, device=DEVICE), layout="thd",
                cu_seqlens=torch.tensor([0, 3, 4], device=DEVICE), max_seqlen=3,
                positions=torch.tensor([0, 1, 2, 5], device=DEVICE), inplace=True)
    call["cos"], call["sin"] = ropekit.cos_sin_table(8, D, device=DEVICE)
    call[read] = _inside(call["q"], call[read], 8)
    _warm(ropekit.apply_rope, call, cached)
    _assert_refused(ropekit.apply_rope, call, ("q", read), error=RuntimeError)


@pytest.mark.parametrize("case", ["query-on-cos_sin_cache", "k_buffer-on-query"])
def test_engines_refuse_overlaps_in_their_own_names(case):
    query, key = torch.randn(T, HQ * D, device=DEVICE), torch.randn(T, HK * D, device=DEVICE)
    cos_sin_cache = torch.cat(ropekit.cos_sin_table(8, D, device=DEVICE), -1)
    positions = torch.tensor([0, 3, 2, 5], device=DEVICE)
    if case == "query-on-cos_sin_cache":
        query = _inside(cos_sin_cache, query)
        with pytest.raises(ValueError, match="q and cos share memory.*q is query.*cos_sin_cache"):
            ropekit.rotary_embedding(positions, query, key, D, cos_sin_cache, True)
        return
    value = torch.randn(T, HK * D, device=DEVICE)
    k_buffer = _inside(query, torch.zeros(T, HK * D, device=DEVICE))
    arg = FusedSetKVBufferArg(value=value, k_buffer=k_buffer, v_buffer=torch.zeros_like(value),
                              cache_loc=torch.arange(T, device=DEVICE))
    with pytest.raises(ValueError, match="q and k_cache share memory.*q is query.*k_buffer"):
        ropekit.apply_rope_with_cos_sin_cache_inplace(positions, query, key, D, cos_sin_cache, True, arg)


# --- what stays accepted: buffers shared without sharing a byte -------------------------------------------------------

def _separate(call: dict) -> dict:
    return {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in call.items()}


@pytest.mark.parametrize("case", ["packed-qkv-in-place-write_k", "packed-qkv-out-of-place",
                                  "vllm-kv-pairs-of-one-allocation", "fp8-cache-and-bf16-qkv-of-one-byte-pool"])
def test_shared_buffers_without_shared_bytes_are_accepted(case):
    fp8 = case.startswith("fp8")
    dtype = torch.bfloat16 if fp8 else torch.float32
    call = _call(dtype=dtype, cache_dtype=FP8 if fp8 else None, inplace="in-place" in case,
                 write_k="write_k" in case)
    qkv = torch.randn(T, (HQ + 2 * HK) * D, device=DEVICE).to(dtype)
    if case.startswith("packed") or fp8:
        cache_bytes = 2 * call["k_cache"].nbytes if fp8 else 0
        pool = torch.zeros(qkv.nbytes + cache_bytes, dtype=torch.uint8, device=DEVICE)
        qkv = _inside(pool, qkv)
        call["q"] = qkv[:, :HQ * D].view(1, T, HQ, D)
        call["k"] = qkv[:, HQ * D:(HQ + HK) * D].view(1, T, HK, D)
        call["v"] = qkv[:, (HQ + HK) * D:].view(1, T, HK, D)
        if fp8:  # the caches follow the activations in the same bytes
            call["k_cache"] = _inside(pool, call["k_cache"], qkv.nbytes)
            call["v_cache"] = _inside(pool, call["v_cache"], qkv.nbytes + call["k_cache"].nbytes)
    else:  # vLLM allocates (num_blocks, 2, block_size, heads, dim) and passes kv[:, 0] and kv[:, 1]
        kv = torch.stack((call["k_cache"], call["v_cache"]), 1)
        call["k_cache"], call["v_cache"] = kv[:, 0], kv[:, 1]
    want = _separate(call)
    want_out = ropekit.rope_and_cache(**want)
    got_out = ropekit.rope_and_cache(**call)
    for name in ("q", "k", "v", "k_cache", "v_cache"):
        assert torch.equal(call[name].view(torch.uint8), want[name].view(torch.uint8)), name
    for got, expected in zip(got_out, want_out):
        assert (got is None) == (expected is None) and (got is None or torch.equal(got, expected))


def test_mla_column_slices_of_one_projection_are_accepted():
    """DeepSeek's kv_c and k_pe are the two column ranges of one projection; q_pe a slice of q's heads."""
    call = _mla_call(True)
    latent = torch.randn(T, 8 + 4, device=DEVICE)
    q = torch.randn(T, 2, 6, device=DEVICE)
    call.update(kv_c=latent[:, :8], k_pe=latent[:, 8:], q_pe=q[..., 2:])
    want = _separate(call)
    ropekit.mla_rope_and_cache(**want)
    ropekit.mla_rope_and_cache(**call)
    for name in ("q_pe", "k_pe", "kv_c", "kv_cache"):
        assert torch.equal(call[name], want[name]), name


@pytest.mark.parametrize("op", ["apply_rope", "qk_norm_rope", "rotary_embedding"])
def test_in_place_on_packed_qkv_slices_is_accepted(op):
    qkv = torch.randn(T, (HQ + 2 * HK) * D, device=DEVICE)
    want = qkv.clone()
    cos, sin = ropekit.cos_sin_table(8, D, device=DEVICE)
    positions = torch.tensor([0, 3, 2, 5], device=DEVICE)

    def views(x):
        return x[:, :HQ * D].view(1, T, HQ, D), x[:, HQ * D:(HQ + HK) * D].view(1, T, HK, D)

    if op == "rotary_embedding":
        cos_sin_cache = torch.cat((cos, sin), -1)
        for x in (qkv, want):
            ropekit.rotary_embedding(positions, x[:, :HQ * D], x[:, HQ * D:(HQ + HK) * D], D, cos_sin_cache, True)
    else:
        kwargs = dict(positions=positions[None], inplace=True)
        if op == "qk_norm_rope":
            kwargs.update(q_weight=torch.rand(D, device=DEVICE), k_weight=torch.rand(D, device=DEVICE))
        fn = getattr(ropekit, op)
        fn(*views(qkv), cos, sin, **kwargs)
        q, k = (t.clone() for t in views(want))
        fn(q, k, cos, sin, **kwargs)
        views(want)[0].copy_(q)
        views(want)[1].copy_(k)
    assert torch.equal(qkv, want)


# --- finding 6: a cache write is inference ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["k_cache", "v_cache"])
def test_a_cache_that_requires_grad_is_refused_by_name(name):
    call = _call()
    call[name].requires_grad_(True)
    before = {n: t.detach().clone() for n, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(ValueError, match=f"{name} requires grad"):
        ropekit.rope_and_cache(**call)
    for n, t in before.items():
        assert torch.equal(call[n].detach(), t), n
    with torch.no_grad():  # as PyTorch's in-place ops: under no_grad the leaf is written
        ropekit.rope_and_cache(**call)


def test_mla_kv_cache_that_requires_grad_is_refused_by_name():
    call = _mla_call(True)
    call["kv_cache"].requires_grad_(True)
    with pytest.raises(ValueError, match="kv_cache requires grad"):
        ropekit.mla_rope_and_cache(**call)


def test_in_place_q_on_a_ropetables_rows_is_refused_by_name():
    """With table= the call reads the table's cos/sin: an in-place q lying on them is refused, naming table."""
    table = ropekit.RopeTable(8, 16, device=DEVICE)  # cos, sin: (16, 4) float32
    q = table.cos.view(-1)[:32].view(1, 1, 4, 8)
    before = table.cos.clone()
    with pytest.raises(ValueError, match="table"):
        ropekit.apply_rope(q, None, table=table, inplace=True)
    assert torch.equal(table.cos, before)


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.float64], ids=["float32-tables", "float64-tables"])
def test_mla_in_place_k_pe_on_the_callers_sin_is_refused(table_dtype, transposed):
    """MLA reads the caller's cos/sin (a float32 copy of them when they are not float32): k_pe written in place on
    sin's bytes is refused by name, whatever dtype the tables have."""
    tokens, heads, rope_dim, latent = 2, 3, 8, 8
    cos = torch.randn(16, rope_dim // 2, dtype=table_dtype, device=DEVICE)
    sin = torch.randn(16, rope_dim // 2, dtype=table_dtype, device=DEVICE)
    if transposed:  # a table validation reads through a contiguous copy
        sin = torch.randn(rope_dim // 2, 16, dtype=table_dtype, device=DEVICE).t()
    storage = torch.empty(0, dtype=table_dtype, device=DEVICE).set_(sin.untyped_storage())  # sin's bytes, flat
    k_pe = storage.view(torch.float32)[: tokens * rope_dim].view(tokens, rope_dim)  # on sin's first bytes
    q_pe = torch.randn(tokens, heads, rope_dim, device=DEVICE)
    kv_c = torch.randn(tokens, latent, device=DEVICE)
    kv_cache = torch.zeros(2, 2, latent + rope_dim, device=DEVICE)
    slots, positions = torch.tensor([0, 1], device=DEVICE), torch.tensor([1, 2], device=DEVICE)
    before = sin.clone()
    with pytest.raises(ValueError, match="k_pe"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos=cos, sin=sin, inplace=True)
    assert torch.equal(sin, before) and not kv_cache.any()


def test_mla_in_place_k_pe_on_a_short_slot_mappings_bytes_is_refused():
    """A slot mapping shorter than the tokens is read through a padded copy: the rule compares the caller's own
    mapping, so an in-place k_pe lying on its bytes is refused by name."""
    tokens, heads, rope_dim, latent = 4, 2, 8, 8
    pool = torch.zeros(16, dtype=torch.int64, device=DEVICE)  # 128 bytes: the mapping, then k_pe on the same bytes
    slot_mapping = pool[:2]  # covers the first two tokens; the rest are padding
    k_pe = pool.view(torch.float32)[: tokens * rope_dim].view(tokens, rope_dim)
    q_pe = torch.randn(tokens, heads, rope_dim, device=DEVICE)
    kv_c = torch.randn(tokens, latent, device=DEVICE)
    kv_cache = torch.zeros(2, 2, latent + rope_dim, device=DEVICE)
    cos_sin_cache = torch.randn(8, rope_dim, device=DEVICE)
    with pytest.raises(ValueError, match="k_pe"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slot_mapping, torch.arange(tokens, device=DEVICE),
                                   cos_sin_cache=cos_sin_cache, inplace=True)
    assert not pool.any() and not kv_cache.any()
