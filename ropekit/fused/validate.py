"""Validation of the fused ops' own arguments (norm weights, caches, slot mappings, scales), before any write.

The rotary arguments (q, k, cos/sin, positions, layout, ...) are checked by ``apply_rope``'s validation, which the
fused ops call first; everything here follows the same rules: shapes, dtypes, devices and host numbers always, values
inside device tensors only in check mode (``ROPEKIT_CHECK=1``: a host sync, which CUDA graphs forbid), and every
error names its argument.
"""

from __future__ import annotations

import math
import numbers

import torch

from .. import device as _device
from ..layouts import to_bshd
from ..triton.fused import CACHE_CONTIGUOUS, CACHE_PAGE_TABLE, CACHE_PAGED
from ..triton.fused_tiles import TILE_CHANNELS as DS_MLA_TILE
from ..validate import FLOAT_DTYPES, OverlapError, addresses, check_mode, check_nope, check_overlaps, prepare

__all__ = ["paged_kv_cache", "cache_arguments", "tokens_view", "latent_caches",
           "FP8_DTYPE", "FLOAT8_DTYPES", "QUANT_DTYPES", "MLA_KV_CACHE_DTYPES", "check_mla_kv_cache_dtype",
           "DS_MLA_TILE", "ds_mla_entry_bytes", "check_ds_mla_cache", "check_ds_mla_alignment",
           "KV_CACHE_DTYPES", "KV_LAYOUTS", "fp8_bytes", "rotary_arguments", "check_norm", "check_norm_place",
           "check_norm_over", "check_kv_layout", "nhd", "check_cache", "check_kv_cache_dtype", "check_slot_mapping",
           "check_page_table", "check_cache_offsets", "check_scale", "check_scale_cache", "check_nvfp4_channels",
           "check_block_scales", "check_q_output", "check_no_grad", "check_overlaps", "addresses", "OverlapError",
           "check_mode", "nope_switch"]

FP8_DTYPE = torch.float8_e4m3fn
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# the quantised caches rope_and_cache writes: float8 e4m3fn, float8 e5m2, int8 (each with float32 scales)
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
# vLLM's kv_cache_dtype strings this writes: the cache dtype each names (None: the cache's own, "auto") and whether
# the scales are per (token, head), computed on write
KV_CACHE_DTYPES = {
    "auto": (None, False), "float16": (torch.float16, False), "bfloat16": (torch.bfloat16, False),
    "fp8": (torch.float8_e4m3fn, False), "fp8_e4m3": (torch.float8_e4m3fn, False),
    "fp8_e5m2": (torch.float8_e5m2, False), "fp8_per_token_head": (torch.float8_e4m3fn, True),
    "int8_per_token_head": (torch.int8, True), "nvfp4": (torch.uint8, False),
}


def rotary_arguments(q, k, cos, sin, table, positions, layout, rotary_dim, cu_seqlens, max_seqlen, per_token,
                     interleaved, inv_freq=None, scale=1.0, mrope_section=None, mrope_interleaved=False, nope=None):
    """apply_rope's validation of the rotary arguments: ``(cos, sin, PositionSpec, rotary_dim)`` as the kernel reads
    them (a :class:`ropekit.RopeTable` given as ``table`` may grow for host-known positions; with ``inv_freq`` cos
    and sin are None; M-RoPE's sections travel in the positions' mode). ``nope``: a NoPE layer's switch as
    :func:`nope_switch` returned it, which takes no angles at all."""
    if nope is not None:
        if cos is not None or sin is not None or table is not None or inv_freq is not None:
            raise ValueError("nope_temperature: a NoPE layer rotates nothing; pass no cos/sin, table= or inv_freq=")
    elif inv_freq is not None:
        if cos is not None or sin is not None or table is not None:
            raise ValueError("pass either inv_freq= or cos/sin or table=, not more than one")
    else:
        if table is not None and (cos is not None or sin is not None):
            raise ValueError("pass either cos/sin or table=, not both")
        cos, sin = (table.cos, table.sin) if table is not None else (cos, sin)
        if cos is None or sin is None:
            raise TypeError("cos and sin tables are required (or table=ropekit.RopeTable(...), or inv_freq=)")
    return prepare(q, k, cos, sin, positions, layout, rotary_dim, cu_seqlens, max_seqlen, per_token, False,
                   _device.backend_for(q), table, interleaved, inv_freq, scale, mrope_section, mrope_interleaved, nope)


def nope_switch(q, nope_temperature, per_token: bool, mrope_section) -> tuple | None:
    """A Llama 4 NoPE layer's ``nope_temperature``, checked as :func:`ropekit.apply_rope` checks it, for the backend
    q's call takes: ``(floor_scale, attn_scale)`` or None."""
    return check_nope(nope_temperature, _device.backend_for(q), per_token, mrope_section)


def _on(t: torch.Tensor, device) -> bool:
    """Whether ``t`` lives on ``device``, read the way PyTorch places a tensor: "cuda" means the current GPU."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return t.device == device


def _number(name: str, value) -> float:
    # numbers.Real: Python's int and float and numpy's scalars (np.float32(1e-6)); a bool is not a number here
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite host float, got {value!r}")
    return float(value)


# eps reaches the kernel as a float32 scalar (also for float64 inputs): below the smallest normal float32 it is 0
# or a subnormal a GPU may flush to 0 (a zero head would come out NaN), above float32's largest it is infinite
_EPS_RANGE = (torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max)


NORM_PLACES = {"before": 1, "after": 2}  # ropekit.triton.fused_tiles' BEFORE, AFTER


def check_norm_place(norm) -> int:
    """Where the norm lies: ``"before"`` the rotation (Qwen3, Gemma 3) or ``"after"`` it (Llama 4); the kernels'
    place (:mod:`ropekit.triton.fused_tiles`)."""
    if not isinstance(norm, str) or norm not in NORM_PLACES:
        raise ValueError(f"norm must be 'before' or 'after' (where the RMSNorm lies, relative to the rotation), "
                         f"got {norm!r}")
    return NORM_PLACES[norm]


NORM_EXTENTS = {"head": False, "heads": True}


def check_norm_over(norm_over) -> bool:
    """The norm's extent: ``"head"``, each head vector (Qwen3, Gemma 3, Llama 4), or ``"heads"``, all heads of a
    token's q (k) together (OLMo-2, the video diffusion transformers). Returns whether it runs over all heads."""
    if not isinstance(norm_over, str) or norm_over not in NORM_EXTENTS:
        raise ValueError(f"norm_over must be 'head' (an RMSNorm of each head vector) or 'heads' (one over all heads of "
                         f"a token's q and of its k), got {norm_over!r}")
    return NORM_EXTENTS[norm_over]


def check_norm(q, k, q_weight, k_weight, eps, weight_offset, *, weightless: bool = False, over_heads: bool = False,
               layout: str = "bshd") -> tuple[float, float]:
    """The RMSNorm's weights (k_weight exactly when k is given; with ``weightless`` both may be None: a norm without
    weights, and then ``weight_offset`` 0), ``eps`` (a normal float32) and the weight offset. A weight is
    ``(head_dim,)``, or ``over_heads`` ``(heads * head_dim,)`` of its tensor's heads (q's, k's; in ``layout``)."""
    head_dim = q.shape[-1]
    if weightless and q_weight is None and k_weight is None:
        eps = _check_eps(eps)
        if _number("weight_offset", weight_offset) != 0.0:
            raise ValueError(f"weight_offset applies to the norm's weights; without q_weight and k_weight it must be "
                             f"0, got {weight_offset!r}")
        return eps, 0.0
    for name, w, x in (("q_weight", q_weight, q), ("k_weight", k_weight, k)):
        if x is None:
            if w is not None:
                raise ValueError(f"{name} is given but k is None")
            continue
        n_heads = to_bshd(x, layout).shape[-2]
        length = n_heads * head_dim if over_heads else head_dim
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a ({length},) tensor, got {type(w).__name__}")
        if w.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {w.dtype}")
        if tuple(w.shape) != (length,):
            if over_heads:
                raise ValueError(f"{name} must have shape ({length},) ({name[0]}'s {n_heads} heads x head_dim "
                                 f"{head_dim}: norm_over='heads' normalises all heads together), got {tuple(w.shape)}")
            hint = f"; a weight over all {n_heads} heads goes with norm_over='heads'" \
                if tuple(w.shape) == (n_heads * head_dim,) else ""
            raise ValueError(f"{name} must have shape ({head_dim},) (head_dim){hint}, got {tuple(w.shape)}")
        if w.device != q.device:
            raise ValueError(f"{name} is on {w.device} but q is on {q.device}")
    return _check_eps(eps), _number("weight_offset", weight_offset)


def _check_eps(eps) -> float:
    eps = _number("eps", eps)
    if not _EPS_RANGE[0] <= eps <= _EPS_RANGE[1]:
        raise ValueError(f"eps must be > 0 and a normal float32 number, in [{_EPS_RANGE[0]:.8g}, {_EPS_RANGE[1]:.8g}] "
                         f"(the norm adds it in float32, where a smaller one is 0), got {eps!r}")
    return eps


KV_LAYOUTS = ("NHD", "HND")


def check_kv_layout(kv_layout) -> str:
    """Where a cache's head axis lies: ``"NHD"`` ``(blocks, rows, heads, dim)`` or ``"HND"`` ``(blocks, heads, rows,
    dim)``, FlashInfer's names."""
    if not isinstance(kv_layout, str) or kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout


def nhd(cache, kv_layout: str):
    """A 4-D cache as the kernel addresses it, ``(blocks, rows, heads, dim)``: an HND one is a transposed view (its
    strides say where the head axis lies)."""
    return cache.transpose(1, 2) if kv_layout == "HND" and cache is not None else cache


def check_cache(name: str, cache, *, leading: tuple | None, n_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device, kv_layout: str = "NHD", quantised: tuple = (FP8_DTYPE,)) -> None:
    """A 4-D cache ``(blocks or batch, rows, n_heads, head_dim)`` (``kv_layout`` "HND": ``(blocks or batch, n_heads,
    rows, head_dim)``) of ``dtype`` or one of the ``quantised`` dtypes on ``device``; ``leading``: the blocks and
    rows it must have (None: any)."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype != dtype and cache.dtype not in quantised:
        raise TypeError(f"{name} must be {dtype} (the inputs' dtype) or {', '.join(map(str, quantised))}, got "
                        f"{cache.dtype}")
    form = (f"(blocks, {n_heads}, block_size, {head_dim}) (kv_layout 'HND')" if kv_layout == "HND" else
            f"(blocks, block_size, {n_heads}, {head_dim})")
    if cache.ndim != 4 or tuple(nhd(cache, kv_layout).shape[2:]) != (n_heads, head_dim):
        raise ValueError(f"{name} must have shape {form}, got {tuple(cache.shape)}")
    if leading is not None and tuple(nhd(cache, kv_layout).shape[:len(leading)]) != leading:
        raise ValueError(f"{name}'s (blocks, block_size) must be {leading}, got shape {tuple(cache.shape)} "
                         f"(kv_layout {kv_layout!r})")
    if not _on(cache, device):
        raise ValueError(f"{name} is on {cache.device} but q is on {device}")
    if cache.numel() and cache.stride(-1) != 1 and cache.dtype in QUANT_DTYPES + (torch.uint8,):
        raise ValueError(f"{name}: a quantised cache must have contiguous channels (stride 1 in the last dimension)")


# the names mla_rope_and_cache takes: its latent cache at one scale (vLLM's concat_and_cache_mla_rope_fused)
MLA_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")


def check_mla_kv_cache_dtype(kv_cache_dtype) -> None:
    """The latent cache's format names: :data:`MLA_KV_CACHE_DTYPES` (one scale for the whole cache, or
    ``"fp8_ds_mla"``'s scale a tile, computed)."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in MLA_KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, MLA_KV_CACHE_DTYPES))} for the latent "
                         f"cache (vLLM's names), got {kv_cache_dtype!r}"[:300])


def ds_mla_entry_bytes(latent: int, rope_dim: int, dtype: torch.dtype) -> int:
    """The bytes of one token's fp8_ds_mla entry: the latent's e4m3 values, a float32 scale a tile of
    ``DS_MLA_TILE`` (the fused kernel's ``TILE_CHANNELS``, 128) channels, the rotated k_pe in the model's dtype (656
    for DeepSeek's 512 + 64 in bf16)."""
    return latent + 4 * (latent // DS_MLA_TILE) + rope_dim * dtype.itemsize


def check_ds_mla_cache(kv_cache, latent: int, rope_dim: int, dtype: torch.dtype, device) -> None:
    """An fp8_ds_mla ``kv_cache``: one ``torch.uint8`` tensor ``(num_blocks, block_size, entry)`` on q's device,
    each entry's bytes contiguous and every entry, the scales' and k_pe's parts aligned to 4 bytes (they are read as
    float32 and as the model's dtype); kv_c's width ``latent`` a multiple of the tile."""
    if latent % DS_MLA_TILE or latent == 0:
        raise ValueError(f"kv_cache_dtype='fp8_ds_mla' stores kv_c in tiles of {DS_MLA_TILE} channels: kv_c's width "
                         f"(kv_lora_rank) must be a positive multiple of {DS_MLA_TILE}, got {latent}")
    entry = ds_mla_entry_bytes(latent, rope_dim, dtype)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dtype != torch.uint8 or kv_cache.ndim != 3 or \
            kv_cache.shape[2] != entry:
        raise ValueError(f"kv_cache_dtype='fp8_ds_mla' writes one torch.uint8 kv_cache (num_blocks, block_size, "
                         f"{entry}) ({latent} e4m3 bytes of kv_c, {latent // DS_MLA_TILE} float32 scales, {rope_dim} "
                         f"{dtype} values of k_pe), got "
                         f"{getattr(kv_cache, 'dtype', '')} {getattr(kv_cache, 'shape', type(kv_cache).__name__)}")
    if not _on(kv_cache, device):
        raise ValueError(f"kv_cache is on {kv_cache.device} but q_pe is on {device}")
    unit = max(4, dtype.itemsize)
    if (latent + 4 * (latent // DS_MLA_TILE)) % unit:
        raise ValueError(f"kv_cache_dtype='fp8_ds_mla' with {dtype} inputs puts k_pe at byte "
                         f"{latent + 4 * (latent // DS_MLA_TILE)} of the entry, not a multiple of its {unit}-byte "
                         "values: kv_c's width (kv_lora_rank) must make it one, or the inputs 16-bit")
    # (a trace reads no storage offset: the op checks it where it runs, check_ds_mla_alignment)
    if not torch.compiler.is_compiling():
        check_ds_mla_alignment(kv_cache, dtype)


def check_ds_mla_alignment(kv_cache, dtype: torch.dtype) -> None:
    """An fp8_ds_mla ``kv_cache``'s entries: each one's bytes contiguous, every entry (and so its float32 scales and
    its k_pe values in ``dtype``) at a multiple of 4 bytes and of ``dtype``'s size."""
    unit = max(4, dtype.itemsize)
    if kv_cache.stride(2) != 1 or kv_cache.stride(0) % unit or kv_cache.stride(1) % unit or \
            kv_cache.storage_offset() % unit:
        raise ValueError(f"kv_cache (fp8_ds_mla) must hold each entry's bytes contiguous and every entry at a multiple "
                         f"of {unit} bytes (its scales are float32, k_pe {dtype}), got strides {kv_cache.stride()} at "
                         f"storage offset {kv_cache.storage_offset()}")


def check_kv_cache_dtype(kv_cache_dtype, cache, cache_name: str = "k_cache") -> bool:
    """vLLM's ``kv_cache_dtype`` string against the cache it names (``cache``: after :func:`fp8_bytes`): ``"auto"``
    takes the cache's own dtype, the others must name it. Returns whether the scales are per (token, head)."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))} (vLLM's names), got "
                         f"{kv_cache_dtype!r}"[:300])
    dtype, per_token_head = KV_CACHE_DTYPES[kv_cache_dtype]
    if dtype is not None and isinstance(cache, torch.Tensor) and cache.dtype != dtype:
        raise TypeError(f"kv_cache_dtype {kv_cache_dtype!r} writes a {dtype} cache, but {cache_name} is "
                        f"{cache.dtype}")
    return per_token_head


def _index_tensor(name: str, t, device, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if not _on(t, device):
        raise ValueError(f"{name} is on {t.device} but q is on {device}")


def check_slot_mapping(slot_mapping, n_tokens: int, n_slots: int, device) -> torch.Tensor:
    """int64 ``(tokens,)``: the cache slot of each token, -1 for none. Returns the slots the kernel reads, one a
    token. A shorter mapping covers the first tokens only, as in vLLM's cache writes, where the tokens past it are
    the padding of a CUDA-graph batch: those get -1 (rotated, never cached). Check mode: every value in
    ``[-1, n_slots)`` and no slot written twice."""
    _index_tensor("slot_mapping", slot_mapping, device, (torch.int64,))
    if slot_mapping.ndim != 1 or slot_mapping.shape[0] > n_tokens:
        raise ValueError(f"slot_mapping must have shape ({n_tokens},) (one slot per token; fewer covers the first "
                         f"tokens), got {tuple(slot_mapping.shape)}")
    if slot_mapping.shape[0] < n_tokens:
        slot_mapping = torch.cat((slot_mapping, slot_mapping.new_full((n_tokens - slot_mapping.shape[0],), -1)))
    if check_mode() and not slot_mapping.is_meta and n_tokens:
        slots = slot_mapping.cpu()
        if bool(((slots < -1) | (slots >= n_slots)).any()):
            raise ValueError(f"slot_mapping values must lie in [-1, {n_slots}) (the cache's slots), got "
                             f"min {int(slots.min())} max {int(slots.max())}")
        written = slots[slots >= 0]
        if written.unique().numel() != written.numel():
            raise ValueError("slot_mapping names a slot twice: two tokens would race for one cache row")
    return slot_mapping


def check_page_table(kv_indices, kv_indptr, batch_indices, cache_positions, n_tokens: int, n_pages: int,
                     page_size: int, device, cache: str) -> None:
    """FlashInfer's page table: request ``b``'s pages are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, and token
    ``t`` goes to position ``cache_positions[t]`` of request ``batch_indices[t]`` (-1: nowhere). int32 or int64, 1-D,
    ``batch_indices`` and ``cache_positions`` one a token; the pages of ``cache`` (the caller's name for the cache)
    hold ``page_size`` >= 1 rows, a token's page being its position divided by them. Check mode: ``kv_indptr``
    starts at 0 or more, never decreases and ends inside ``kv_indices``; every page in ``[0, n_pages)``; every batch index in ``[-1,
    requests)``; every cached token's position ``>= 0`` and inside its request's pages; no (page, row) twice."""
    if page_size < 1:
        raise ValueError(f"{cache}'s pages must hold at least one row (block_size), got {page_size}")
    for name, t in (("kv_indices", kv_indices), ("kv_indptr", kv_indptr), ("batch_indices", batch_indices),
                    ("cache_positions", cache_positions)):
        _index_tensor(name, t, device, (torch.int32, torch.int64))
        if t.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if kv_indptr.shape[0] < 1:
        raise ValueError("kv_indptr must have shape (requests + 1,), at least one element, got shape (0,)")
    for name, t in (("batch_indices", batch_indices), ("cache_positions", cache_positions)):
        if t.shape[0] != n_tokens:
            raise ValueError(f"{name} must have shape ({n_tokens},) (one a token), got {tuple(t.shape)}")
    if not check_mode() or kv_indptr.is_meta:
        return
    indices, indptr = kv_indices.cpu().to(torch.int64), kv_indptr.cpu().to(torch.int64)
    requests = batch_indices.cpu().to(torch.int64)
    positions = cache_positions.cpu().to(torch.int64)
    if int(indptr[0]) < 0 or bool((indptr[1:] < indptr[:-1]).any()) or int(indptr[-1]) > indices.shape[0]:
        raise ValueError(f"kv_indptr must start at 0 or more, never decrease and end at most at kv_indices' length "
                         f"({indices.shape[0]}), got {indptr.tolist()}"[:400])
    if indices.numel() and bool(((indices < 0) | (indices >= n_pages)).any()):
        raise ValueError(f"kv_indices values must lie in [0, {n_pages}) (the cache's pages), got min "
                         f"{int(indices.min())} max {int(indices.max())}")
    n_requests = indptr.shape[0] - 1
    if requests.numel() and bool(((requests < -1) | (requests >= n_requests)).any()):
        raise ValueError(f"batch_indices values must lie in [-1, {n_requests}) (kv_indptr's requests), got min "
                         f"{int(requests.min())} max {int(requests.max())}")
    cached = requests >= 0
    request, position = requests[cached], positions[cached]
    if position.numel() and int(position.min()) < 0:
        raise ValueError(f"cache_positions of cached tokens must be >= 0, got {int(position.min())}")
    page_iter = indptr[request] + position // page_size
    outside = page_iter >= indptr[request + 1]
    if bool(outside.any()):
        t = int(torch.nonzero(cached)[:, 0][outside][0])
        raise ValueError(f"cache_positions[{t}] = {int(positions[t])} lies past request {int(requests[t])}'s "
                         f"{int(indptr[requests[t] + 1] - indptr[requests[t]])} pages of {page_size} rows "
                         "(kv_indptr)")
    slots = indices[page_iter] * page_size + position % page_size
    if slots.unique().numel() != slots.numel():
        raise ValueError("batch_indices and cache_positions name a cache row twice: two tokens would race for it")


def check_cache_offsets(offsets, n_seqs: int, lengths, max_seq: int, device) -> torch.Tensor:
    """Per-sequence offsets into a contiguous cache: a host int (every sequence) or an int32/int64 ``(n_seqs,)``
    tensor. Returns them as a device tensor. Check mode: ``0 <= offset`` and ``offset + length <= max_seq``
    (``lengths()``: the sequences' lengths, asked for only then)."""
    if isinstance(offsets, bool):
        raise TypeError("cache_offsets must be an int or an integer tensor, got a bool")
    if isinstance(offsets, int):
        if offsets < 0:
            raise ValueError(f"cache_offsets must be >= 0, got {offsets}")
        offsets = torch.full((n_seqs,), offsets, dtype=torch.int64, device=device)
    _index_tensor("cache_offsets", offsets, device, (torch.int32, torch.int64))
    if offsets.ndim != 1 or offsets.shape[0] != n_seqs:
        raise ValueError(f"cache_offsets must have shape ({n_seqs},) (one offset per sequence), got "
                         f"{tuple(offsets.shape)}")
    if check_mode() and not offsets.is_meta and n_seqs:
        start = offsets.cpu().to(torch.int64)
        end = start + torch.as_tensor(lengths(), dtype=torch.int64).cpu()
        if bool((start < 0).any()) or int(end.max()) > max_seq:
            raise ValueError(f"cache_offsets must place every sequence inside the cache's {max_seq} rows, got "
                             f"offsets {start.tolist()}")
    return offsets


def fp8_bytes(cache, kv_cache_dtype="auto"):
    """A ``torch.uint8`` cache, as vLLM allocates its quantised caches, read as the values its bytes hold (a view):
    e5m2 when ``kv_cache_dtype`` is ``"fp8_e5m2"``, int8 when it is ``"int8_per_token_head"`` (the bytes carry no
    other mark), bytes still with ``"nvfp4"`` (two e2m1 values a byte), e4m3 otherwise; anything else as it is."""
    if not isinstance(cache, torch.Tensor) or cache.dtype != torch.uint8 or kv_cache_dtype == "nvfp4":
        return cache
    return cache.view({"fp8_e5m2": torch.float8_e5m2, "int8_per_token_head": torch.int8}.get(
        kv_cache_dtype if isinstance(kv_cache_dtype, str) else "", FP8_DTYPE))


def check_scale(name: str, scale, fp8: bool, device, n_heads: int | None = None) -> None:
    """A float32 one-element device tensor with a quantised cache (stored = x / scale), or with ``n_heads`` one
    a kv head, ``(n_heads,)``. With a cache in the model's dtype a tensor is accepted and not read (engines pass
    their scales whatever the cache holds), or None."""
    if not fp8:
        if scale is not None and not isinstance(scale, torch.Tensor):
            raise TypeError(f"{name} must be a tensor or None, got {type(scale).__name__}")
        return
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor of one element with a quantised cache, got "
                        f"{type(scale).__name__}")
    per_head = n_heads is not None and scale.ndim == 1 and scale.shape[0] == n_heads
    if scale.dtype != torch.float32 or not (scale.numel() == 1 or per_head):
        heads = f" or of shape ({n_heads},) (one a kv head)" if n_heads is not None else ""
        raise TypeError(f"{name} must be a float32 tensor of one element{heads}, got {scale.dtype} of shape "
                        f"{tuple(scale.shape)}")
    if not _on(scale, device):
        raise ValueError(f"{name} is on {scale.device} but q is on {device}")


def check_q_output(q, q_dtype, q_scale, inplace: bool):
    """A float8 q output: ``q_dtype`` None (or q's own dtype), ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``, out of
    place, with ``q_scale`` a float32 one-element tensor exactly then. Returns the float8 dtype or None."""
    if q_dtype is None or q_dtype == q.dtype:
        if q_scale is not None:
            raise ValueError("q_scale is given but q_dtype is not float8 (q is written in its own dtype)")
        return None
    if q_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"q_dtype must be None, q's dtype, torch.float8_e4m3fn or torch.float8_e5m2, got {q_dtype!r}")
    if inplace:
        raise ValueError(f"q_dtype {q_dtype} writes a new q: inplace=True cannot change q's dtype")
    check_scale("q_scale", q_scale, True, q.device)
    return q_dtype


def check_scale_cache(name: str, scales, cache_name: str, cache, device) -> None:
    """A per-(token, head) scale cache: float32, the shape of ``cache`` without its channels (``(blocks, block_size,
    heads)``, or ``(batch, max_seq, heads)`` beside a contiguous cache), any strides (a ``(blocks, heads,
    block_size)`` allocation passes as its transposed view), on ``device``. It is written."""
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (the per-(token, head) scales are written to it), got "
                        f"{type(scales).__name__}")
    if scales.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {scales.dtype}")
    if tuple(scales.shape) != tuple(cache.shape[:3]):
        raise ValueError(f"{name} must have shape {tuple(cache.shape[:3])} ({cache_name}'s without its channels: "
                         f"one scale a slot and head), got {tuple(scales.shape)}")
    if not _on(scales, device):
        raise ValueError(f"{name} is on {scales.device} but q is on {device}")


# NVFP4 scales each 16 consecutive channels of a head vector with one e4m3 block scale
NVFP4_BLOCK = 16


def check_nvfp4_channels(head_dim: int, v_dim: int | None, rotary_dim: int, interleaved: bool) -> None:
    """NVFP4's 16-channel blocks against what the kernel holds: whole blocks of k's and v's head vectors, and (the
    rotation keeps its pair halves, or the rotated channels and the tail, apart) blocks that never straddle them:
    ``rotary_dim`` a multiple of 16 with GPT-J pairing, of 32 with NeoX pairing (each half whole blocks)."""
    for name, dim in (("k", head_dim), ("v", v_dim)):
        if dim is not None and dim % NVFP4_BLOCK:
            raise ValueError(f"{name}'s head size must be a multiple of {NVFP4_BLOCK} with kv_cache_dtype 'nvfp4' (one "
                             f"e4m3 scale per {NVFP4_BLOCK} channels), got {dim}")
    step = NVFP4_BLOCK if interleaved else 2 * NVFP4_BLOCK
    if rotary_dim % step:
        pairing = "GPT-J pairing (interleaved=True)" if interleaved else \
            "NeoX pairing (interleaved=False), each half of the rotated channels"
        raise ValueError(f"rotary_dim must be a multiple of {step} with kv_cache_dtype 'nvfp4' and {pairing} holding "
                         f"whole {NVFP4_BLOCK}-channel blocks, got {rotary_dim}")


def check_block_scales(name: str, scales, cache_name: str, cache, device) -> None:
    """NVFP4's block-scale cache: e4m3 bytes (``torch.float8_e4m3fn`` or ``torch.uint8``), ``cache``'s shape (in its
    own layout, NHD or HND) with ``head_dim / 16`` for the ``head_dim / 2`` bytes, a contiguous last axis, on
    ``device``. It is written."""
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (NVFP4's block scales are written to it), got "
                        f"{type(scales).__name__}")
    if scales.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"{name} must be torch.float8_e4m3fn (or its torch.uint8 bytes), got {scales.dtype}")
    want = tuple(cache.shape[:3]) + (cache.shape[3] // (NVFP4_BLOCK // 2),)
    if tuple(scales.shape) != want:
        raise ValueError(f"{name} must have shape {want} ({cache_name}'s, in its layout, with one e4m3 scale per "
                         f"{NVFP4_BLOCK} channels), got {tuple(scales.shape)}")
    if not _on(scales, device):
        raise ValueError(f"{name} is on {scales.device} but q is on {device}")
    if scales.numel() and scales.stride(-1) != 1:
        raise ValueError(f"{name} must have contiguous block scales (stride 1 in the last dimension)")


def check_no_grad(op: str, names: tuple, tensors: tuple) -> None:
    """A cache write is inference: with grad enabled, no tensor of the call may require grad (the first is named).
    Under ``torch.no_grad()`` such tensors are written as PyTorch's own in-place ops write them."""
    if not torch.is_grad_enabled():
        return
    for name, t in zip(names, tensors):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(f"{name} requires grad, but {op} has no autograd (a cache write is inference): call it "
                             "under torch.no_grad() or with tensors that do not require grad")


def paged_kv_cache(paged_kv_cache, v_cache):
    """FlashInfer's ``paged_kv_cache`` given as ``k_cache``: a ``(k_cache, v_cache)`` pair or a 5-D tensor whose
    ``[:, 0]`` and ``[:, 1]`` are the k and v caches (views)."""
    pair = isinstance(paged_kv_cache, (tuple, list)) and len(paged_kv_cache) == 2
    five_d = isinstance(paged_kv_cache, torch.Tensor) and paged_kv_cache.shape[1] == 2
    if not pair and not five_d:
        error = ValueError if isinstance(paged_kv_cache, (torch.Tensor, tuple, list)) else TypeError
        raise error("k_cache must be a 4-D tensor, a (k_cache, v_cache) pair or a 5-D (num_blocks, 2, ...) tensor "
                    f"(FlashInfer's paged_kv_cache), got {getattr(paged_kv_cache, 'shape', type(paged_kv_cache))}")
    if v_cache is not None:
        raise ValueError("k_cache given as a (k_cache, v_cache) pair or a 5-D (num_blocks, 2, ...) tensor holds the v "
                         "cache too: pass v_cache=None")
    return tuple(paged_kv_cache) if pair else (paged_kv_cache[:, 0], paged_kv_cache[:, 1])


def cache_arguments(q, k, v, k_cache, v_cache, slot_mapping, cache_offsets, page_table, kv_layout, k_scale,
                    v_scale, spec, layout, kv_cache_dtype, k_scale_cache, v_scale_cache, rotary_dim, interleaved):
    """The cache side of the call: v, the caches, the address map, the format and its scales. Returns (the tensor
    the kernel reads as slots, cache mode)."""
    kv = to_bshd(k, layout)
    if v is not None:
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"v must be a torch.Tensor or None, got {type(v).__name__}")
        if v.dtype != k.dtype or v.device != k.device:
            raise TypeError(f"v must have k's dtype and device ({k.dtype} on {k.device}), got {v.dtype} on {v.device}")
        if v.ndim != k.ndim or tuple(to_bshd(v, layout).shape[:-1]) != tuple(kv.shape[:-1]):
            raise ValueError(f"v must have k's tokens and heads (shape {tuple(k.shape[:-1])} in every dimension but "
                             f"the last, in layout {layout!r}), got {tuple(v.shape)}")
    if (v is None) != (v_cache is None):
        raise ValueError("v and v_cache go together: pass both or neither")
    kv_indices, kv_indptr, batch_indices, cache_positions = page_table
    by_table = any(t is not None for t in page_table)
    if by_table and any(t is None for t in page_table):
        raise ValueError("the page table is kv_indices, kv_indptr, batch_indices and cache_positions: pass all four "
                         "or none")
    if (slot_mapping is not None) + (cache_offsets is not None) + by_table != 1:
        raise ValueError("pass exactly one of slot_mapping (a paged cache), the page table (kv_indices, kv_indptr, "
                         "batch_indices, cache_positions: a paged cache) and cache_offsets (a contiguous cache)")
    paged = cache_offsets is None
    n_seqs = spec.cu_seqlens.shape[0] - 1 if spec.is_varlen else kv.shape[0]
    n_heads, head_dim = kv.shape[-2], kv.shape[-1]
    per_token_head = check_kv_cache_dtype(kv_cache_dtype, k_cache)
    nvfp4 = kv_cache_dtype == "nvfp4"
    if nvfp4:  # two values a byte: the caches hold half the channels' bytes
        check_nvfp4_channels(head_dim, v.shape[-1] if v is not None else None, rotary_dim, interleaved)
    formats = (torch.uint8,) if nvfp4 else QUANT_DTYPES
    check_cache("k_cache", k_cache, leading=None if paged else (n_seqs,), n_heads=n_heads,
                head_dim=head_dim // 2 if nvfp4 else head_dim, dtype=k.dtype, device=q.device, kv_layout=kv_layout,
                quantised=formats)
    blocks = tuple(nhd(k_cache, kv_layout).shape[:2])
    if v_cache is not None:
        check_cache("v_cache", v_cache, leading=blocks, n_heads=n_heads,
                    head_dim=v.shape[-1] // 2 if nvfp4 else v.shape[-1], dtype=k.dtype, device=q.device,
                    kv_layout=kv_layout, quantised=formats)
        if v_cache.dtype != k_cache.dtype:
            raise TypeError(f"v_cache must have k_cache's dtype ({k_cache.dtype}), got {v_cache.dtype}")
    quantised = k_cache.dtype in QUANT_DTYPES or nvfp4
    if (per_token_head or nvfp4) and k_scale_cache is None:
        what = "a block scale per 16 channels" if nvfp4 else "a scale per token and head"
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} computes {what}: pass k_scale_cache (and v_scale_cache "
                         "with v) to receive them")
    if k_scale_cache is not None or v_scale_cache is not None:
        if not quantised:
            raise ValueError(f"k_scale_cache/v_scale_cache are given but k_cache holds {k_cache.dtype}, which has "
                             "no scales (a quantised cache: float8 e4m3 or e5m2, int8, or NVFP4)")
        if nvfp4:
            check_block_scales("k_scale_cache", k_scale_cache, "k_cache", k_cache, q.device)
        else:
            check_scale_cache("k_scale_cache", k_scale_cache, "k_cache", nhd(k_cache, kv_layout), q.device)
        if (v_cache is None) != (v_scale_cache is None):
            raise ValueError("v_scale_cache goes with v_cache: pass both or neither (with k_scale_cache)")
        if v_cache is not None and nvfp4:
            check_block_scales("v_scale_cache", v_scale_cache, "v_cache", v_cache, q.device)
        elif v_cache is not None:
            check_scale_cache("v_scale_cache", v_scale_cache, "v_cache", nhd(v_cache, kv_layout), q.device)
    # with scale caches the per-tensor scales are accepted and unread, as with a cache in the model's dtype; NVFP4
    # reads them as its global scales (one element each)
    read = (quantised and k_scale_cache is None) or nvfp4
    check_scale("k_scale", k_scale, read, q.device, None if nvfp4 else n_heads)
    check_scale("v_scale", v_scale, read and v_cache is not None, q.device, None if nvfp4 else n_heads)
    n_tokens = kv.shape[0] if spec.is_varlen else kv.shape[0] * kv.shape[1]
    if by_table:
        check_page_table(kv_indices, kv_indptr, batch_indices, cache_positions, n_tokens, blocks[0], blocks[1],
                         q.device, "k_cache")
        return cache_positions, CACHE_PAGE_TABLE
    if paged:
        return check_slot_mapping(slot_mapping, n_tokens, blocks[0] * blocks[1], q.device), CACHE_PAGED

    def lengths():
        cu = spec.cu_seqlens
        return (cu[1:] - cu[:-1]).cpu() if spec.is_varlen else [kv.shape[1]] * n_seqs

    offsets = check_cache_offsets(cache_offsets, n_seqs, lengths, blocks[1], q.device)
    return offsets, CACHE_CONTIGUOUS


def tokens_view(name: str, x, tokens: int, width: int | None = None) -> torch.Tensor:
    """``(tokens, width)`` or ``(tokens, 1, width)`` as the kernel's ``(1, tokens, 1, width)`` view."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim == 3 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 2 or x.shape[0] != tokens or (width is not None and x.shape[1] != width):
        want = f"({tokens}, {width if width is not None else 'width'})"
        raise ValueError(f"{name} must have shape {want} (one row per token of q_pe), got {tuple(x.shape)}")
    return x[None, :, None, :]


def latent_caches(ckv_cache, kpe_cache, latent: int, rope_dim: int) -> tuple:
    """The v (latent) and k (rope) caches as the kernel's ``(num_blocks, block_size, 1, width)`` views: the two
    column ranges of one ``kv_cache``, or ``ckv_cache`` and ``kpe_cache``."""
    if kpe_cache is None:
        if not isinstance(ckv_cache, torch.Tensor) or ckv_cache.ndim != 3:
            raise ValueError(f"kv_cache must be (num_blocks, block_size, {latent + rope_dim}) or a pair (ckv_cache, "
                             f"kpe_cache), got {getattr(ckv_cache, 'shape', type(ckv_cache).__name__)}")
        if ckv_cache.shape[2] != latent + rope_dim:
            raise ValueError(f"kv_cache's last dimension must be kv_lora_rank + rope_dim = {latent + rope_dim}, got "
                             f"shape {tuple(ckv_cache.shape)}")
        return ckv_cache[..., None, :latent], ckv_cache[..., None, latent:]
    for name, cache, width, what in (("ckv_cache", ckv_cache, latent, "kv_lora_rank"),
                                     ("kpe_cache", kpe_cache, rope_dim, "rope_dim")):
        if not isinstance(cache, torch.Tensor) or cache.ndim != 3 or cache.shape[2] != width:
            raise ValueError(f"{name} must be (num_blocks, block_size, {width}) ({what}), got "
                             f"{getattr(cache, 'shape', type(cache).__name__)}")
    return ckv_cache[..., None, :], kpe_cache[..., None, :]
