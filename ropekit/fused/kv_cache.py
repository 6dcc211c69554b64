"""``rope_and_cache``: rotate q and k (optionally QK-normed first) and write rotated k and untouched v straight into a
KV cache, contiguous ``(batch, max_seq, heads, dim)`` at per-sequence offsets, or paged ``(num_blocks, block_size,
heads, dim)`` by ``slot_mapping`` (vLLM's) or by a page table (FlashInfer's ``kv_indices``/``kv_indptr`` with a
request and a position per token), the head axis second (``kv_layout="HND"``) or third, optionally quantised on
write (float8 e4m3 or e5m2, int8; per-tensor, per-head or per-(token, head) scales, the last computed from the
rotated head vector and written beside the cache; NVFP4, e2m1 values with an e4m3 scale per 16 channels written beside
the cache over a global scale): one launch.

The call -> validation (apply_rope's rotary checks, then ``validate``'s for weights, caches, slots and scales, all
before any write) -> ``ropekit::rope_and_cache`` (a mutating custom op, so torch.compile keeps it in the graph); eager
calls go through a plan (:mod:`ropekit.fused.plan`), made once per call signature and launched directly. No autograd: a cache write is inference.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple, Optional

import torch

from ..layouts import to_bshd
from ..outputs import bump_versions, new_output
from ..triton.fused import CACHE_CONTIGUOUS, CACHE_PAGE_TABLE, plan_fused
from ..triton.launch import released
from ..triton.fused_tiles import E4M3, E5M2, INT8, NVFP4, PER_BLOCK, PER_HEAD, PER_TENSOR, PER_TILE, PER_TOKEN_HEAD, \
    PLAIN, TILE_CHANNELS
from . import validate
from .plan import FusedPlan, keyed, planned, plans, reads_callers_memory, with_outputs
from .qk_norm_rope import _spec, angle_flags, fused_launch, position_fields, schema_names

__all__ = ["rope_and_cache", "launch_cache", "quant_codes", "CacheLaunch"]


class CacheLaunch(NamedTuple):
    """A validated cache write's launch arguments after its seven tensors (``q, k, v, out_q, out_k, k_cache,
    v_cache``), by name: what :func:`_kernel_arguments`, :func:`run_cache_op` and the ``ropekit::rope_and_cache``
    custom op take next, in this order (a custom op's schema is positional: the module checks both against these
    fields when it is imported). The front doors (``rope_and_cache``, ``mla_rope_and_cache``) build it by keyword;
    the defaults are a call without a norm, in ``bshd``, one scale or none."""

    slots: torch.Tensor  # the slot mapping, the contiguous cache's offsets or the page table's positions
    cache_mode: int
    batch_indices: Optional[torch.Tensor]
    kv_indices: Optional[torch.Tensor]
    kv_indptr: Optional[torch.Tensor]
    kv_layout: str
    cos: Optional[torch.Tensor]
    sin: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]  # the position spec's tensor, mode, sequence starts, offset and longest sequence
    pos_mode: int
    cu_seqlens: Optional[torch.Tensor]
    position_offset: int
    max_seqlen: int
    rotary_dim: int
    layout: str = "bshd"
    interleaved: bool = False
    per_token: bool = False
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None
    q_weight: Optional[torch.Tensor] = None
    k_weight: Optional[torch.Tensor] = None
    eps: float = 1e-6
    weight_offset: float = 0.0


def _kernel_arguments(q, k, v, out_q, out_k, k_cache, v_cache, slots, cache_mode: int, batch_indices, kv_indices,
                      kv_indptr, kv_layout: str, cos, sin, positions, pos_mode: int, cu_seqlens, position_offset: int,
                      max_seqlen: int, rotary_dim: int, layout: str, interleaved: bool, per_token: bool, k_scale,
                      v_scale, q_weight, k_weight, eps: float, weight_offset: float, k_scale_cache=None,
                      v_scale_cache=None, q_scale=None, norm=None, norm_over_heads=False, inv_freq=None,
                      angle_scale=1.0, nope_floor_scale: int = 0, nope_attn_scale: float = 0.0) -> dict:
    """A validated call as the fused launcher (:func:`~ropekit.triton.fused.plan_fused`, or the native
    :func:`ropekit.native.fused`) takes it: the kernels' views (the caches as ``(blocks, rows, heads, dim)``), the
    cache's geometry and address map, and the store the cache's dtype and the scales make (the scales only with a
    quantised cache: the kernel never sees others; with scale caches, those in their place, written; NVFP4: the
    block-scale caches as bytes in their place and the scales given as the global ones; a float8 ``out_q`` as its
    bytes, at ``q_scale``; ``inv_freq``: the angles without a table, cos and sin None; ``nope_floor_scale`` > 0: a
    NoPE layer at ``(nope_floor_scale, nope_attn_scale)``, cos and sin None). A 3-D ``torch.uint8`` ``k_cache`` with
    v and no ``v_cache`` is DeepSeek's fp8_ds_mla entry cache (:func:`ds_mla_views`): k into it in q's dtype, v in
    float8 at a scale per tile of TILE_CHANNELS channels written beside v (one tensor: what the custom op mutates,
    whose views are taken here, inside the op)."""
    ds = v is not None and v_cache is None and k_cache.dtype == torch.uint8 and k_cache.ndim == 3
    if ds:
        validate.check_ds_mla_alignment(k_cache, q.dtype)  # (a compiled call's validation could not read it)
        k_cache, v_cache, v_scale_cache = ds_mla_views(k_cache, v.shape[-1], k.shape[-1], q.dtype)
    # per head when either scale has one a head (a one-element one is then read at stride 0)
    per_head = any(s is not None and s.numel() > 1 for s in (k_scale, v_scale))
    quant = quant_codes(k_cache.dtype, per_head=per_head, per_token_head=k_scale_cache is not None)
    k_global = v_global = v_quant = None
    if ds:  # k in the model's dtype; v in e4m3 at the tiles' scales, written
        v_quant, k_scale, v_scale = (E4M3, PER_TILE), None, v_scale_cache
    elif quant[0] == PLAIN:
        k_scale = v_scale = None
    elif quant[1] == PER_BLOCK:
        k_global, v_global = k_scale, v_scale
        k_scale, v_scale = (FusedPlan.bytes_of(validate.nhd(c, kv_layout)) for c in (k_scale_cache, v_scale_cache))
    elif quant[1] == PER_TOKEN_HEAD:
        k_scale, v_scale = k_scale_cache, v_scale_cache
    k_cache, v_cache = validate.nhd(k_cache, kv_layout), validate.nhd(v_cache, kv_layout)
    n_slots = k_cache.shape[1] if cache_mode == CACHE_CONTIGUOUS else k_cache.shape[0] * k_cache.shape[1]
    page_table = (batch_indices, kv_indices, kv_indptr) if cache_mode == CACHE_PAGE_TABLE else None
    return dict(q=to_bshd(q, layout), k=to_bshd(k, layout), cos=cos, sin=sin,
                positions=_spec(positions, pos_mode, cu_seqlens, position_offset, max_seqlen, layout),
                rotary_dim=rotary_dim, interleaved=interleaved, cos_per_token=per_token,
                out_q=to_bshd(FusedPlan.bytes_of(out_q), layout), out_k=to_bshd(out_k, layout), v=to_bshd(v, layout),
                k_cache=FusedPlan.bytes_of(k_cache), v_cache=FusedPlan.bytes_of(v_cache), cache_mode=cache_mode,
                slots=slots, page_table=page_table, block_size=k_cache.shape[1], cache_len=n_slots, k_scale=k_scale,
                v_scale=v_scale, quant=quant, k_global=k_global, v_global=v_global,
                q_format=quant_codes(out_q.dtype if out_q is not None else None)[0], q_scale=q_scale,
                q_weight=q_weight, k_weight=k_weight, eps=eps, weight_offset=weight_offset, norm=norm,
                norm_over_heads=norm_over_heads, inv_freq=inv_freq, angle_scale=angle_scale,
                nope=(nope_floor_scale, nope_attn_scale) if nope_floor_scale > 0 else None, v_quant=v_quant)


def ds_mla_views(kv_cache: torch.Tensor, latent: int, rope_dim: int, dtype: torch.dtype) -> tuple:
    """DeepSeek's fp8_ds_mla entry (vLLM's, what FlashMLA's sparse attention reads), a ``torch.uint8`` cache
    ``(num_blocks, block_size, entry)``, as the fused kernel writes it: ``(k_cache, v_cache, v_scale_cache)``, the
    rotated k_pe's ``rope_dim`` values in ``dtype`` at byte ``latent + 4 * tiles``, the latent's e4m3 bytes at byte 0
    and its ``tiles = latent / TILE_CHANNELS`` float32 scales at byte ``latent``, each ``(num_blocks, block_size, 1,
    width)`` (one head). The validation has checked the entry's size and its alignment."""
    tiles = latent // TILE_CHANNELS
    at = latent + 4 * tiles
    k_cache = kv_cache[..., at:at + rope_dim * dtype.itemsize].view(dtype)
    v_cache = kv_cache[..., :latent].view(torch.float8_e4m3fn)
    v_scale_cache = kv_cache[..., latent:at].view(torch.float32)
    return tuple(c[:, :, None] for c in (k_cache, v_cache, v_scale_cache))


_FORMATS = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2, torch.int8: INT8, torch.uint8: NVFP4}


def quant_codes(dtype, *, per_head: bool = False, per_token_head: bool = False) -> tuple:
    """What a store of ``dtype`` writes, as the fused kernel's quantising store reads it: ``(format, scales)``, the
    codes of :mod:`ropekit.triton.fused_tiles` (:func:`~ropekit.triton.fused.plan_fused`'s ``quant``, and the format
    fields of the launch choice's :class:`~ropekit.triton.configs.FusedShape`). ``dtype``: a validated cache's (a
    ``torch.uint8`` one is NVFP4's: :func:`validate.fp8_bytes` views every other format's bytes) or a float8 q
    output's; the model's own dtypes and None are PLAIN. The scales: NVFP4's per 16-block; otherwise per (token, head)
    when computed on write into scale caches (``per_token_head``), per kv head when static and one a head
    (``per_head``), per tensor else (PLAIN: per tensor, never read)."""
    fmt = _FORMATS.get(dtype, PLAIN)
    if fmt in (PLAIN, NVFP4):
        return fmt, PER_BLOCK if fmt == NVFP4 else PER_TENSOR
    return fmt, PER_TOKEN_HEAD if per_token_head else PER_HEAD if per_head else PER_TENSOR


def launch_cache(q, k, v, out_q, out_k, k_cache, v_cache, *args) -> None:
    """One launch on validated arguments (:func:`_kernel_arguments`'). ``q``/``k`` None: read the rotary inputs from
    ``out_q``/``out_k`` (in place; the way the mutating custom op is called, so that no input aliases a mutated
    argument)."""
    q = out_q if q is None else q
    k = out_k if k is None else k
    fused_launch(_kernel_arguments(q, k, v, out_q, out_k, k_cache, v_cache, *args))


_OP = "ropekit::rope_and_cache"


@torch.library.custom_op(_OP, mutates_args=("out_q", "out_k", "k_cache", "v_cache", "k_scale_cache", "v_scale_cache"))
def _rope_and_cache_op(q: Optional[torch.Tensor], k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                       out_q: Optional[torch.Tensor], out_k: Optional[torch.Tensor], k_cache: torch.Tensor,
                       v_cache: Optional[torch.Tensor], slots: torch.Tensor, cache_mode: int,
                       batch_indices: Optional[torch.Tensor], kv_indices: Optional[torch.Tensor],
                       kv_indptr: Optional[torch.Tensor], kv_layout: str, cos: Optional[torch.Tensor],
                       sin: Optional[torch.Tensor], positions: Optional[torch.Tensor], pos_mode: int,
                       cu_seqlens: Optional[torch.Tensor], position_offset: int, max_seqlen: int, rotary_dim: int,
                       layout: str, interleaved: bool, per_token: bool, k_scale: Optional[torch.Tensor],
                       v_scale: Optional[torch.Tensor], q_weight: Optional[torch.Tensor],
                       k_weight: Optional[torch.Tensor], eps: float, weight_offset: float,
                       k_scale_cache: Optional[torch.Tensor], v_scale_cache: Optional[torch.Tensor],
                       q_scale: Optional[torch.Tensor], norm: Optional[int], norm_over_heads: bool,
                       inv_freq: Optional[torch.Tensor], angle_scale: float, nope_floor_scale: int,
                       nope_attn_scale: float) -> None:
    # (no defaults: a mutated argument left at its default is dropped from the boxed call, and torch 2.11's
    # in-place bookkeeping then indexes past the arguments)
    launch_cache(q, k, v, out_q, out_k, k_cache, v_cache, slots, cache_mode, batch_indices, kv_indices, kv_indptr,
                 kv_layout, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim,
                 layout, interleaved, per_token, k_scale, v_scale, q_weight, k_weight, eps, weight_offset,
                 k_scale_cache, v_scale_cache, q_scale, norm, norm_over_heads, inv_freq, angle_scale, nope_floor_scale,
                 nope_attn_scale)


@_rope_and_cache_op.register_fake
def _rope_and_cache_fake(*args):
    return None


# the launcher and the custom op take the launch's fields in CacheLaunch's order, after the seven tensors
for _parameters in (tuple(inspect.signature(_kernel_arguments).parameters), schema_names(_OP)):
    assert _parameters[7:7 + len(CacheLaunch._fields)] == CacheLaunch._fields, _parameters


def run_cache_op(q, k, v, out_q, out_k, k_cache, v_cache, *args, k_scale_cache=None, v_scale_cache=None,
                 q_scale=None, norm=None, norm_over_heads=False, inv_freq=None, angle_scale=1.0, nope=None) -> None:
    """The launch through the custom op when compiling, directly otherwise (no dispatcher on a decode step's host
    path); in place (``out_q is q``) under torch.compile the op writes fresh outputs that the graph copies back.
    ``k_scale_cache``, ``v_scale_cache``: per-(token, head) scales, written; ``q_scale``: a float8 ``out_q``'s scale;
    ``norm``: the norm's place (None: before the rotation when weights are given); ``norm_over_heads``: its extent;
    ``inv_freq``, ``angle_scale``: the angles without a table; ``nope``: a NoPE layer's ``(floor_scale,
    attn_scale)``."""
    in_place = out_q is q
    scale_caches = (k_scale_cache, v_scale_cache)
    nope = nope or (0, 0.0)
    if torch.compiler.is_compiling():
        # in place in a compiled graph the op writes fresh outputs and the graph copies them back (inductor on a GPU
        # lost the op's own writes into views of the graph's inputs taken inside it, mla_rope_and_cache's)
        written = (new_output(q), None if out_k is None else new_output(out_k)) if in_place else (out_q, out_k)
        _rope_and_cache_op(q, k, v, *written, k_cache, v_cache, *args, *scale_caches, q_scale, norm, norm_over_heads,
                           inv_freq, float(angle_scale), nope[0], float(nope[1]))
        if in_place:
            for out, fresh in zip((out_q, out_k), written):
                if out is not None:
                    out.copy_(fresh)
        return
    launch_cache(q, k, v, out_q, out_k, k_cache, v_cache, *args, *scale_caches, q_scale, norm, norm_over_heads,
                 inv_freq, angle_scale, *nope)
    bump_versions(k_cache, v_cache, *scale_caches, *((q, out_k) if in_place else ()))


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor], cos: Optional[torch.Tensor] = None,
                   sin: Optional[torch.Tensor] = None, *, k_cache, v_cache: Optional[torch.Tensor] = None,
                   slot_mapping: Optional[torch.Tensor] = None, cache_offsets=None,
                   kv_indices: Optional[torch.Tensor] = None, kv_indptr: Optional[torch.Tensor] = None,
                   batch_indices: Optional[torch.Tensor] = None, cache_positions: Optional[torch.Tensor] = None,
                   kv_layout: str = "NHD", k_scale: Optional[torch.Tensor] = None,
                   v_scale: Optional[torch.Tensor] = None, q_weight: Optional[torch.Tensor] = None,
                   k_weight: Optional[torch.Tensor] = None, eps: float = 1e-6, weight_offset: float = 0.0,
                   norm: Optional[str] = None, norm_over: str = "head", table=None,
                   positions=None, layout: str = "bshd", interleaved: bool = False, rotary_dim: Optional[int] = None,
                   inplace: bool = False, cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                   per_token: bool = False, write_k: bool = False, kv_cache_dtype: str = "auto",
                   k_scale_cache: Optional[torch.Tensor] = None, v_scale_cache: Optional[torch.Tensor] = None,
                   q_dtype: Optional[torch.dtype] = None, q_scale: Optional[torch.Tensor] = None,
                   inv_freq: Optional[torch.Tensor] = None, scale: float = 1.0, mrope_section=None,
                   mrope_interleaved: bool = False, nope_temperature=None):
    """Rotate q and k and write rotated k and v into a KV cache, in one launch. Returns ``(q_out, k_out)``.

    Args:
        q, k, cos, sin, table, positions, layout, interleaved, rotary_dim, cu_seqlens, max_seqlen, per_token: as
            :func:`ropekit.apply_rope` (q, k and v may be strided slices of a packed qkv projection).
        inv_freq, scale, mrope_section, mrope_interleaved: as :func:`ropekit.apply_rope`: the angles computed in the
            kernel from the inverse frequencies (no table: cos, sin and table None), and M-RoPE's sections, each
            pair turned at its own axis' position from ``(3, batch, seq)`` (``(3, tokens)`` for thd) positions.
        nope_temperature: ``(floor_scale, attn_scale)``: a Llama 4 NoPE layer, as :func:`ropekit.apply_rope` takes
            it (no cos/sin, table= or inv_freq=; no norm): nothing rotates, every channel of q is multiplied by its
            token's temperature ``log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1``, and k and v go
            into the cache as they are (k's output, with ``write_k``, is k's values).
        v: k-shaped values (their head size may differ from k's), copied into ``v_cache`` untouched; or None.
        k_cache, v_cache: paged ``(num_blocks, block_size, Hkv, D)`` with ``slot_mapping`` or the page table, or
            contiguous ``(batch, max_seq, Hkv, D)`` (``(n_seqs, ...)`` for thd) with ``cache_offsets``; with
            ``kv_layout="HND"`` the head axis comes second, ``(num_blocks, Hkv, block_size, D)``. q's dtype, or
            quantised (both alike): ``torch.float8_e4m3fn``, ``torch.float8_e5m2`` or ``torch.int8``, stored =
            x / scale rounded to the format (saturating); a ``torch.uint8`` cache is read as float8 bytes (e5m2
            with ``kv_cache_dtype="fp8_e5m2"``, e4m3 otherwise). ``k_cache`` may also be FlashInfer's
            ``paged_kv_cache``: a ``(k_cache, v_cache)`` tuple, or one 5-D tensor ``(num_blocks, 2, ...)`` whose
            ``[:, 0]`` is the k cache and ``[:, 1]`` the v cache.
        k_scale, v_scale: with a quantised cache and no scale caches, float32 tensors of one element or of one a kv
            head ``(Hkv,)``; otherwise accepted and unread (engines pass their scales whatever the cache holds).
        k_scale_cache, v_scale_cache: per-(token, head) scales, computed on write (``max|x| / format max`` over each
            rotated head vector, floored at the smallest normal float32) and stored as float32 at the token's slot:
            the caches' shape without the channels in NHD order, ``(num_blocks, block_size, Hkv)``, any strides.
        kv_cache_dtype: vLLM's name of the cache's format: ``"auto"`` (the cache's dtype says), ``"float16"``,
            ``"bfloat16"``, ``"fp8"``/``"fp8_e4m3"``, ``"fp8_e5m2"``, ``"fp8_per_token_head"``,
            ``"int8_per_token_head"`` (the last two need the scale caches).
        q_dtype, q_scale: a float8 q output for float8 attention (``torch.float8_e4m3fn`` or
            ``torch.float8_e5m2``, out of place): ``q_out = float8(rotated q / q_scale)``, saturating, with
            ``q_scale`` a float32 one-element tensor (the attention's q descale). None: q's dtype.
        slot_mapping: int64 ``(tokens,)``, token ``b * seq + s`` (the packed row for thd) goes to slot
            ``block * block_size + row``; -1 writes nothing. A shorter mapping covers the first tokens (the rest, an
            engine's CUDA-graph padding, are rotated and not cached).
        cache_offsets: an int or ``(n_seqs,)`` tensor: token ``s`` of sequence ``b`` goes to row ``offsets[b] + s``.
        kv_indices, kv_indptr, batch_indices, cache_positions: FlashInfer's page table (int32 or int64): token
            ``t`` goes to row ``p % block_size`` of block ``kv_indices[kv_indptr[b] + p // block_size]``, with
            ``b = batch_indices[t]`` (-1 writes nothing) and ``p = cache_positions[t]`` (FlashInfer's
            ``positions``, from ``get_batch_indices_positions``); a position past the request's pages writes nothing.
        kv_layout: ``"NHD"`` or ``"HND"``, where the caches' head axis lies (FlashInfer's names).
        q_weight, k_weight, eps, weight_offset, norm: QK-norm, as :func:`ropekit.qk_norm_rope` (both weights, or
            neither). ``norm`` None: before the rotation when weights are given, else none; ``"before"`` or
            ``"after"``: that norm, with weights or weightless (Llama 4: the cache receives the rotated, then
            normalised k).
        norm_over: the norm's extent, as :func:`ropekit.qk_norm_rope`'s: ``"head"`` (each head vector; Qwen3, Gemma
            3, Llama 4) or ``"heads"`` (all heads of q, and of k, together; OLMo-2, the video diffusion
            transformers), with ``(heads * head_dim,)`` weights; only with a norm.
        inplace: q (and k when ``write_k``) are rotated where they lie; otherwise into new tensors.
        write_k: also return the rotated k (the cache always receives it); default None, which saves k's write.

    Raises ``TypeError``/``ValueError`` naming the argument before anything is written (cache and inputs unchanged).
    """
    if not isinstance(k_cache, torch.Tensor) or k_cache.ndim == 5:
        k_cache, v_cache = validate.paged_kv_cache(k_cache, v_cache)
    user = (q, k, v, cos, sin, positions, cu_seqlens, k_cache, v_cache, slot_mapping, cache_offsets, k_scale,
            v_scale, q_weight, k_weight, kv_indices, kv_indptr, batch_indices, cache_positions, k_scale_cache,
            v_scale_cache, q_scale, inv_freq)
    key = at = None
    angles = angle_flags(scale, mrope_section, mrope_interleaved, nope_temperature)
    if table is None and (positions is None or isinstance(positions, torch.Tensor)) and \
            not isinstance(cache_offsets, int) and (layout != "thd" or max_seqlen is not None) and \
            angles is not None and planned(user):
        # (a table may grow, an int offset is checked against it and cu_seqlens without max_seqlen are read: calls
        # whose validation reads more than the signature are not planned)
        key, at = keyed("rope_and_cache", user, (eps, weight_offset, norm, norm_over, layout, interleaved, rotary_dim,
                                                 inplace, max_seqlen, per_token, write_k, kv_layout, kv_cache_dtype,
                                                 q_dtype) + angles)
        plan = plans.find(key)
        if plan is not None:  # a call signature validated before: where the tensors lie, then the launch
            return _run_plan(plan, user, inplace, write_k, q_dtype, at=plan.check(_read_scales(user, plan.fp8), at))
    nvfp4 = kv_cache_dtype == "nvfp4"
    k_cache = validate.fp8_bytes(k_cache, kv_cache_dtype)
    v_cache = validate.fp8_bytes(v_cache, kv_cache_dtype)
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor (it is written to the cache), got {type(k).__name__}")
    user_cos, user_sin = cos, sin
    nope = validate.nope_switch(q, nope_temperature, per_token, mrope_section)
    cos, sin, spec, rotary_dim = validate.rotary_arguments(q, k, cos, sin, table, positions, layout, rotary_dim,
                                                           cu_seqlens, max_seqlen, per_token, interleaved, inv_freq,
                                                           scale, mrope_section, mrope_interleaved, nope)
    # the norm: before the rotation with weights (norm=None), or where ``norm`` says, with weights or without
    place = validate.check_norm_place(norm) if norm is not None else None
    normed = place is not None or q_weight is not None or k_weight is not None
    if nope is not None and normed:
        raise ValueError("nope_temperature: a NoPE layer has no QK-norm (Llama 4 normalises its RoPE layers' q and "
                         "k only); pass no q_weight, k_weight or norm")
    over_heads = validate.check_norm_over(norm_over)
    if over_heads and not normed:
        raise ValueError("norm_over='heads' is the QK-norm's extent, but this call has no norm: pass q_weight and "
                         "k_weight, or norm='before' or 'after'")
    # (without a norm, eps and weight_offset are checked and not read: an argument is valid or refused whatever
    # the others are)
    eps, weight_offset = validate.check_norm(q, k, q_weight, k_weight, eps, weight_offset, weightless=True,
                                             over_heads=over_heads, layout=layout)
    if not normed:
        eps, weight_offset = 0.0, 0.0
    slots, cache_mode = validate.cache_arguments(q, k, v, k_cache, v_cache, slot_mapping, cache_offsets,
                                                 (kv_indices, kv_indptr, batch_indices, cache_positions),
                                                 validate.check_kv_layout(kv_layout), k_scale, v_scale, spec, layout,
                                                 kv_cache_dtype, k_scale_cache, v_scale_cache, rotary_dim,
                                                 interleaved)
    q_dtype = validate.check_q_output(q, q_dtype, q_scale, inplace)
    validate.check_no_grad("rope_and_cache", _NAMES, user)
    # the scales are read with a quantised cache and no scale caches, and with NVFP4 (the global ones); the scale
    # caches are written
    fp8 = (k_cache.dtype in validate.QUANT_DTYPES and k_scale_cache is None) or nvfp4
    written = ("k_cache", "v_cache", "k_scale_cache", "v_scale_cache") + (
        (("q", "k") if write_k else ("q",)) if inplace else ())
    plan = FusedPlan(None, _NAMES, written, fp8)
    # the caller's tensors, as a planned call checks them (a table the validation derived from cos/sin is a view of
    # them or a fresh copy); with table= the table's own cos/sin
    if table is None:
        plan.check(_read_scales(user, fp8), at)
    else:
        validate.check_overlaps(tuple("table" if name in ("cos", "sin") else name for name in _NAMES),
                                _read_scales(_replaced(user, cos=cos, sin=sin), fp8), written)
    launch = CacheLaunch(slots=slots, cache_mode=cache_mode, batch_indices=batch_indices, kv_indices=kv_indices,
                         kv_indptr=kv_indptr, kv_layout=kv_layout, cos=cos, sin=sin, **position_fields(spec),
                         rotary_dim=rotary_dim, layout=layout, interleaved=interleaved, per_token=per_token,
                         k_scale=k_scale, v_scale=v_scale, q_weight=q_weight, k_weight=k_weight, eps=eps,
                         weight_offset=weight_offset)
    out_q = q if inplace else _new_q(q, q_dtype)
    out_k = (k if inplace else new_output(k)) if write_k else None
    derived = (cos, sin, spec.tensor, spec.cu_seqlens, slots)
    given = (user_cos, user_sin, positions, cu_seqlens, _slots(slot_mapping, cache_offsets, cache_positions))
    if key is not None and not q.is_meta and reads_callers_memory(derived, given):
        # planned only when the launch reads the caller's own tensors (not grown tables, copies or derived views)
        plan.launch = released(plan_fused(**_kernel_arguments(q, k, v, out_q, out_k, k_cache, v_cache, *launch,
                                                              k_scale_cache, v_scale_cache, q_scale, place,
                                                              over_heads, inv_freq, scale, *(nope or (0, 0.0)))))
        plans.put(key, plan)
        return _run_plan(plan, user, inplace, write_k, q_dtype, out_q, out_k)
    if not q.is_meta:
        run_cache_op(q, k, v, out_q, out_k, k_cache, v_cache, *launch, k_scale_cache=k_scale_cache,
                     v_scale_cache=v_scale_cache, q_scale=q_scale, norm=place, norm_over_heads=over_heads,
                     inv_freq=inv_freq, angle_scale=scale, nope=nope)
    return out_q, out_k


def _new_q(q, q_dtype):
    """q's output: in q's dtype, or a float8 one (``q_dtype``)."""
    return new_output(q) if q_dtype is None else torch.empty(q.shape, dtype=q_dtype, device=q.device)


# the names of rope_and_cache's tensors, in the order the call lists them (the page table, then the quantised
# stores' scale caches and q's scale, and the inverse frequencies)
_NAMES = ("q", "k", "v", "cos", "sin", "positions", "cu_seqlens", "k_cache", "v_cache", "slot_mapping",
          "cache_offsets", "k_scale", "v_scale", "q_weight", "k_weight", "kv_indices", "kv_indptr", "batch_indices",
          "cache_positions", "k_scale_cache", "v_scale_cache", "q_scale", "inv_freq")


def _replaced(tensors: tuple, **by_name) -> tuple:
    """The call's tensors (``_NAMES``' order) with those named in ``by_name`` replaced."""
    return tuple(by_name.get(name, tensor) for name, tensor in zip(_NAMES, tensors))


def _slots(slot_mapping, cache_offsets, cache_positions):
    """The tensor the kernel reads as SLOTS: the slot mapping, the contiguous cache's offsets or the page table's
    positions, whichever the call gives."""
    return slot_mapping if slot_mapping is not None else cache_offsets if cache_offsets is not None else \
        cache_positions


def _read_scales(tensors: tuple, fp8: bool) -> tuple:
    """The call's tensors (``_NAMES``) as the overlap rule sees them: ``k_scale`` and ``v_scale`` are read with a
    quantised cache and no scale caches only, and blanked otherwise (found by name: a cached call pays no more than a
    slice)."""
    if fp8 or (tensors[_K_SCALE_AT] is None and tensors[_V_SCALE_AT] is None):
        return tensors
    seen = list(tensors)
    seen[_K_SCALE_AT] = seen[_V_SCALE_AT] = None
    return tuple(seen)


_K_SCALE_AT, _V_SCALE_AT = _NAMES.index("k_scale"), _NAMES.index("v_scale")


def _run_plan(plan, user, inplace, write_k, q_dtype, out_q=None, out_k=None, at=None):
    """A planned call: its outputs and its launch, on the caller's own tensors (the kernel's views of them have the
    same data pointers). ``at``: the addresses of the call's tensors (``FusedPlan.check``), under which the plan
    keeps its launch (``FusedPlan.relaunch``); None: not kept."""
    q, k, v, cos, sin, positions, cu_seqlens, k_cache, v_cache, slot_mapping, cache_offsets, k_scale, v_scale, \
        q_weight, k_weight, kv_indices, kv_indptr, batch_indices, cache_positions, k_scale_cache, v_scale_cache, \
        q_scale, inv_freq = user
    if out_q is None:
        out_q = q if inplace else _new_q(q, q_dtype)
        out_k = (k if inplace else new_output(k)) if write_k else None
    if not inplace:  # the fresh outputs' addresses too
        at = with_outputs(at, out_q, out_k)
    if plan.launch is not None and not plan.relaunch(at):
        k_global = v_global = None
        if k_scale_cache is not None:  # the scale caches in the scales' place, written (NVFP4: the scales are global)
            if plan.fp8:
                k_global, v_global = k_scale, v_scale
            k_scale, v_scale = k_scale_cache, v_scale_cache
        elif not plan.fp8:
            k_scale = v_scale = None
        # (a float8 cache or q output as it is: the launch reads its address, and its plan reads it as bytes)
        plan.launch_at(at, q, k, out_q, out_k, v, k_cache, v_cache, k_scale, v_scale,
                       _slots(slot_mapping, cache_offsets, cache_positions), batch_indices, kv_indices, kv_indptr,
                       q_weight, k_weight, cos if inv_freq is None else inv_freq, sin, positions,
                       cu_seqlens, 0, q_scale, k_global, v_global)
    bump_versions(k_cache, v_cache, k_scale_cache, v_scale_cache, *((q, out_k) if inplace else ()))
    return out_q, out_k
