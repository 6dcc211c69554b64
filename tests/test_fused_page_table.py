"""Every cache address map of the fused forward: FlashInfer's page table (``kv_indices``, ``kv_indptr`` and a request
and a position per token) in NHD and HND layouts, FlashInfer's ``paged_kv_cache`` forms (a pair, one 5-D tensor),
and MLA written to two separate caches ``(ckv_cache, kpe_cache)``. Each is checked by a reader round trip: ropekit
writes, a reference implementation of the reader FlashInfer's attention uses (a gather through the page table)
reads back, and the result is compared with the float64 truth; every cache element no token names stays bit for
bit, and so does memory around the caches."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference, ulp
from capture import cuda_graph_of
from conftest import DEVICE, gpu_only

FP8 = torch.float8_e4m3fn


# --- FlashInfer's page table and its reader, written from its documentation ---------------------------------------

def page_table(seq_lens, append_lens, page_size, num_pages, *, index_dtype=torch.int32):
    """Requests holding ``seq_lens`` tokens after this step's ``append_lens`` new ones, their pages scattered over
    the pool (FlashInfer's CSR page table), and what ``flashinfer.get_batch_indices_positions`` gives for the
    appended tokens: the request of each and its position in the request (``seq_len - append_len + i``)."""
    pages_per_request = [(n + page_size - 1) // page_size for n in seq_lens]
    order = torch.randperm(num_pages)[:sum(pages_per_request)]
    kv_indptr = torch.tensor([0] + torch.tensor(pages_per_request).cumsum(0).tolist())
    kv_last_page_len = torch.tensor([n - (p - 1) * page_size for n, p in zip(seq_lens, pages_per_request)])
    batch_indices = torch.cat([torch.full((a,), b) for b, a in enumerate(append_lens)])
    positions = torch.cat([torch.arange(n - a, n) for n, a in zip(seq_lens, append_lens)])
    append_indptr = torch.tensor([0] + torch.tensor(append_lens).cumsum(0).tolist())
    return {name: t.to(index_dtype).to(DEVICE) for name, t in dict(
        kv_indices=order, kv_indptr=kv_indptr, kv_last_page_len=kv_last_page_len, batch_indices=batch_indices,
        cache_positions=positions, append_indptr=append_indptr).items()}


def read_paged(cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout):
    """FlashInfer's attention reader: request ``b``'s keys (or values), ``(seq_len, heads, dim)``, gathered page by
    page through ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, the last page holding ``kv_last_page_len[b]`` rows;
    an HND page is ``(heads, page_size, dim)``."""
    indices, indptr, last = kv_indices.cpu().long(), kv_indptr.cpu().long(), kv_last_page_len.cpu().long()
    cache = cache.cpu()
    requests = []
    for b in range(indptr.shape[0] - 1):
        pages = [cache[int(p)] for p in indices[indptr[b]:indptr[b + 1]]]
        pages = [p.transpose(0, 1) if kv_layout == "HND" else p for p in pages]  # (page_size, heads, dim)
        rows = torch.cat(pages)
        requests.append(rows[:rows.shape[0] - pages[-1].shape[0] + int(last[b])])
    return requests


def addressed(cache, table, kv_layout):
    """A bool mask over ``cache``'s (page, row) entries: the rows the appended tokens name (FlashInfer's kernel:
    ``page_iter, row = divmod(kv_indptr[b] * page_size + position, page_size)``)."""
    page_size = cache.shape[2 if kv_layout == "HND" else 1]
    mask = torch.zeros(cache.shape[0], page_size, dtype=torch.bool)
    for b, p in zip(table["batch_indices"].cpu().tolist(), table["cache_positions"].cpu().tolist()):
        if b < 0:
            continue
        page_iter, row = divmod(int(table["kv_indptr"][b]) * page_size + p, page_size)
        mask[int(table["kv_indices"][page_iter]), row] = True
    return mask


def rows_of(cache, kv_layout):
    """``cache`` as ``(pages, page_size, heads, dim)`` on the CPU (a view)."""
    cache = cache.cpu()
    return cache.transpose(1, 2) if kv_layout == "HND" else cache


def assert_round_trip(cache_before, cache_after, truth64, table, kv_layout, *, scale=None, exact=False):
    """Read back every request through the page table: each appended token's row holds its truth (bit for bit when
    ``exact``; within one e4m3 spacing of ``truth / scale`` for a float8 cache); every other row is unchanged."""
    requests = read_paged(cache_after, table["kv_indices"], table["kv_indptr"], table["kv_last_page_len"], kv_layout)
    for t, (b, p) in enumerate(zip(table["batch_indices"].cpu().tolist(), table["cache_positions"].cpu().tolist())):
        got, want = requests[b][p], truth64[t]
        if scale is not None:
            quotient = want / float(scale)
            if exact:
                assert torch.equal(got.double(), ref.e4m3((want.float() / scale.cpu()).double())), t
            else:
                assert bool(((got.double() - quotient).abs() <= ulp(quotient, FP8)).all()), t
        elif exact:
            assert torch.equal(got, want.to(got.dtype)), t
        else:
            assert_close_to_reference(got, want)
    keep = ~addressed(cache_after, table, kv_layout)
    after, before = rows_of(cache_after, kv_layout), rows_of(cache_before, kv_layout)
    assert torch.equal(after[keep].view(torch.uint8), before[keep].view(torch.uint8))


def caches_for(kv_layout, num_pages, page_size, heads, dim, dtype):
    shape = (num_pages, heads, page_size, dim) if kv_layout == "HND" else (num_pages, page_size, heads, dim)
    return torch.randn(shape, device=DEVICE).to(dtype), torch.randn(shape, device=DEVICE).to(dtype)


CASES = {  # (seq_lens after the step, tokens appended this step)
    "prefill": ([11, 4, 9], [11, 4, 5]),   # two fresh requests and a chunk appended to a third
    "decode": ([7, 16, 1, 30], [1, 1, 1, 1]),
}


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("step", list(CASES))
@pytest.mark.parametrize("cache_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [4, 3])
def test_page_table_round_trip(backend, kv_layout, step, cache_dtype, page_size):
    """rope_and_cache through FlashInfer's page table (packed tokens, thd), read back by FlashInfer's reader; pages
    of a power of two and of another size (the kernel divides by a constant page size)."""
    seq_lens, append_lens = CASES[step]
    hq, hk, d, num_pages = 4, 2, 16, 32
    table = page_table(seq_lens, append_lens, page_size, num_pages)
    tokens = sum(append_lens)
    q = torch.randn(tokens, hq, d, device=DEVICE).to(torch.bfloat16)
    k = torch.randn(tokens, hk, d, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(tokens, hk, d, device=DEVICE).to(torch.bfloat16)
    fp8 = cache_dtype == "fp8"
    k_cache, v_cache = caches_for(kv_layout, num_pages, page_size, hk, d, FP8 if fp8 else torch.bfloat16)
    before = k_cache.clone(), v_cache.clone()
    scale = torch.tensor([0.05], device=DEVICE)
    cos, sin = ropekit.cos_sin_table(64, d, device=DEVICE)
    rope_positions = table["cache_positions"]  # FlashInfer's pos_ids: here each token's position in its request
    out_q, _ = ropekit.rope_and_cache(
        q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, kv_indices=table["kv_indices"],
        kv_indptr=table["kv_indptr"], batch_indices=table["batch_indices"], cache_positions=table["cache_positions"],
        kv_layout=kv_layout, positions=rope_positions[None], layout="thd", cu_seqlens=table["append_indptr"],
        max_seqlen=max(append_lens), k_scale=scale if fp8 else None, v_scale=scale if fp8 else None)
    pos = rope_positions.cpu().long()
    assert_close_to_reference(out_q, ref.rope_table(q, cos, sin, pos))
    assert_round_trip(before[0], k_cache, ref.rope_table(k, cos, sin, pos), table, kv_layout,
                      scale=scale.cpu() if fp8 else None)
    assert_round_trip(before[1], v_cache, v.double().cpu(), table, kv_layout, scale=scale.cpu() if fp8 else None,
                      exact=True)


@pytest.mark.parametrize("form", ["pair", "5-D"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_flashinfer_paged_kv_cache_forms(backend, form, kv_layout):
    """``k_cache`` may be FlashInfer's ``paged_kv_cache``: a (k_cache, v_cache) pair or one 5-D tensor whose
    ``[:, 0]`` is the k cache and ``[:, 1]`` the v cache; decode, bshd with seq 1, int64 indices."""
    hq, hk, d, page_size, num_pages = 2, 2, 8, 2, 10
    table = page_table([3, 6, 2], [1, 1, 1], page_size, num_pages, index_dtype=torch.int64)
    q, k, v = (torch.randn(3, 1, h, d, device=DEVICE) for h in (hq, hk, hk))
    inner = (hk, page_size) if kv_layout == "HND" else (page_size, hk)
    paged = torch.randn(num_pages, 2, *inner, d, device=DEVICE)
    before = paged.clone()
    cos, sin = ropekit.cos_sin_table(16, d, device=DEVICE)
    address = {n: table[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")}
    given = (paged[:, 0], paged[:, 1]) if form == "pair" else paged
    ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=given, kv_layout=kv_layout, positions=table["cache_positions"],
                           **address)
    pos = table["cache_positions"].cpu()[:, None]
    assert_round_trip(before[:, 0], paged[:, 0], ref.rope_table(k, cos, sin, pos)[:, 0], table, kv_layout)
    assert_round_trip(before[:, 1], paged[:, 1], v[:, 0].double().cpu(), table, kv_layout, exact=True)


def test_hnd_applies_to_every_cache_form(backend):
    """kv_layout says where the head axis lies whatever the address map: a slot mapping into an HND cache, and a
    contiguous HND cache (HF's static-cache layout, ``(batch, heads, max_seq, dim)``)."""
    hk, d = 2, 8
    k, v = torch.randn(2, 3, hk, d, device=DEVICE), torch.randn(2, 3, hk, d, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, d, device=DEVICE)
    want_k = ref.rope_table(k, cos, sin, ref.token_positions(2, 3))
    nhd_caches = torch.zeros(2, 5, 4, hk, d, device=DEVICE)
    hnd_caches = torch.zeros(2, 5, hk, 4, d, device=DEVICE)
    slots = torch.tensor([0, 5, 9, 14, 3, 18], device=DEVICE)
    for caches, kv_layout in ((nhd_caches, "NHD"), (hnd_caches, "HND")):
        ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots,
                               kv_layout=kv_layout)
    assert torch.equal(nhd_caches, hnd_caches.transpose(2, 3))
    assert_close_to_reference(nhd_caches[0].reshape(-1, hk, d)[slots.cpu()].cpu(), want_k.reshape(-1, hk, d))
    contiguous = torch.zeros(2, 2, hk, 6, d, device=DEVICE)  # (k and v, batch, heads, max_seq, dim)
    ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=contiguous[0], v_cache=contiguous[1], cache_offsets=2,
                           kv_layout="HND")
    assert_close_to_reference(contiguous[0].transpose(1, 2)[:, 2:5].cpu(), want_k)
    assert torch.equal(contiguous[1].transpose(1, 2)[:, 2:5], v)


def test_padding_and_positions_past_the_pages_write_nothing(backend):
    """A batch index of -1 (get_batch_indices_positions' padding) and, outside check mode, a position past its
    request's pages, a batch index past the requests or a page outside the pool write nothing: the caches lie in a
    larger buffer whose guard elements stay bit for bit."""
    hk, d, page_size, num_pages = 1, 8, 2, 6
    table = page_table([3, 4], [3, 3], page_size, num_pages)
    table["batch_indices"][1] = -1
    table["cache_positions"][2] = 4          # request 0 has two pages: rows 0..3
    table["batch_indices"][3] = 5            # only two requests
    table["kv_indices"][3] = num_pages + 3   # request 1's second page lies outside the pool
    buffer = torch.full((num_pages * page_size * hk * d * 2 + 64,), 777.0, device=DEVICE)
    k_cache = buffer[32:32 + num_pages * page_size * hk * d].view(num_pages, page_size, hk, d)
    v_cache = buffer[-32 - k_cache.numel():-32].view(k_cache.shape)
    before = buffer.clone()
    k, v = torch.randn(6, hk, d, device=DEVICE), torch.randn(6, hk, d, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, d, device=DEVICE)
    ropekit.rope_and_cache(k, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, layout="thd",
                           cu_seqlens=table["append_indptr"], max_seqlen=3, positions=table["cache_positions"],
                           **{n: table[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")})
    # only token 0 (request 0, position 0) is written: its k and v rows; everything else, guards included, stays
    page0 = int(table["kv_indices"][0])
    keep = torch.ones_like(buffer, dtype=torch.bool)
    for view, base in ((k_cache, 32), (v_cache, buffer.shape[0] - 32 - k_cache.numel())):
        keep[base:base + view.numel()].view(view.shape)[page0, 0] = False
    assert torch.equal(buffer[keep], before[keep])
    assert_close_to_reference(k_cache[page0, 0], ref.rope_table(k[:1], cos, sin, torch.zeros(1, dtype=torch.long))[0])
    assert torch.equal(v_cache[page0, 0], v[0])


@pytest.mark.parametrize("cache_dtype", ["bf16", "fp8"])
def test_mla_separate_caches_round_trip(backend, cache_dtype):
    """MLA's latent part and rotated k_pe into FlashInfer's two caches ``(ckv_cache, kpe_cache)`` through its page
    table, read back by FlashInfer's MLA reader (``ckv_cache[page, row]``, ``kpe_cache[page, row]``); the same call
    with a slot mapping writes what the single concatenated cache holds."""
    tokens, heads, rope_dim, latent, page_size, num_pages = 5, 3, 16, 32, 4, 8
    table = page_table([6, 3], [3, 2], page_size, num_pages)
    q_pe = torch.randn(tokens, heads, rope_dim, device=DEVICE).to(torch.bfloat16)
    kv = torch.randn(tokens, latent + rope_dim, device=DEVICE).to(torch.bfloat16)
    kv_c, k_pe = kv[:, :latent], kv[:, latent:]
    k_pe0 = k_pe.clone()
    fp8 = cache_dtype == "fp8"
    dtype = FP8 if fp8 else torch.bfloat16
    ckv_cache = torch.randn(num_pages, page_size, latent, device=DEVICE).to(dtype)
    kpe_cache = torch.randn(num_pages, page_size, rope_dim, device=DEVICE).to(dtype)
    before = ckv_cache.clone(), kpe_cache.clone()
    scale = torch.tensor([0.05], device=DEVICE) if fp8 else None
    cos, sin = ropekit.cos_sin_table(32, rope_dim, device=DEVICE)
    positions = table["cache_positions"]
    ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, (ckv_cache, kpe_cache), None, positions, cos, sin,
                               kv_cache_scale=scale, kv_indices=table["kv_indices"], kv_indptr=table["kv_indptr"],
                               batch_indices=table["batch_indices"], cache_positions=table["cache_positions"])
    want_k = ref.rope_table(k_pe0[:, None], cos, sin, positions.cpu().long(), interleaved=True)[:, 0]
    # the MLA reader's pages hold no head axis: seen as one head
    assert_round_trip(before[1][:, :, None], kpe_cache[:, :, None], want_k[:, None], table, "NHD",
                      scale=None if scale is None else scale.cpu())
    assert_round_trip(before[0][:, :, None], ckv_cache[:, :, None], kv_c.double().cpu()[:, None], table, "NHD",
                      scale=None if scale is None else scale.cpu(), exact=True)
    if fp8:
        return
    slots = torch.randperm(num_pages * page_size, device=DEVICE)[:tokens]
    pair = torch.zeros(num_pages, page_size, latent, device=DEVICE).to(dtype), \
        torch.zeros(num_pages, page_size, rope_dim, device=DEVICE).to(dtype)
    single = torch.zeros(num_pages, page_size, latent + rope_dim, device=DEVICE).to(dtype)
    for caches in (pair, single):
        ropekit.mla_rope_and_cache(q_pe.clone(), k_pe0.clone(), kv_c, caches, slots, positions, cos, sin)
    assert torch.equal(torch.cat(pair, -1), single)


# --- validation ----------------------------------------------------------------------------------------------------

def _valid_call(kv_layout="NHD"):
    table = page_table([5, 2], [3, 2], 4, 6)
    k_cache, v_cache = caches_for(kv_layout, 6, 4, 2, 16, torch.float32)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    return dict(q=torch.randn(5, 2, 16, device=DEVICE), k=torch.randn(5, 2, 16, device=DEVICE),
                v=torch.randn(5, 2, 16, device=DEVICE), cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                kv_layout=kv_layout, layout="thd", cu_seqlens=table["append_indptr"], max_seqlen=3,
                positions=table["cache_positions"],
                **{n: table[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")})


BAD = {  # change -> (error, the argument the message names)
    "kv_indices-float": (lambda c: dict(kv_indices=c["kv_indices"].float()), TypeError, "kv_indices"),
    "kv_indptr-2d": (lambda c: dict(kv_indptr=c["kv_indptr"][None]), ValueError, "kv_indptr"),
    "batch_indices-short": (lambda c: dict(batch_indices=c["batch_indices"][:4]), ValueError, "batch_indices"),
    "cache_positions-int16": (lambda c: dict(cache_positions=c["cache_positions"].short()), TypeError,
                              "cache_positions"),
    "kv_indptr-missing": (lambda c: dict(kv_indptr=None), ValueError, "kv_indptr"),
    "with-slot_mapping": (lambda c: dict(slot_mapping=torch.arange(5, device=DEVICE)), ValueError, "slot_mapping"),
    "kv_layout-name": (lambda c: dict(kv_layout="NDH"), ValueError, "kv_layout"),
    "k_cache-hnd-as-nhd": (lambda c: dict(kv_layout="HND"), ValueError, "k_cache"),
    "k_cache-pair-and-v_cache": (lambda c: dict(k_cache=(c["k_cache"], c["v_cache"])), ValueError, "v_cache"),
    "k_cache-5d-not-2": (lambda c: dict(k_cache=torch.zeros(6, 3, 4, 2, 16, device=DEVICE), v_cache=None),
                         ValueError, "k_cache"),
    "k_cache-pages-of-no-rows": (lambda c: dict(k_cache=torch.zeros(6, 0, 2, 16, device=DEVICE),
                                                v_cache=torch.zeros(6, 0, 2, 16, device=DEVICE)), ValueError,
                                 "k_cache"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_errors_name_the_argument_and_write_nothing(bad):
    change, error, name = BAD[bad]
    call = _valid_call()
    call.update(change(call))
    before = {key: t.clone() for key, t in call.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(error, match=name):
        ropekit.rope_and_cache(**call)
    for key, t in before.items():
        assert torch.equal(call[key], t), key


@pytest.mark.parametrize("separate", [False, True])
def test_mla_pages_of_no_rows_are_refused_by_the_caches_name(separate):
    """A token's page is its position divided by the rows a page holds: MLA's caches through the page table with pages
    of no rows are refused, naming the cache, and nothing is written."""
    table = page_table([2], [2], 4, 3)
    q_pe, kv = torch.randn(2, 2, 16, device=DEVICE), torch.randn(2, 32 + 16, device=DEVICE)
    caches = (torch.zeros(3, 0, 32, device=DEVICE), torch.zeros(3, 0, 16, device=DEVICE)) if separate else \
        torch.zeros(3, 0, 48, device=DEVICE)
    cos, sin = ropekit.cos_sin_table(16, 16, device=DEVICE)
    before = q_pe.clone()
    with pytest.raises(ValueError, match="kpe_cache" if separate else "kv_cache"):
        ropekit.mla_rope_and_cache(q_pe, kv[:, 32:], kv[:, :32], caches, None, table["cache_positions"], cos, sin,
                                   **{n: table[n] for n in ("kv_indices", "kv_indptr", "batch_indices",
                                                            "cache_positions")})
    assert torch.equal(q_pe, before)


CHECK_MODE_BAD = {
    "kv_indices-outside-the-pool": (lambda c: c["kv_indices"].__setitem__(0, 6), "kv_indices"),
    "kv_indptr-decreasing": (lambda c: c["kv_indptr"].__setitem__(2, 1), "kv_indptr"),
    "kv_indptr-past-kv_indices": (lambda c: c["kv_indptr"].__setitem__(2, 9), "kv_indptr"),
    "batch_indices-past-the-requests": (lambda c: c["batch_indices"].__setitem__(0, 2), "batch_indices"),
    "cache_positions-negative": (lambda c: c["cache_positions"].__setitem__(0, -3), "cache_positions"),
    "cache_positions-past-the-pages": (lambda c: c["cache_positions"].__setitem__(4, 4), "cache_positions"),
    "a-row-twice": (lambda c: c["cache_positions"].__setitem__(1, 2), "twice"),
}


@pytest.mark.parametrize("bad", list(CHECK_MODE_BAD))
def test_check_mode_reads_the_page_table(bad, monkeypatch):
    change, name = CHECK_MODE_BAD[bad]
    call = _valid_call()
    call["positions"] = call["positions"].clone()  # rope positions stay valid
    change(call)
    before = call["k_cache"].clone(), call["v_cache"].clone()
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    with pytest.raises(ValueError, match=name):
        ropekit.rope_and_cache(**call)
    assert torch.equal(call["k_cache"], before[0]) and torch.equal(call["v_cache"], before[1])


def test_mla_errors_name_the_separate_caches():
    tokens, rope_dim, latent = 3, 16, 32
    q_pe, k_pe, kv_c = (torch.randn(tokens, 2, rope_dim, device=DEVICE), torch.randn(tokens, rope_dim, device=DEVICE),
                        torch.randn(tokens, latent, device=DEVICE))
    cos, sin = ropekit.cos_sin_table(16, rope_dim, device=DEVICE)
    slots = torch.arange(tokens, device=DEVICE)
    ckv, kpe = torch.zeros(4, 4, latent, device=DEVICE), torch.zeros(4, 4, rope_dim, device=DEVICE)
    for caches, name in (((ckv, kpe[..., :8]), "kpe_cache"), ((ckv[..., :8], kpe), "ckv_cache"),
                         ((ckv, kpe[:3]), "ckv_cache"), ((ckv, kpe.to(FP8)), "ckv_cache"), ((ckv,), "kv_cache")):
        with pytest.raises((ValueError, TypeError), match=name):
            ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, caches, slots, slots, cos, sin)
    with pytest.raises(ValueError, match="slot_mapping"):
        ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, (ckv, kpe), None, slots, cos, sin)
    assert not ckv.any() and not kpe.any()


# --- compile, the eager fast path and CUDA graphs -------------------------------------------------------------------

def test_torch_compile_fullgraph_with_device_resident_page_table():
    call = _valid_call("HND")
    caches = call["k_cache"].clone(), call["v_cache"].clone()
    address = {n: call.pop(n) for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")}
    q, k, v, k_cache, v_cache = (call.pop(n) for n in ("q", "k", "v", "k_cache", "v_cache"))

    def step(q, k, v, k_cache, v_cache, kv_indices, kv_indptr, batch_indices, cache_positions):
        out_q, _ = ropekit.rope_and_cache(q, k, v, k_cache=k_cache, v_cache=v_cache, kv_indices=kv_indices,
                                          kv_indptr=kv_indptr, batch_indices=batch_indices,
                                          cache_positions=cache_positions, **call)
        return out_q * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(q, k, v, k_cache, v_cache, *address.values())
    want = step(q, k, v, *caches, *address.values())
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(k_cache, caches[0])
    torch.testing.assert_close(v_cache, caches[1])


def test_torch_compile_fullgraph_writes_flashinfers_5d_paged_kv_cache():
    """The 5-D form's two halves are views of the graph's input, written by the mutating custom op."""
    table = page_table([3, 1, 2], [1, 1, 1], 2, 10)
    q, k, v = (torch.randn(3, 1, 2, 8, device=DEVICE) for _ in range(3))
    paged = torch.randn(10, 2, 2, 2, 8, device=DEVICE)  # HND: (pages, k and v, heads, rows, dim)
    before = paged.clone()
    cos, sin = ropekit.cos_sin_table(16, 8, device=DEVICE)
    address = [table[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")]

    def step(q, k, v, paged, kv_indices, kv_indptr, batch_indices, cache_positions):
        out_q, _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=paged, kv_layout="HND",
                                          positions=cache_positions, kv_indices=kv_indices, kv_indptr=kv_indptr,
                                          batch_indices=batch_indices, cache_positions=cache_positions)
        return out_q * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    compiled(q, k, v, paged, *address)
    pos = table["cache_positions"].cpu().long()[:, None]
    assert_round_trip(before[:, 0], paged[:, 0], ref.rope_table(k, cos, sin, pos)[:, 0], table, "HND")
    assert_round_trip(before[:, 1], paged[:, 1], v[:, 0].double().cpu(), table, "HND", exact=True)


@pytest.mark.backend("triton")
def test_a_repeated_call_reads_new_index_values_through_its_plan(monkeypatch):
    """A repeated call signature goes straight to its planned launch, which reads the page table's current values."""
    from ropekit.fused import validate
    call = _valid_call("HND")
    ropekit.rope_and_cache(**call)
    monkeypatch.setattr(validate, "rotary_arguments", lambda *a: (_ for _ in ()).throw(AssertionError("validated")))
    fresh = page_table([6, 3], [3, 2], 4, 6)  # the same shapes, other pages and positions
    for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions"):
        call[n].copy_(fresh[n])
    before = call["k_cache"].clone()
    ropekit.rope_and_cache(**call)
    pos = call["positions"].cpu().long()
    assert_round_trip(before, call["k_cache"], ref.rope_table(call["k"], call["cos"], call["sin"], pos),
                      fresh, "HND")


@gpu_only
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_cuda_graph_decode_step_replays_with_new_page_tables(kv_layout):
    """A decode step captured once (Llama-3-8B heads, page size 16): the page table, positions and inputs change
    in place between replays; nothing syncs to the host inside the capture."""
    batch, hq, hk, d, page_size, num_pages = 64, 32, 8, 128, 16, 512
    cos, sin = ropekit.cos_sin_table(8192, d, base=500000.0, device="cuda")
    q, k, v = (torch.randn(batch, 1, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hk, hk))
    k_cache, v_cache = caches_for(kv_layout, num_pages, page_size, hk, d, torch.bfloat16)

    def fresh_table():
        return page_table(torch.randint(1, 120, (batch,)).tolist(), [1] * batch, page_size, num_pages)

    table = fresh_table()
    address = {n: table[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")}
    address["kv_indices"] = torch.zeros(num_pages, dtype=torch.int32, device="cuda")  # room for any table
    address["kv_indices"][:table["kv_indices"].shape[0]] = table["kv_indices"]
    out = {}

    def step():
        out["q"], _ = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache,
                                             kv_layout=kv_layout, positions=address["cache_positions"], **address)

    graph = cuda_graph_of(step)
    for _ in range(3):
        table = fresh_table()
        for n in ("kv_indptr", "batch_indices", "cache_positions"):
            address[n].copy_(table[n])
        address["kv_indices"][:table["kv_indices"].shape[0]] = table["kv_indices"]
        k.copy_(torch.randn_like(k))
        before = k_cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        pos = table["cache_positions"].cpu().long()[:, None]
        assert_close_to_reference(out["q"], ref.rope_table(q, cos, sin, pos))
        assert_round_trip(before, k_cache, ref.rope_table(k, cos, sin, pos)[:, 0], table, kv_layout)
