"""The sanitizer driver's checks of the fused ops (:mod:`ropekit.reliability.sanitize` runs them): the cache write
through every address map read back as an engine reads it, every quantising store (float8, int8, NVFP4) read back
through its scales, and the norm after the rotation, forward and backward; each on shapes that exercise the kernels'
masks and tails, against the float64 reference."""

from __future__ import annotations

import torch

from ropekit import device as _device
from ropekit import reference as ref
from ropekit.frequencies import cos_sin_table, inverse_frequencies, rope_init
from ropekit.fused import mla_rope_and_cache, qk_norm_rope, rope_and_cache
from ropekit.fused.validate import ds_mla_entry_bytes
from ropekit.testing import check_close_to_reference, ulp

__all__ = ["CACHE_ADDRESS_MAPS", "check_cache_address_map", "QUANTISED_CACHES", "check_quantised_cache",
           "check_norm", "NORM_PLACES", "FUSED_ANGLES", "check_fused_angles", "check_fused_nope"]


# the fused forward's cache address maps (ropekit.triton.fused_tiles.cache_slot), each with a head layout; MLA's
# angles from a table, or computed in the kernel from inv_freq times a scale (its latent cache by slot mapping in
# float8, FlashInfer's two caches by page table)
CACHE_ADDRESS_MAPS = (("slot_mapping", "HND", False), ("page table prefill", "NHD", False),
                      ("page table prefill", "HND", True), ("page table decode", "HND", False),
                      ("page table paged_kv_cache 5-D", "NHD", True), ("MLA (ckv_cache, kpe_cache) page table", "NHD",
                                                                      False),
                      ("MLA table-free one cache slot_mapping", "NHD", True),
                      ("MLA table-free (ckv_cache, kpe_cache) page table", "NHD", False),
                      ("MLA fp8_ds_mla page table", "NHD", False))
# YaRN as a long-context model without mscale configures it: its cos and sin times 0.1 ln(40) + 1, not 1
_YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}


def check_cache_address_map(address: str, kv_layout: str, fp8: bool, device) -> str:
    """``rope_and_cache`` (or MLA's write into its two caches, or into its one latent cache) through one address map
    into caches of exactly the pages the requests hold (a write past them is outside the allocation): head_dim 80 and
    3 kv heads (masked channels and heads), token blocks with remainders, a padding token (-1); every written row is
    read back through the map (the engine's reader: NHD ``cache[page, row]``, HND ``cache[page, :, row]``) and
    compared with the float64 reference, and every other row must be unchanged. MLA ``table-free``: YaRN's inv_freq
    (float32) times its attention factor at positions up to 10^7, no table; q_pe checked too. MLA ``fp8_ds_mla``:
    DeepSeek's entry (kv_c in e4m3 tiles of 128 at scales computed on write, then k_pe), three tiles in the
    kernel's four-tile lanes (a masked tile)."""
    gpu = device == "cuda"
    decode = "decode" in address
    seq_lens, append = (([40, 9, 23, 70], [1] * 4) if decode else ([23, 9, 40], [20, 9, 8])) if gpu else \
        (([5, 3], [1, 1]) if decode else ([5, 3, 4], [3, 3, 1]))
    page_size = 16 if gpu else 4
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    n_pages, tokens = sum(pages), sum(append)
    kv_indices = torch.randperm(n_pages, device=device).to(torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=device)
    batch = torch.cat([torch.full((a,), b) for b, a in enumerate(append)])
    local = torch.cat([torch.arange(n - a, n) for n, a in zip(seq_lens, append)])
    batch[1] = -1  # padding
    batch_indices, cache_positions = batch.to(torch.int32).to(device), local.to(device)
    page_of = [int(kv_indices[int(kv_indptr[b]) + int(p) // page_size]) if b >= 0 else -1
               for b, p in zip(batch.tolist(), local.tolist())]
    places = [(t, page, int(p) % page_size) for t, (page, p) in enumerate(zip(page_of, local.tolist())) if page >= 0]
    table = dict(kv_indices=kv_indices, kv_indptr=kv_indptr, batch_indices=batch_indices,
                 cache_positions=cache_positions)
    cos, sin = cos_sin_table(int(local.max()) + 1, 80, device=device)
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    scale = torch.tensor([0.05], device=device) if fp8 else None
    positions = cache_positions[None]
    if address.startswith("MLA"):
        return _check_mla_address_map(address, tokens, n_pages, page_size, page_of, local, places, table, cos, sin,
                                      cache_dtype, scale, device)
    q, k, v = (torch.randn(tokens, h, 80, device=device).to(torch.bfloat16) for h in (5, 3, 3))
    shape = (n_pages, 3, page_size, 80) if kv_layout == "HND" else (n_pages, page_size, 3, 80)
    if "5-D" in address:
        paged = torch.randn(n_pages, 2, *shape[1:], device=device).to(cache_dtype)
        caches, given = [paged[:, 0], paged[:, 1]], dict(k_cache=paged)
    else:
        caches = [torch.randn(shape, device=device).to(cache_dtype) for _ in range(2)]
        given = dict(k_cache=caches[0], v_cache=caches[1])
    before = [c.clone() for c in caches]
    if address == "slot_mapping":
        slots = torch.tensor([page * page_size + row if page >= 0 else -1
                              for page, row in zip(page_of, (local % page_size).tolist())], device=device)
        given.update(slot_mapping=slots)
    else:
        given.update(table)
    cu = torch.tensor([0] + torch.tensor(append).cumsum(0).tolist(), device=device)
    out_q, _ = rope_and_cache(q, k, v, cos, sin, kv_layout=kv_layout, positions=positions, layout="thd",
                              cu_seqlens=cu, max_seqlen=max(append), k_scale=scale, v_scale=scale, **given)
    problem = check_close_to_reference(out_q, ref.rope_table(q, cos, sin, local))
    want = [ref.rope_table(k, cos, sin, local), v.double().cpu()]
    return problem or _read_back(caches, before, want, (False, True), places, kv_layout, scale)


def _check_mla_address_map(address, tokens, n_pages, page_size, page_of, local, places, table, cos, sin,
                           cache_dtype, scale, device) -> str:
    """:func:`check_cache_address_map` for MLA: 5 heads, rope 64, latent 96, q_pe and k_pe rotated in place (GPT-J
    pairs), ``[kv_c | k_pe]`` into FlashInfer's two caches or vLLM's one latent cache (read back as its two parts),
    by slot mapping or page table; the angles from the table's first 32 columns at the cache positions, or
    (``table-free``) computed from YaRN's inv_freq times its attention factor at positions up to 10^7."""
    ds = "fp8_ds_mla" in address
    latent = 384 if ds else 96
    q_pe, k_pe = torch.randn(tokens, 5, 64, device=device), torch.randn(tokens, 64, device=device)
    kv_c = torch.randn(tokens, latent, device=device) * torch.logspace(-2, 2, latent, device=device)
    q_pe, k_pe, kv_c = (x.to(torch.bfloat16) for x in (q_pe, k_pe, kv_c))
    q64, k_pe64 = q_pe.double().cpu(), k_pe.double().cpu()
    if ds:
        entry = ds_mla_entry_bytes(latent, 64, torch.bfloat16)
        caches = [torch.randint(0, 256, (n_pages, page_size, entry), dtype=torch.uint8, device=device)]
        given = caches[0]
    elif "kpe_cache" in address:
        caches = [torch.randn(n_pages, page_size, 1, width, device=device).to(cache_dtype) for width in (96, 64)]
        given = (caches[0][:, :, 0], caches[1][:, :, 0])
    else:  # one latent cache of [kv_c | k_pe] rows, exactly the pages the requests hold
        joined = torch.randn(n_pages, page_size, 1, 96 + 64, device=device).to(cache_dtype)
        caches, given = [joined[..., :96], joined[..., 96:]], joined[:, :, 0]
    before = [c.clone() for c in caches]
    if "slot_mapping" in address:
        slots = torch.tensor([page * page_size + row if page >= 0 else -1
                              for page, row in zip(page_of, (local % page_size).tolist())], device=device)
        addressing = dict(slot_mapping=slots)
    else:
        addressing = dict(slot_mapping=None, **table)
    if "table-free" in address:
        inv_freq, factor = rope_init(_YARN, 64)
        inv_freq = inv_freq.float().to(device)  # (the float64 angles below read its float32 values)
        positions = torch.randint(0, 10_000_000, (tokens,), device=device)
        theta = positions.cpu().double()[:, None, None] * inv_freq.double().cpu()

        def rotated(x):
            return ref.rotate_pairs(x, torch.cos(theta) * factor, torch.sin(theta) * factor, interleaved=True)

        angles = dict(inv_freq=inv_freq, scale=factor)
    else:
        def rotated(x):
            return ref.rope_table(x, cos[:, :32], sin[:, :32], local, interleaved=True)

        positions, angles = local.to(device), dict(cos=cos[:, :32], sin=sin[:, :32])
    out_q, _ = mla_rope_and_cache(q_pe, k_pe, kv_c, given, positions=positions, kv_cache_scale=scale, **addressing,
                                  **angles, kv_cache_dtype="fp8_ds_mla" if ds else "auto")
    if ds:
        return check_close_to_reference(out_q, rotated(q64)) or _read_back_entries(
            caches[0], before[0], ref.ds_mla_entry(kv_c.double().cpu(), rotated(k_pe64[:, None])[:, 0],
                                                   torch.bfloat16), latent, places)
    want = [kv_c.double().cpu()[:, None], rotated(k_pe64[:, None])]
    return check_close_to_reference(out_q, rotated(q64)) or _read_back(caches, before, want, (True, False), places,
                                                                       "NHD", scale)


def _read_back_entries(cache, before, want, latent: int, places) -> str:
    """fp8_ds_mla entries read back at ``places``: the e4m3 values and tile scales as ``want`` (the reference's
    entries, one a token) bit for bit, k_pe within bf16's rounding of the float64 rotation; every other row bitwise
    as ``before``."""
    rows, old_rows = cache.cpu(), before.cpu()
    at = latent + 4 * (latent // ref.DS_MLA_TILE)
    kept = torch.ones(rows.shape[:2], dtype=torch.bool)
    for t, page, row in places:
        kept[page, row] = False
        got = rows[page, row]
        k_pe = ref.ds_mla_read(want[t], latent, torch.bfloat16)[1]
        if not torch.equal(got[:at], want[t, :at]) or \
                check_close_to_reference(got[at:].view(torch.bfloat16), k_pe) is not None:
            return f"token {t}'s entry (page {page}, row {row}) is not its reference"
    if not torch.equal(rows[kept], old_rows[kept]):
        return "a row no token names changed"
    return ""


def _read_back(caches, before, want, exact, places, kv_layout, scale) -> str:
    """Each (token, page, row) of ``places`` read back from each cache: bit for bit where ``exact`` (a copied value,
    or with a float8 cache e4m3 of its float32 quotient by the scale), else within the dtype's bound (one e4m3
    spacing of value / scale); every other row bitwise as ``before``."""
    for cache, old, values, copied in zip(caches, before, want, exact):
        rows = (cache.transpose(1, 2) if kv_layout == "HND" else cache).cpu()
        old_rows = (old.transpose(1, 2) if kv_layout == "HND" else old).cpu()
        kept = torch.ones(rows.shape[:2], dtype=torch.bool)
        for t, page, row in places:
            kept[page, row] = False
            got = rows[page, row].double()
            if scale is not None and copied:
                ok = torch.equal(got, ref.e4m3((values[t].float() / scale.cpu()).double()))
            elif scale is not None:
                quotient = values[t] / float(scale)
                ok = bool(((got - quotient).abs() <= ulp(quotient, torch.float8_e4m3fn)).all())
            elif copied:
                ok = torch.equal(got, values[t])
            else:
                ok = check_close_to_reference(rows[page, row], values[t]) is None
            if not ok:
                return f"token {t}'s row (page {page}, row {row}) is not its reference"
        if not torch.equal(rows[kept].view(torch.uint8), old_rows[kept].view(torch.uint8)):
            return "a row no token names changed"
    return ""


def check_norm(device, place: str, weighted: bool, norm_over: str = "head") -> str:
    """A norm at ``place`` (after the rotation: Llama 4's, weightless; or with weights) over each head or across all
    heads (``norm_over="heads"``, OLMo-2's: 3 q heads in a tile of 4, the weight a (head, channel)): packed sequences
    with an empty one, head_dim 80 (masked channel loads), partial rotary, GQA; the forward with a paged k cache
    write, and the backward."""
    with _device.set_backend("triton"):
        cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
        q, k = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device)
        over_heads = norm_over == "heads"
        weights = tuple(torch.rand(n * 80 if over_heads else 80, device=device) + 0.5 for n in (3, 1)) \
            if weighted else (None, None)
        cos, sin = cos_sin_table(64, 48, device=device)
        positions = torch.randint(0, 64, (12,), device=device)
        k_cache = torch.zeros(3, 8, 1, 80, device=device)
        slots = torch.randperm(24, device=device)[:12]
        kw = dict(positions=positions, layout="thd", cu_seqlens=cu, max_seqlen=7, norm=place, norm_over=norm_over,
                  eps=1e-5)
        out_q, out_k = rope_and_cache(q, k, None, cos, sin, k_cache=k_cache, slot_mapping=slots, q_weight=weights[0],
                                      k_weight=weights[1], write_k=True, **kw)
        pos = positions.cpu()

        def normed(x, w):
            return ref.rms_norm(x, w, eps=1e-5, over_heads=over_heads)

        truth = [normed(ref.rope_table(x, cos, sin, pos), w) if place == "after" else
                 ref.rope_table(normed(x, w), cos, sin, pos) for x, w in zip((q, k), weights)]
        problem = check_close_to_reference(out_q, truth[0]) or check_close_to_reference(out_k, truth[1]) or \
            check_close_to_reference(k_cache.reshape(-1, 1, 80)[slots.cpu()], truth[1])
        if problem:
            return problem
        leaf = q.clone().requires_grad_()
        grad = torch.randn_like(q)
        torch.autograd.backward(qk_norm_rope(leaf, None, cos, sin, weights[0], **kw)[0], grad)
        leaf64 = q.detach().double().cpu().requires_grad_()
        want = normed(ref.rope_table(leaf64, cos, sin, pos), weights[0]) if place == "after" else \
            ref.rope_table(normed(leaf64, weights[0]), cos, sin, pos)
        torch.autograd.backward(want, grad.double().cpu())
        return check_close_to_reference(leaf.grad, leaf64.grad) or ""


# where a norm across all heads lies, each run once by the driver
NORM_PLACES = ("before", "after")

# the fused ops' angles without a table: (name, mrope_section, mrope_interleaved), each run once by the driver
FUSED_ANGLES = (("table-free", None, False), ("table-free M-RoPE interleaved", (8, 8, 8), True),
                ("table M-RoPE contiguous", (8, 8, 8), False))


def check_fused_angles(device, mrope_section, mrope_interleaved: bool) -> str:
    """The fused ops' angles computed in the kernel (``inv_freq``, positions up to 10^7) or read at M-RoPE's axis
    positions (from a table of the rows they reach): packed sequences with an empty one, head_dim 80 (partial
    rotary), GQA, a paged k and v cache by slot mapping; then qk_norm_rope forward and backward on the same angles."""
    with _device.set_backend("triton"):
        cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
        q, k, v = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device), \
            torch.randn(12, 1, 80, device=device)
        inv_freq = inverse_frequencies(48).to(device)
        if mrope_section is None:
            positions = torch.randint(0, 10_000_000, (12,), device=device)
            angles = dict(inv_freq=inv_freq, scale=0.9)
            pair_positions = positions.cpu()[:, None].expand(12, 24)
            scale = 0.9
        else:
            positions = torch.randint(0, 64, (3, 12), device=device)
            angles = dict(mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
            if mrope_interleaved:
                angles.update(inv_freq=inv_freq)
            else:
                angles.update(cos=cos_sin_table(64, 48, device=device)[0], sin=cos_sin_table(64, 48, device=device)[1])
            pair_positions = ref.mrope_pair_positions(positions.cpu(), mrope_section,
                                                      mrope_interleaved=mrope_interleaved)
            scale = 1.0
        theta = pair_positions.double() * inv_freq.double().cpu()

        def rotated(x):
            c, s = (torch.cos(theta) * scale)[:, None, :], (torch.sin(theta) * scale)[:, None, :]
            x64 = x.double().cpu()
            return torch.cat((ref.rotate_pairs(x64[..., :48], c, s), x64[..., 48:]), -1)

        caches = tuple(torch.zeros(3, 8, 1, 80, device=device) for _ in range(2))
        slots = torch.randperm(24, device=device)[:12]
        kw = dict(positions=positions, layout="thd", cu_seqlens=cu, max_seqlen=7, rotary_dim=48, **angles)
        out_q, out_k = rope_and_cache(q, k, v, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots,
                                      write_k=True, **kw)
        want_k = rotated(k)
        problem = check_close_to_reference(out_q, rotated(q)) or check_close_to_reference(out_k, want_k) or \
            check_close_to_reference(caches[0].reshape(-1, 1, 80)[slots.cpu()], want_k) or \
            check_close_to_reference(caches[1].reshape(-1, 1, 80)[slots.cpu()], v.double().cpu())
        if problem:
            return problem
        leaf = q.clone().requires_grad_()
        weight = torch.rand(80, device=device) + 0.5
        grad = torch.randn_like(q)
        torch.autograd.backward(qk_norm_rope(leaf, None, q_weight=weight, eps=1e-5, **kw)[0], grad)
        leaf64 = q.detach().double().cpu().requires_grad_()
        torch.autograd.backward(rotated(ref.rms_norm(leaf64, weight, eps=1e-5)), grad.double().cpu())
        return check_close_to_reference(leaf.grad, leaf64.grad) or ""

def check_fused_nope(device) -> str:
    """A Llama 4 NoPE layer's cache write (``rope_and_cache(..., nope_temperature=...)``): packed sequences with an
    empty one, head_dim 80, GQA, a paged float8 cache by slot mapping (k's store its only one, divided by its scale)
    and a float8 q; q times its temperature, k and v cached unrotated."""
    with _device.set_backend("triton"):
        cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
        q, k, v = torch.randn(12, 3, 80, device=device), torch.randn(12, 1, 80, device=device), \
            torch.randn(12, 1, 80, device=device)
        offsets = torch.tensor([3, 7, 20], device=device)
        caches = tuple(torch.zeros(3, 8, 1, 80, device=device, dtype=torch.float8_e4m3fn) for _ in range(2))
        slots = torch.randperm(24, device=device)[:12]
        scale, q_scale = torch.tensor([0.02], device=device), torch.tensor([0.05], device=device)
        out_q, _ = rope_and_cache(q, k, v, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots, k_scale=scale,
                                  v_scale=scale, positions=offsets, layout="thd", cu_seqlens=cu, max_seqlen=7,
                                  q_dtype=torch.float8_e4m3fn, q_scale=q_scale, nope_temperature=(4, 0.1))
        quotient = ref.nope_temperature(q, ref.varlen_positions(cu, offsets=offsets), 4, 0.1) / 0.05
        if bool(((out_q.double().cpu() - quotient).abs() > ulp(quotient, torch.float8_e4m3fn) / 2 + 1e-5).any()):
            return "q is not its temperature times q over q_scale, rounded to e4m3"
        for cache, x in zip(caches, (k, v)):
            got = cache.reshape(-1, 1, 80)[slots.cpu()].double().cpu()
            if not torch.equal(got, ref.quantise(x.double().cpu(), 0.02, torch.float8_e4m3fn)):
                return "a cache does not hold its unrotated values over the scale, rounded to e4m3"
        return ""


# the fused kernel's quantising stores: (cache dtype, scales), each run once by the driver; NVFP4 ("nvfp4", its
# e4m3 scale per 16 channels over a global scale)
QUANTISED_CACHES = [(dtype, scales) for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
                    for scales in ("tensor", "head", "token_head")] + [("nvfp4", "block")]


def check_quantised_cache(cache_dtype: torch.dtype, scales: str, device) -> str:
    """rope_and_cache into a quantised paged cache: head_dim 80 (masked pair and tail lanes), 3 kv heads, a head
    block and token block with remainders, QK-norm (a second reduction beside the amax), caches and scale caches of
    exactly the slots written (a store past them is outside the allocation); the reader's round trip (stored value
    times its scale at the token's slot) within one spacing of the format of the float64 truth; with a float8
    cache, q written as float8 of the same format too. NVFP4 (``cache_dtype`` "nvfp4"): the same with GPT-J pairing
    (48 of 80 channels: masked channel lanes), caches of ``d / 2`` bytes and block-scale caches of ``d / 16``, read
    back within half an e2m1 spacing at each block's scale."""
    from ropekit.fused.kv_cache import rope_and_cache

    if cache_dtype == "nvfp4":
        return _check_nvfp4_cache(device)
    tokens, hk, d = (37 if device == "cuda" else 5), 3, 80
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=torch.bfloat16) for h in (4, hk, hk))
    weight = torch.rand(d, device=device) + 0.5
    blocks = (tokens + 7) // 8
    k_cache, v_cache = (torch.zeros(blocks, 8, hk, d, device=device, dtype=cache_dtype) for _ in range(2))
    slots = torch.randperm(blocks * 8, device=device)[:tokens]
    positions = torch.randint(0, 64, (tokens,), device=device)
    cos, sin = cos_sin_table(64, 48, device=device)  # partial rotary: 48 of 80 channels turn
    largest = ref.CACHE_FORMATS[cache_dtype][1]
    if scales == "token_head":
        k_scale, v_scale = (torch.zeros(blocks, 8, hk, device=device) for _ in range(2))
        kwargs = dict(k_scale_cache=k_scale, v_scale_cache=v_scale)
    else:
        size = 1 if scales == "tensor" else hk
        k_scale, v_scale = (torch.full((size,), 8.0 / largest, device=device) for _ in range(2))
        kwargs = dict(k_scale=k_scale, v_scale=v_scale)
    if cache_dtype != torch.int8:  # and q as float8 of the cache's format, for float8 attention
        kwargs.update(q_dtype=cache_dtype, q_scale=torch.full((1,), 8.0 / largest, device=device))
    with _device.set_backend("triton"):
        out_q, _ = rope_and_cache(q, k, v, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                  q_weight=weight, k_weight=weight, positions=positions, layout="thd",
                                  cu_seqlens=torch.tensor([0, tokens], device=device), max_seqlen=tokens, **kwargs)
    at = slots.cpu()
    truth = [ref.rope_table(ref.rms_norm(x, weight, eps=1e-6), cos, sin, positions.cpu()) for x in (q, k)]
    if scales == "token_head":  # the reader finds each token's scales at its slot
        k_scale, v_scale = (s.reshape(-1, hk)[at][..., None] for s in (k_scale, v_scale))
    # (stored values, their scales, the float64 truth), the caches' rows at the tokens' slots
    read = [(k_cache.reshape(-1, hk, d)[at], k_scale, truth[1]), (v_cache.reshape(-1, hk, d)[at], v_scale, v)]
    if "q_scale" in kwargs:
        read.append((out_q, kwargs["q_scale"], truth[0]))
    for name, (stored, scale, want) in zip("kvq", read):
        scale = scale.double().cpu().reshape(scale.shape[0] if scale.ndim == 3 else 1, -1, 1)
        target = (want.double().cpu() / scale).clamp(-largest, largest)
        step = torch.ones_like(target) if stored.dtype == torch.int8 else ulp(target, stored.dtype)
        bad = (stored.double().cpu() - target).abs() > step
        if bool(bad.any()):
            return f"{name}: {int(bad.sum())} stored values more than one spacing from the reference"
    return ""


def _check_nvfp4_cache(device) -> str:
    """:func:`check_quantised_cache` for NVFP4."""
    from ropekit.fused.kv_cache import rope_and_cache

    tokens, hk, d = (37 if device == "cuda" else 5), 3, 80
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=torch.bfloat16) for h in (4, hk, hk))
    weight = torch.rand(d, device=device) + 0.5
    blocks = (tokens + 7) // 8
    caches = [torch.zeros(blocks, 8, hk, d // 2, device=device, dtype=torch.uint8) for _ in range(2)]
    block_scales = [torch.zeros(blocks, 8, hk, d // 16, device=device, dtype=torch.float8_e4m3fn) for _ in range(2)]
    global_scale = torch.full((1,), 8.0 / (6 * 448), device=device)
    slots = torch.randperm(blocks * 8, device=device)[:tokens]
    positions = torch.randint(0, 64, (tokens,), device=device)
    cos, sin = cos_sin_table(64, 48, device=device)  # partial rotary: 48 of 80 channels turn
    with _device.set_backend("triton"):
        rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1], k_scale_cache=block_scales[0],
                       v_scale_cache=block_scales[1], k_scale=global_scale, v_scale=global_scale,
                       kv_cache_dtype="nvfp4", slot_mapping=slots, q_weight=weight, k_weight=weight,
                       positions=positions, layout="thd", interleaved=True,
                       cu_seqlens=torch.tensor([0, tokens], device=device), max_seqlen=tokens)
    at = slots.cpu()
    truth = ref.rope_table(ref.rms_norm(k, weight, eps=1e-6), cos, sin, positions.cpu(), interleaved=True)
    for name, cache, scales, want in (("k", caches[0], block_scales[0], truth), ("v", caches[1], block_scales[1], v)):
        stored, scales = cache.reshape(-1, hk, d // 2)[at], scales.reshape(-1, hk, d // 16)[at]
        read = ref.nvfp4_dequantise(stored, scales, global_scale)
        step = (scales.cpu().double() * float(global_scale)).repeat_interleave(16, -1)
        quotient = want.double().cpu() / step
        bad = (read - want.double().cpu()).abs() / step > ref.e2m1_spacing(quotient) / 2 + 1e-5 * quotient.abs() + (
            quotient.abs() - 6).clamp(min=0)
        if bool(bad.any()):
            return f"{name}: {int(bad.sum())} NVFP4 values more than half an e2m1 spacing from the reference"
    return ""
