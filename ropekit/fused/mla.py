"""``mla_rope_and_cache``: DeepSeek MLA's decoupled RoPE and its latent-cache write, in one launch.

Rotates ``q_pe (tokens, heads, rope_dim)`` and the shared ``k_pe (tokens, rope_dim)`` (GPT-J pairing by default,
tables of any rope type, YaRN's included), and writes ``[kv_c | rotated k_pe]`` into ``kv_cache (num_blocks,
block_size, kv_lora_rank + rope_dim)`` at ``slot_mapping`` (-1: skip), the contract of vLLM's
``concat_and_cache_mla_rope_fused``; or kv_c into ``ckv_cache`` and the rotated k_pe into ``kpe_cache``, two separate
caches, as FlashInfer's ``append_paged_mla_kv_cache`` does, addressed by a slot mapping or by FlashInfer's page table;
or DeepSeek-V3.2's fp8_ds_mla entry, kv_c in float8 tiles at scales computed on write beside the rotated k_pe.
It is :func:`ropekit.rope_and_cache` with one k head and kv_c as v; the v and k caches are the column ranges of one
buffer, or the two caches, or the fp8_ds_mla entry's parts (kv_cache._kernel_arguments' views).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..outputs import bump_versions, new_output
from ..triton.fused import CACHE_PAGE_TABLE, CACHE_PAGED, plan_fused
from ..triton.launch import released
from ..validate import in_callers_names
from . import validate
from .kv_cache import CacheLaunch, _kernel_arguments, ds_mla_views, run_cache_op
from .qk_norm_rope import angle_flags, position_fields
from .plan import FusedPlan, keyed, planned, plans, reads_callers_memory, with_outputs

__all__ = ["mla_rope_and_cache"]


def mla_rope_and_cache(q_pe: torch.Tensor, k_pe: torch.Tensor, kv_c: torch.Tensor, kv_cache,
                       slot_mapping: Optional[torch.Tensor], positions: torch.Tensor,
                       cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None, *,
                       cos_sin_cache: Optional[torch.Tensor] = None, table=None, interleaved: bool = True,
                       inplace: bool = True, kv_cache_scale: Optional[torch.Tensor] = None,
                       kv_indices: Optional[torch.Tensor] = None,
                       kv_indptr: Optional[torch.Tensor] = None, batch_indices: Optional[torch.Tensor] = None,
                       cache_positions: Optional[torch.Tensor] = None, kv_cache_dtype: str = "auto",
                       inv_freq: Optional[torch.Tensor] = None, scale: float = 1.0):
    """Rotate q_pe and k_pe, write kv_c and the rotated k_pe to the paged latent cache. Returns ``(q_pe_out,
    k_pe_out)``: in place q_pe and k_pe themselves, as given (the engines' contract), on every call; new tensors
    otherwise (k_pe_out ``(tokens, rope_dim)``).

    Args:
        q_pe: ``(tokens, heads, rope_dim)``; k_pe: ``(tokens, rope_dim)`` (or ``(tokens, 1, rope_dim)``);
            kv_c: ``(tokens, kv_lora_rank)`` (or ``(tokens, 1, kv_lora_rank)``); one dtype, any strides.
        kv_cache: ``(num_blocks, block_size, kv_lora_rank + rope_dim)`` holding ``[kv_c | rotated k_pe]`` (vLLM's),
            or a pair ``(ckv_cache, kpe_cache)`` of ``(num_blocks, block_size, kv_lora_rank)`` and ``(num_blocks,
            block_size, rope_dim)`` caches (FlashInfer's); q_pe's dtype, ``torch.float8_e4m3fn`` or
            ``torch.float8_e5m2`` (then ``kv_cache_scale``: a float32 one-element tensor, stored = x / scale rounded
            to the format, saturating, for both parts).
        slot_mapping: int64 ``(tokens,)``, -1 skips the token (a shorter mapping covers the first tokens); or None
            with the page table ``kv_indices``, ``kv_indptr``, ``batch_indices``, ``cache_positions``, as
            :func:`ropekit.rope_and_cache` reads it. positions: int ``(tokens,)`` (a longer one is read for the
            first tokens). A ``torch.uint8`` cache is read as e5m2 bytes with ``kv_cache_dtype="fp8_e5m2"``, e4m3
            bytes otherwise; with a cache in q_pe's dtype ``kv_cache_scale`` is accepted and unread.
        kv_cache_dtype: vLLM's name of the cache's format, as :func:`ropekit.rope_and_cache` takes it:
            ``"auto"`` (the cache's dtype says), ``"float16"``, ``"bfloat16"``, ``"fp8"``/``"fp8_e4m3"``,
            ``"fp8_e5m2"``; the cache must be of the dtype it names (or ``torch.uint8``). Or ``"fp8_ds_mla"``,
            DeepSeek-V3.2's entry: one ``torch.uint8`` kv_cache ``(num_blocks, block_size, kv_lora_rank + 4 *
            kv_lora_rank / 128 + rope_dim * itemsize)`` (656 bytes for 512 + 64 in bf16) holding kv_c in e4m3 at a
            float32 scale per 128-channel tile, ``max|x| / 448`` computed on write, the scales, then the rotated
            k_pe in q_pe's dtype (docs/fused.md states it byte for byte).
        cos, sin / cos_sin_cache / table: half-width tables ``(max_positions, rope_dim/2)``, or the engines'
            ``(max_positions, rope_dim)`` buffer with cos in the first half of the columns and sin in the second
            (exactly rope_dim wide: q_pe's last dimension).
        inv_freq, scale: the angles computed in the kernel from the inverse frequencies ``(rope_dim/2,)`` (YaRN's,
            from :func:`ropekit.rope_init`), each cos and sin times ``scale`` (YaRN's attention factor), as
            :func:`ropekit.apply_rope` takes them: no table (cos, sin, cos_sin_cache and table None), so a
            million-token context reads no table.
        interleaved: GPT-J pairing (DeepSeek's default); False pairs NeoX halves.
    """
    separate = isinstance(kv_cache, (tuple, list))
    if separate and len(kv_cache) != 2:
        raise ValueError(f"kv_cache given as a sequence must be the pair (ckv_cache, kpe_cache), got {len(kv_cache)} "
                         "elements")
    ckv_cache, kpe_cache = kv_cache if separate else (kv_cache, None)
    page_table = (kv_indices, kv_indptr, batch_indices, cache_positions)
    user = (q_pe, k_pe, kv_c, ckv_cache, kpe_cache, slot_mapping, positions, cos, sin, cos_sin_cache, kv_cache_scale,
            *page_table, inv_freq)
    key = at = None
    angles = angle_flags(scale, None, False)
    if table is None and angles is not None and planned(user):
        # (an fp8_ds_mla entry is read as float32 and as the inputs' dtype too: where the cache starts, to the 8 bytes
        # of the widest, is part of the signature)
        aligned = ckv_cache.storage_offset() % 8 if kv_cache_dtype == "fp8_ds_mla" and not separate and \
            isinstance(ckv_cache, torch.Tensor) else None
        key, at = keyed("mla_rope_and_cache", user, (interleaved, inplace, kv_cache_dtype, aligned) + angles)
        plan = plans.find(key)
        if plan is not None:  # a call signature validated before: where the tensors lie, then the launch
            return _run_plan(plan, user, inplace, kv_cache_dtype == "fp8_ds_mla", at=at)
    if not isinstance(q_pe, torch.Tensor) or q_pe.ndim != 3:
        raise ValueError(f"q_pe must be a (tokens, heads, rope_dim) tensor, got "
                         f"{getattr(q_pe, 'shape', type(q_pe).__name__)}")
    tokens, rope_dim = q_pe.shape[0], q_pe.shape[2]
    tables = ""
    if cos_sin_cache is not None:
        if cos is not None or sin is not None or table is not None or inv_freq is not None:
            raise ValueError("pass one of cos/sin, cos_sin_cache, table and inv_freq")
        # one width: a wider buffer would be split at the wrong column, its frequencies those of another rope_dim
        if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.ndim != 2 or \
                cos_sin_cache.shape[1] != rope_dim:
            raise ValueError(f"cos_sin_cache must be (max_position, rope_dim) with rope_dim {rope_dim} (q_pe's last "
                             f"dimension), got {getattr(cos_sin_cache, 'shape', type(cos_sin_cache).__name__)}")
        cos, sin = cos_sin_cache[:, :rope_dim // 2], cos_sin_cache[:, rope_dim // 2:]
        tables = ", cos/sin are the two halves of cos_sin_cache"
    elif table is not None:
        tables = ", cos/sin are table's"
    if not isinstance(positions, torch.Tensor) or positions.ndim != 1 or positions.shape[0] < tokens:
        raise ValueError(f"positions must be a ({tokens},) integer tensor (one position per token; a longer "
                         "one is read for the first tokens), got "
                         f"{getattr(positions, 'shape', type(positions).__name__)}")
    given_positions = positions  # (the whole tensor is the call's: no cache may lie on its padding either)
    positions = positions[:tokens]  # an engine's CUDA-graph batch may pad positions past the tokens
    user_tables = (cos, sin)
    user_positions = positions[None]
    validate.check_mla_kv_cache_dtype(kv_cache_dtype)
    ds = kv_cache_dtype == "fp8_ds_mla"
    if not ds:
        ckv_cache = validate.fp8_bytes(ckv_cache, kv_cache_dtype)
        kpe_cache = validate.fp8_bytes(kpe_cache, kv_cache_dtype)
    q = q_pe[None]
    k = validate.tokens_view("k_pe", k_pe, tokens, rope_dim)
    v = validate.tokens_view("kv_c", kv_c, tokens)
    cache_names = ("ckv_cache", "kpe_cache") if separate else ("kv_cache",)
    # the rotation's checks name its own arguments; the message adds which of this call's they are
    with in_callers_names("mla_rope_and_cache", "q is q_pe, k is k_pe, v is kv_c, rotary_dim and head_dim are "
                          f"rope_dim (q_pe's last dimension, {rope_dim}){tables}"):
        if v.dtype != q.dtype or v.device != q.device:
            raise TypeError(f"kv_c must have q_pe's dtype and device ({q.dtype} on {q.device}), got {v.dtype} on "
                            f"{v.device}")
        cos, sin, spec, rotary_dim = validate.rotary_arguments(q, k, cos, sin, table, user_positions, "bshd",
                                                               rope_dim, None, None, False, interleaved, inv_freq,
                                                               scale)
        latent = v.shape[-1]
        if ds:  # one entry a token: kv_c in e4m3 tiles, a float32 scale a tile, the rotated k_pe in q_pe's dtype
            if separate:
                raise ValueError("kv_cache_dtype='fp8_ds_mla' is one kv_cache whose entry holds kv_c, its scales and "
                                 "k_pe (vLLM's layout), not a pair (ckv_cache, kpe_cache)")
            validate.check_ds_mla_cache(ckv_cache, latent, rope_dim, q.dtype, q.device)
            # the entry cache itself, one tensor written (kv_cache._kernel_arguments takes its three views)
            k_cache, v_cache = ckv_cache, None
        else:
            v_cache, k_cache = validate.latent_caches(ckv_cache, kpe_cache, latent, rope_dim)
            validate.check_cache(cache_names[-1], k_cache, leading=None, n_heads=1, head_dim=rope_dim, dtype=q.dtype,
                                 device=q.device, quantised=validate.FLOAT8_DTYPES)
        if separate:
            validate.check_cache("ckv_cache", v_cache, leading=tuple(k_cache.shape[:2]), n_heads=1,
                                 head_dim=latent, dtype=q.dtype, device=q.device, quantised=validate.FLOAT8_DTYPES)
            if ckv_cache.dtype != kpe_cache.dtype:
                raise TypeError(f"ckv_cache and kpe_cache must have one dtype, got {ckv_cache.dtype} and "
                                f"{kpe_cache.dtype}")
        if not ds:
            validate.check_kv_cache_dtype(kv_cache_dtype, ckv_cache, cache_names[0])
        fp8 = ckv_cache.dtype in validate.FLOAT8_DTYPES
        validate.check_scale("kv_cache_scale", kv_cache_scale, fp8, q.device)
        by_table = any(t is not None for t in page_table)
        if by_table and any(t is None for t in page_table):
            raise ValueError("the page table is kv_indices, kv_indptr, batch_indices and cache_positions: pass all "
                             "four or none")
        if by_table == (slot_mapping is not None):
            raise ValueError("pass exactly one of slot_mapping and the page table (kv_indices, kv_indptr, "
                             "batch_indices, cache_positions)")
        if by_table:
            validate.check_page_table(*page_table, tokens, k_cache.shape[0], k_cache.shape[1], q.device,
                                      cache_names[-1])
            slots, cache_mode, user_slots = cache_positions, CACHE_PAGE_TABLE, cache_positions
        else:
            user_slots = slot_mapping
            slots = validate.check_slot_mapping(slot_mapping, tokens, k_cache.shape[0] * k_cache.shape[1], q.device)
            cache_mode = CACHE_PAGED
    table_names = (("cos_sin_cache",) if cos_sin_cache is not None else ("table", "table") if table is not None
                   else ("inv_freq",) if inv_freq is not None else ("cos", "sin"))
    names = ("q_pe", "k_pe", "kv_c") + cache_names + ("slot_mapping", "positions", "kv_cache_scale") + \
        _PAGE_TABLE + table_names
    # the caller's own slot mapping and tables (what validation derived from them is a view of them or a fresh
    # copy)
    tensors = (q, k, v, ckv_cache) + ((kpe_cache,) if separate else ()) + (
        slot_mapping, given_positions, kv_cache_scale if fp8 else None, *page_table) + (
        (cos_sin_cache,) if cos_sin_cache is not None else (cos, sin) if table is not None else
        (inv_freq,) if inv_freq is not None else user_tables)
    validate.check_no_grad("mla_rope_and_cache", names, tensors)
    plan = FusedPlan(None, names, cache_names + (("q_pe", "k_pe") if inplace else ()), fp8)
    plan.check(tensors, at)
    out_q, out_k = (q, k) if inplace else (new_output(q), new_output(k))
    launch = CacheLaunch(slots=slots, cache_mode=cache_mode, batch_indices=batch_indices, kv_indices=kv_indices,
                         kv_indptr=kv_indptr, kv_layout="NHD", cos=cos, sin=sin, **position_fields(spec),
                         rotary_dim=rotary_dim, interleaved=interleaved, k_scale=kv_cache_scale,
                         v_scale=kv_cache_scale)
    angle_args = dict(inv_freq=inv_freq, angle_scale=scale)
    if key is not None and not q.is_meta and reads_callers_memory((slots, spec.tensor, cos, sin),
                                                                  (user_slots, user_positions, *user_tables)):
        # planned only when the launch reads the caller's own tensors (not a padded slot mapping or copies)
        plan.launch = released(plan_fused(**_kernel_arguments(q, k, v, out_q, out_k, k_cache, v_cache, *launch,
                                                              **angle_args)))
        plans.put(key, plan)
        return _run_plan(plan, user, inplace, ds, out_q[0], out_k[0, :, 0])
    if not q.is_meta:
        run_cache_op(q, k, v, out_q, out_k, k_cache, v_cache, *launch, **angle_args)
    return (q_pe, k_pe) if inplace else (out_q[0], out_k[0, :, 0])


_PAGE_TABLE = ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")


def _run_plan(plan, user, inplace, ds, out_q=None, out_k=None, at=None):
    """A planned call: the overlap rule at the tensors' addresses, the outputs and the launch, on the caller's own
    tensors (the kernel's views of q_pe, k_pe, kv_c, positions, ckv_cache, kpe_cache and v's part of kv_cache have
    their data pointers; k's part of kv_cache and sin's half of cos_sin_cache are the two views taken here, at
    offsets the plan fixes, so the call's addresses decide the launch's: ``FusedPlan.relaunch``; ``ds``: the fp8_ds_mla
    entry's three views of kv_cache). ``at``: where the call's tensors lie (:func:`~ropekit.fused.plan.keyed`); None:
    the launch is not kept (the plan's first call)."""
    q_pe, k_pe, kv_c, ckv_cache, kpe_cache, slot_mapping, positions, cos, sin, cos_sin_cache, scale, kv_indices, \
        kv_indptr, batch_indices, cache_positions, inv_freq = user
    if out_q is None:
        caches = (ckv_cache,) if kpe_cache is None else (ckv_cache, kpe_cache)
        at = plan.check((q_pe, k_pe, kv_c) + caches + (slot_mapping, positions, scale if plan.fp8 else None,
                                                       kv_indices, kv_indptr, batch_indices, cache_positions) + (
            (cos_sin_cache,) if cos_sin_cache is not None else (inv_freq,) if inv_freq is not None else (cos, sin)),
            at)
        if inplace:
            out_q, out_k = q_pe, (k_pe if k_pe.ndim == 2 else k_pe[:, 0])
        else:
            out_q, out_k = new_output(q_pe), k_pe.new_empty((q_pe.shape[0], q_pe.shape[2]))
            at = with_outputs(at, out_q, out_k)
    if plan.launch is not None and not plan.relaunch(at):
        tokens, rope_dim = q_pe.shape[0], q_pe.shape[2]
        if cos_sin_cache is not None:
            cos, sin = cos_sin_cache, cos_sin_cache[:, rope_dim // 2:]
        if positions.shape[0] != tokens:  # (a view is a microsecond of host time: taken only where it differs)
            positions = positions[:tokens]
        k_scale = v_scale = scale if plan.fp8 else None
        if ds:
            k_cache, v_cache, v_scale = ds_mla_views(ckv_cache, kv_c.shape[-1], rope_dim, q_pe.dtype)
        else:
            k_cache, v_cache = (ckv_cache[..., kv_c.shape[-1]:] if kpe_cache is None else kpe_cache), ckv_cache
        plan.launch_at(at, q_pe, k_pe, out_q, out_k, kv_c, k_cache, v_cache, k_scale, v_scale,
                       slot_mapping if cache_positions is None else cache_positions, batch_indices, kv_indices,
                       kv_indptr, None, None, cos if inv_freq is None else inv_freq, sin, positions, None, 0)
    if inplace:
        bump_versions(ckv_cache, kpe_cache, q_pe, k_pe)
        return q_pe, k_pe
    bump_versions(ckv_cache, kpe_cache)
    return out_q, out_k
