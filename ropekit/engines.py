"""The serving engines' in-place RoPE signature, so that an engine can swap ropekit in.

vLLM's ``rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`` and FlashInfer's
``apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True)`` share one
contract, implemented here on top of :func:`ropekit.apply_rope` (one launch for q and k, no copies):

* ``positions``: ``(tokens,)`` int32/int64, the position of each packed token (``(batch, seq)`` is accepted and read
  as ``batch * seq`` tokens);
* ``query``: ``(tokens, heads * head_size)`` or ``(tokens, heads, head_size)`` (``(batch, seq, ...)`` likewise);
  rows may be strided, e.g. the q slice of a packed qkv projection; ``key`` the same with its own head count, or None;
* ``cos_sin_cache``: ``(max_position, rotary_dim)``; columns ``[0, rotary_dim/2)`` hold cos, the rest sin, in float32
  (FlashInfer) or the model's dtype (vLLM). ``rotary_dim <= head_size``: channels past it are left as they are;
* ``is_neox``: True pairs channel ``i`` with ``i + rotary_dim/2`` (NeoX), False pairs ``2i`` with ``2i + 1`` (GPT-J);
* in place: ``query`` and ``key`` are rotated where they lie; nothing is returned.

A position outside the cache is never read; its token's rotated channels come out as NaN (the engines leave that
case undefined). Errors are ``TypeError``/``ValueError`` naming the argument, raised before anything is written.

SGLang's form of the FlashInfer call adds ``fused_set_kv_buffer_arg`` (and ``enable_pdl``, a launch hint that
ropekit takes from the device instead: docs/tuning.md#grid-dependency): besides rotating ``query`` and ``key`` in
place, the same launch writes the rotated key into ``k_buffer[cache_loc]`` and ``value`` untouched into
``v_buffer[cache_loc]`` (token-indexed pools
``(slots, heads * head_size)`` or ``(slots, heads, head_size)``; ``cache_loc`` int64, one slot a token; -1 skips, which
is ropekit's extension: SGLang writes every slot). It is :func:`ropekit.rope_and_cache` on a paged cache of one slot
a block.

FlashInfer's ``rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
quant_scale_q, quant_scale_kv, ...)`` rotates ``q_rope`` and ``k_rope`` and returns all four parts as float8 for
float8 attention: the rotary parts in one launch of the fused kernel (q's float8 output, k written as a cache of one
slot a token), the non-rotary ones by PyTorch's cast. ``rope_quantize_fp8_append_paged_kv_cache`` does the same
and appends k (and v) to a float8 paged cache through FlashInfer's page table, in the fused kernel: one launch (two
when k has a non-rotary part).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional

import torch

from .api import apply_rope
from .fused.kv_cache import rope_and_cache
from .validate import as_integer, check_overlaps, in_callers_names

__all__ = ["rotary_embedding", "apply_rope_with_cos_sin_cache_inplace", "FusedSetKVBufferArg", "rope_quantize_fp8",
           "rope_quantize_fp8_append_paged_kv_cache"]


@dataclass(kw_only=True)
class FusedSetKVBufferArg:
    """SGLang's cache write fused into the rotation: ``value`` ``(tokens, heads * head_size)`` (or 3-D) goes to
    ``v_buffer[cache_loc]`` and the rotated key to ``k_buffer[cache_loc]``. Keyword-only: SGLang's own classes order
    the fields differently. ``k_scale``/``v_scale``: None (what sgl_kernel requires; 1.0 is accepted as the same),
    the buffers holding the model's dtype."""

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    cache_loc: torch.Tensor
    k_scale: Optional[float] = None
    v_scale: Optional[float] = None


def _heads_view(name: str, x, tokens: int, head_size: int, token_dims: tuple) -> torch.Tensor:
    """``x`` as a ``(1, tokens, heads, head_size)`` view (no copy)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape[:len(token_dims)]) != token_dims:
        raise ValueError(f"{name} must start with the positions' shape {token_dims}, got {tuple(x.shape)}")
    rest = x.shape[len(token_dims):]
    if len(rest) == 1:
        if rest[0] % head_size:
            raise ValueError(f"{name}'s last dimension ({rest[0]}) must be a multiple of head_size ({head_size})")
        if x.stride(-1) != 1 and rest[0] > 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1) to be split into heads, "
                             f"got stride {x.stride(-1)}")
        x = x.unflatten(-1, (rest[0] // head_size, head_size))
    elif len(rest) != 2 or rest[1] != head_size:
        raise ValueError(f"{name} must be (tokens, heads * head_size) or (tokens, heads, head_size) with head_size "
                         f"{head_size}, got {tuple(x.shape)}")
    if len(token_dims) == 1:
        return x.unsqueeze(0)
    try:
        return x.view(1, tokens, *x.shape[-2:])  # a view, never a copy: the call writes in place
    except RuntimeError:
        raise ValueError(f"{name}'s (batch, seq) dimensions must merge into one token dimension without a copy, "
                         f"got strides {x.stride()}; pass (tokens, ...) views") from None


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor], head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool = True, rope_dim_offset: int = 0,
                     inverse: bool = False) -> None:
    """Rotate ``query`` and ``key`` in place (vLLM's ``rotary_embedding`` contract; see the module docstring).

    ``rope_dim_offset``: the rotated channels of each head are ``[rope_dim_offset, rope_dim_offset + rotary_dim)``
    (vLLM passes ``head_size - rotary_dim`` to rotate the last channels); the others are left as they are.
    ``inverse``: rotate by -θ, undoing a rotation at the same positions.
    """
    _rotate("rotary_embedding", positions, query, key, head_size, cos_sin_cache, is_neox, None, rope_dim_offset,
            inverse)


def _head_size(head_size) -> int:
    size = as_integer(head_size)
    if size is None or size <= 0:
        raise TypeError(f"head_size must be a positive int, got {head_size!r}")
    return size


def _rotate(caller: str, positions, query, key, head_size, cos_sin_cache, is_neox, kv_write, rope_dim_offset=0,
            inverse=False) -> None:
    head_size = _head_size(head_size)
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"positions must be an int32 or int64 tensor, got "
                        f"{getattr(positions, 'dtype', type(positions).__name__)}")
    if positions.ndim not in (1, 2):
        raise ValueError(f"positions must be (tokens,) or (batch, seq), got shape {tuple(positions.shape)}")
    if not isinstance(cos_sin_cache, torch.Tensor) or not cos_sin_cache.is_floating_point():
        raise TypeError("cos_sin_cache must be a floating-point tensor (max_position, rotary_dim)")
    if cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] % 2 or cos_sin_cache.shape[1] == 0:
        raise ValueError(f"cos_sin_cache must be (max_position, rotary_dim) with an even rotary_dim, got shape "
                         f"{tuple(cos_sin_cache.shape)}")
    rotary_dim = cos_sin_cache.shape[1]
    offset = as_integer(rope_dim_offset)
    if offset is None:
        raise TypeError(f"rope_dim_offset must be an int, got {rope_dim_offset!r}")
    if offset < 0:
        raise ValueError(f"rope_dim_offset must be >= 0, got {offset}")
    rope_dim_offset = offset
    if rope_dim_offset + rotary_dim > head_size:
        raise ValueError(f"rope_dim_offset + cos_sin_cache's rotary_dim ({rope_dim_offset} + {rotary_dim}) must be "
                         f"<= head_size ({head_size})")
    token_dims = tuple(positions.shape)
    tokens = positions.numel()
    q = _heads_view("query", query, tokens, head_size, token_dims)
    k = None if key is None else _heads_view("key", key, tokens, head_size, token_dims)
    if rope_dim_offset:  # the rotation sees only the channels from the offset: the whole heads are checked here
        check_overlaps(("query", "key"), (q, k), ("query", "key"))
    q, k = q[..., rope_dim_offset:], (None if k is None else k[..., rope_dim_offset:])
    # cos and sin: the two column halves of one buffer (same strides, so the kernel reads them without a copy)
    cos, sin = cos_sin_cache[:, :rotary_dim // 2], cos_sin_cache[:, rotary_dim // 2:]
    rotary = dict(positions=positions.reshape(1, tokens), layout="bshd", interleaved=not is_neox,
                  rotary_dim=rotary_dim, inplace=True)
    if inverse:  # (only rotary_embedding passes it)
        rotary["conjugate"] = True
    if kv_write is not None and k is None:
        raise ValueError("key must be given with fused_set_kv_buffer_arg (its rotated rows are cached)")
    # the rotation names its own arguments; the message adds which of this call's they are
    cache_words = ("" if kv_write is None else "; v, k_cache, v_cache and slot_mapping are "
                   "fused_set_kv_buffer_arg's value, k_buffer, v_buffer and cache_loc")
    with in_callers_names(caller, "q is query, k is key, cos/sin (the table) are the two halves of "
                          f"cos_sin_cache{cache_words}"):
        if kv_write is None:
            apply_rope(q, k, cos, sin, **rotary)
        else:
            value, k_buffer, v_buffer, cache_loc = kv_write
            v = _heads_view("fused_set_kv_buffer_arg.value", value, tokens, head_size, token_dims)
            rope_and_cache(q, k, v, cos, sin, k_cache=k_buffer, v_cache=v_buffer, slot_mapping=cache_loc,
                           write_k=True, **rotary)


def _pool_view(name: str, buffer, head_size: int) -> torch.Tensor:
    """A token-indexed pool ``(slots, heads * head_size)`` or ``(slots, heads, head_size)`` as a paged cache of one
    slot a block, ``(slots, 1, heads, head_size)`` (a view)."""
    if not isinstance(buffer, torch.Tensor) or buffer.ndim not in (2, 3):
        raise ValueError(f"fused_set_kv_buffer_arg.{name} must be (slots, heads * head_size) or (slots, heads, "
                         f"head_size), got {getattr(buffer, 'shape', type(buffer).__name__)}")
    if buffer.ndim == 2:
        if buffer.shape[1] % head_size or buffer.stride(-1) != 1:
            raise ValueError(f"fused_set_kv_buffer_arg.{name}'s rows must hold whole contiguous heads of head_size "
                             f"{head_size}, got shape {tuple(buffer.shape)}, strides {buffer.stride()}")
        buffer = buffer.unflatten(1, (buffer.shape[1] // head_size, head_size))
    return buffer.unsqueeze(1)


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                                          head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True,
                                          fused_set_kv_buffer_arg=None, enable_pdl: Optional[bool] = None) -> None:
    """FlashInfer's name for the same contract as :func:`rotary_embedding` (in place, returns None); SGLang's
    ``fused_set_kv_buffer_arg`` (a :class:`FusedSetKVBufferArg`, or SGLang's own) also writes the rotated key and the
    value into its pools in the same launch. ``enable_pdl`` is accepted; ropekit launches programmatically by default
    from compute capability 9.0 (``ROPEKIT_PDL=0`` turns it off: docs/tuning.md#grid-dependency)."""
    arg = fused_set_kv_buffer_arg
    if arg is None:
        _rotate("apply_rope_with_cos_sin_cache_inplace", positions, query, key, head_size, cos_sin_cache, is_neox,
                None)
        return
    for name in ("k_scale", "v_scale"):
        scale = getattr(arg, name, None)
        if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale == 1):
            raise ValueError(f"fused_set_kv_buffer_arg.{name} must be None (or 1.0: the pools hold the model's "
                             f"dtype), got {type(scale).__name__} {scale!r}"[:300])
    size = _head_size(head_size)
    _rotate("apply_rope_with_cos_sin_cache_inplace", positions, query, key, size, cos_sin_cache, is_neox,
            (arg.value, _pool_view("k_buffer", arg.k_buffer, size), _pool_view("v_buffer", arg.v_buffer, size),
             arg.cache_loc))


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _float8_of(x: torch.Tensor, quant_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x * quant_scale`` in float32, saturating at the format's largest value, as float8 ``dtype``."""
    largest = torch.finfo(dtype).max
    return (x.float() * quant_scale).clamp(-largest, largest).to(dtype)


def _check_quantise(q_rope, k_rope, quantize_dtype, outputs: tuple, quant_scale_q, quant_scale_kv) -> torch.dtype:
    """FlashInfer's float8 calls' shared arguments: ``quantize_dtype`` (None: the first given output's dtype, else
    e4m3; ``outputs`` as (name, tensor or None) pairs), the two scales (finite floats > 0), ``q_rope`` 3-D and
    ``k_rope`` 3-D or MLA's 2-D. Returns the dtype."""
    name = "quantize_dtype"
    if quantize_dtype is None:
        given = [(out_name, t.dtype) for out_name, t in outputs if isinstance(t, torch.Tensor)]
        if given:
            out_name, quantize_dtype = given[0]
            name = f"{out_name} (whose dtype is quantize_dtype's when quantize_dtype is None)"
        else:
            quantize_dtype = torch.float8_e4m3fn
    if quantize_dtype not in _FLOAT8:
        raise TypeError(f"{name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {quantize_dtype!r}")
    for name, scale in (("quant_scale_q", quant_scale_q), ("quant_scale_kv", quant_scale_kv)):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"{name} must be a finite float > 0, got {scale!r}"[:200])
    if not isinstance(q_rope, torch.Tensor) or q_rope.ndim != 3:
        raise ValueError(f"q_rope must be (tokens, heads, rope_dim), got {getattr(q_rope, 'shape', q_rope)}")
    if not isinstance(k_rope, torch.Tensor) or k_rope.ndim not in (2, 3):
        raise ValueError(f"k_rope must be (tokens, heads, rope_dim) or (tokens, rope_dim) (MLA), got "
                         f"{getattr(k_rope, 'shape', k_rope)}")
    return quantize_dtype


def _check_nope(name: str, nope, like: torch.Tensor) -> None:
    """A non-rotary part (``q_nope``, ``k_nope``): None, or ``like``'s tokens (and heads, for a 3-D ``like``) with
    channels of its own, in ``like``'s dtype and on its device. Checked before the launch: it is read after it."""
    if nope is None:
        return
    if not isinstance(nope, torch.Tensor):
        raise TypeError(f"{name} must be a tensor or None, got {type(nope).__name__}")
    if nope.ndim != like.ndim or nope.shape[:-1] != like.shape[:-1] or nope.dtype != like.dtype or \
            nope.device != like.device:
        want = "(tokens, heads, no_rope_dim)" if like.ndim == 3 else "(tokens, no_rope_dim)"
        raise ValueError(f"{name} must be {want} with the rotary part's tokens{' and heads' * (like.ndim == 3)} "
                         f"{tuple(like.shape[:-1])}, its dtype {like.dtype} and device {like.device}, got "
                         f"{tuple(nope.shape)} {nope.dtype} on {nope.device}")


def rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: Optional[torch.Tensor],
                      k_nope: Optional[torch.Tensor], cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor,
                      is_neox: bool = True, quantize_dtype: Optional[torch.dtype] = None, quant_scale_q: float = 1.0,
                      quant_scale_kv: float = 1.0, q_rope_out: Optional[torch.Tensor] = None,
                      k_rope_out: Optional[torch.Tensor] = None, q_nope_out: Optional[torch.Tensor] = None,
                      k_nope_out: Optional[torch.Tensor] = None, enable_pdl: bool = False):
    """FlashInfer's ``rope_quantize_fp8``: ``q_rope (tokens, Hq, rope_dim)`` and ``k_rope (tokens, Hkv, rope_dim)``
    (MLA: ``(tokens, rope_dim)``) rotated by ``cos_sin_cache`` rows at ``pos_ids``, then every part times its scale
    (``quant_scale_q`` for q, ``quant_scale_kv`` for k) as float8 ``quantize_dtype`` (None: the given outputs' dtype,
    else e4m3), saturating. Returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)`` (the given ones written, the
    others new; a missing nope part is an empty one). The rotary parts are rotated by the angles times the
    reciprocal of ``1 / quant_scale`` in float32 (docs/fused.md#quantise-on-write), which equals FlashInfer's product
    for power-of-two scales and may differ in the last place of the float32 value otherwise. ``enable_pdl`` is
    accepted; ropekit launches programmatically by default from compute capability 9.0 (``ROPEKIT_PDL=0`` turns it
    off: docs/tuning.md#grid-dependency)."""
    quantize_dtype = _check_quantise(q_rope, k_rope, quantize_dtype, (("q_rope_out", q_rope_out), ("k_rope_out",
                                     k_rope_out), ("q_nope_out", q_nope_out), ("k_nope_out", k_nope_out)),
                                     quant_scale_q, quant_scale_kv)
    _check_nope("q_nope", q_nope, q_rope)
    _check_nope("k_nope", k_nope, k_rope)
    # the given outputs are written after the launch (copies of its results): none may share memory with another
    # or with what the call reads
    check_overlaps(("q_rope", "k_rope", "q_nope", "k_nope", "cos_sin_cache", "pos_ids", "q_rope_out", "k_rope_out",
                    "q_nope_out", "k_nope_out"), (q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, q_rope_out,
                                                  k_rope_out, q_nope_out, k_nope_out),
                   ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"))
    for name, out, like in (("q_rope_out", q_rope_out, q_rope), ("k_rope_out", k_rope_out, k_rope),
                            ("q_nope_out", q_nope_out, q_nope), ("k_nope_out", k_nope_out, k_nope)):
        if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != quantize_dtype
                                or like is None or out.shape != like.shape):
            raise ValueError(f"{name} must be a {quantize_dtype} tensor of its input's shape, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    tokens, rope_dim = q_rope.shape[0], q_rope.shape[-1]
    k_heads = k_rope if k_rope.ndim == 3 else k_rope[:, None]
    k_out = k_rope_out if k_rope_out is not None else torch.empty(k_rope.shape, dtype=quantize_dtype,
                                                                  device=k_rope.device)
    # k is written as a paged cache of one slot a block, token t at slot t; q as the float8 output
    slots = torch.arange(tokens, device=q_rope.device)
    scales = [torch.full((1,), 1.0 / s, dtype=torch.float32, device=q_rope.device)
              for s in (quant_scale_q, quant_scale_kv)]
    cos, sin = _rope_halves(cos_sin_cache, pos_ids, tokens, rope_dim)
    with in_callers_names("rope_quantize_fp8", "q is q_rope, k is k_rope, k_cache is k_rope_out, cos/sin (the "
                          "table) are the two halves of cos_sin_cache, positions are pos_ids"):
        q_out, _ = rope_and_cache(q_rope[None], k_heads[None], None, cos, sin, k_cache=k_out.view(
                                  tokens, 1, *k_heads.shape[1:]), slot_mapping=slots, k_scale=scales[1],
                                  positions=pos_ids[None], interleaved=not is_neox, rotary_dim=rope_dim,
                                  q_dtype=quantize_dtype, q_scale=scales[0])
    if q_rope_out is not None:
        q_rope_out.copy_(q_out[0])
    else:
        q_rope_out = q_out[0]
    nope = []
    for x, out, scale, like in ((q_nope, q_nope_out, quant_scale_q, q_rope), (k_nope, k_nope_out, quant_scale_kv,
                                                                              k_rope)):
        if x is None:
            x = like.new_empty(*like.shape[:-1], 0)
        values = _float8_of(x, scale, quantize_dtype)
        nope.append(values if out is None else out.copy_(values))
    return q_rope_out, k_out, nope[0], nope[1]


def rope_quantize_fp8_append_paged_kv_cache(
        q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: Optional[torch.Tensor], k_nope: Optional[torch.Tensor],
        v: Optional[torch.Tensor], cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor, paged_kv_cache,
        kv_indices: torch.Tensor, kv_indptr: torch.Tensor, batch_indices: torch.Tensor, positions: torch.Tensor,
        is_neox: bool = True, quantize_dtype: Optional[torch.dtype] = None, quant_scale_q: float = 1.0,
        quant_scale_kv: float = 1.0, page_size: int = 16, kv_layout: str = "NHD",
        q_rope_out: Optional[torch.Tensor] = None, q_nope_out: Optional[torch.Tensor] = None,
        enable_pdl: bool = False):
    """FlashInfer's ``rope_quantize_fp8_append_paged_kv_cache``: q and k rotated as :func:`rope_quantize_fp8` does
    (``q_rope``, ``k_rope`` by ``cos_sin_cache`` rows at ``pos_ids``; every part times its scale as float8
    ``quantize_dtype``, saturating), q returned, k and v appended to a float8 paged cache through FlashInfer's page
    table (``kv_indices``, ``kv_indptr``; token ``t`` at position ``positions[t]`` of request ``batch_indices[t]``,
    -1 writing nothing), as :func:`ropekit.rope_and_cache` addresses it. Returns ``(q_rope_out, q_nope_out)``.

    * GQA/MHA (``k_rope`` ``(tokens, Hkv, rope_dim)``): ``paged_kv_cache = (k_cache, v_cache)``, each ``(pages,
      page_size, Hkv, head_dim)`` (``kv_layout="HND"``: ``(pages, Hkv, page_size, head_dim)``) of ``quantize_dtype``,
      ``head_dim = rope_dim + no_rope_dim``: channels ``[0, rope_dim)`` hold the rotated ``k_rope``, the rest
      ``k_nope``; ``v`` ``(tokens, Hkv, head_dim)`` goes to ``v_cache``.
    * MLA (``k_rope`` ``(tokens, rope_dim)``): ``paged_kv_cache = (ckv_cache, kpe_cache)``, ``(pages, page_size,
      no_rope_dim)`` and ``(pages, page_size, rope_dim)``: ``k_nope`` (the latent) and the rotated ``k_rope``; ``v``
      None; ``kv_layout`` is not read.

    k and v are stored as ``float8(x / (1 / quant_scale_kv))`` by the fused kernel's store (FlashInfer multiplies by
    the scale: the same float8 value for power-of-two scales, possibly one step apart at a rounding tie otherwise),
    q's rotary part likewise, q's non-rotary part by PyTorch's cast. One launch, or two when a GQA k has a non-rotary
    part (the second writes ``k_nope`` and the rotated ``k_rope`` again, the same bytes). ``page_size`` must be the
    caches' page size; ``enable_pdl`` is accepted; ropekit launches programmatically by default from
    compute capability 9.0 (``ROPEKIT_PDL=0`` turns it off: docs/tuning.md#grid-dependency)."""
    quantize_dtype = _check_quantise(q_rope, k_rope, quantize_dtype, (("q_rope_out", q_rope_out), ("q_nope_out",
                                     q_nope_out)), quant_scale_q, quant_scale_kv)
    mla = k_rope.ndim == 2
    _check_nope("q_nope", q_nope, q_rope)
    _check_nope("k_nope", k_nope, k_rope)  # (a GQA k_nope is read by a second launch: checked before the first)
    tokens, rope_dim = q_rope.shape[0], q_rope.shape[-1]
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2 or not all(
            isinstance(c, torch.Tensor) for c in paged_kv_cache):
        raise ValueError("paged_kv_cache must be a pair of tensors: (k_cache, v_cache), or (ckv_cache, kpe_cache) "
                         "for MLA")
    # q's outputs are written after the launch: neither may share memory with the other, the caches or what the call
    # reads
    check_overlaps(("q_rope", "k_rope", "q_nope", "k_nope", "v", "cos_sin_cache", "pos_ids", "kv_indices", "kv_indptr",
                    "batch_indices", "positions", "paged_kv_cache", "paged_kv_cache", "q_rope_out", "q_nope_out"),
                   (q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, kv_indices, kv_indptr, batch_indices,
                    positions, *paged_kv_cache, q_rope_out, q_nope_out), ("q_rope_out", "q_nope_out"))
    if any(c.dtype != quantize_dtype for c in paged_kv_cache):
        raise ValueError(f"paged_kv_cache must hold quantize_dtype {quantize_dtype}, got "
                         f"{[str(c.dtype) for c in paged_kv_cache]}")
    if mla != (v is None):
        raise ValueError("v must be None for MLA (a 2-D k_rope: k_nope is the latent) and a (tokens, heads, head_dim) "
                         "tensor otherwise")
    for name, out, like in (("q_rope_out", q_rope_out, q_rope), ("q_nope_out", q_nope_out, q_nope)):
        if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != quantize_dtype or like is None
                                or out.shape != like.shape):
            raise ValueError(f"{name} must be a {quantize_dtype} tensor of its input's shape, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    if as_integer(page_size) is None:
        raise TypeError(f"page_size must be an int, got {page_size!r}")
    if mla:
        ckv_cache, kpe_cache = paged_kv_cache
        if kpe_cache.ndim != 3 or ckv_cache.ndim != 3:
            raise ValueError(f"paged_kv_cache for MLA must be (ckv_cache, kpe_cache), 3-D each, got shapes "
                             f"{tuple(ckv_cache.shape)} and {tuple(kpe_cache.shape)}")
        rows, layout = kpe_cache.shape[1], "NHD"
        k_heads, nope = k_rope[:, None], (k_nope if k_nope is not None else k_rope.new_empty(tokens, 0))[:, None]
        k_cache, nope_cache, v_cache = kpe_cache[:, :, None], ckv_cache[:, :, None], None
    else:
        k_cache, v_cache = paged_kv_cache
        if k_cache.ndim != 4:
            raise ValueError(f"paged_kv_cache's k_cache must be 4-D (pages, page_size, heads, head_dim) or (pages, "
                             f"heads, page_size, head_dim) with kv_layout 'HND', got {tuple(k_cache.shape)}")
        layout = kv_layout
        rows = k_cache.shape[2 if kv_layout == "HND" else 1]
        no_rope = k_nope.shape[-1] if isinstance(k_nope, torch.Tensor) else 0
        if k_cache.shape[-1] != rope_dim + no_rope:
            raise ValueError(f"paged_kv_cache's k_cache must have head_dim rope_dim + no_rope_dim = {rope_dim} + "
                             f"{no_rope}, got shape {tuple(k_cache.shape)}")
        k_heads, nope = k_rope, k_nope if no_rope else None
        if nope is not None:  # (read by the second launch: checked before the first writes)
            check_overlaps(("k_nope", "paged_kv_cache", "paged_kv_cache"), (nope, *paged_kv_cache),
                           ("paged_kv_cache",))
        k_cache, nope_cache = k_cache[..., :rope_dim], k_cache[..., rope_dim:]
    if as_integer(page_size) != rows:
        raise ValueError(f"page_size must be the caches' page size {rows}, got {page_size}")
    cos, sin = _rope_halves(cos_sin_cache, pos_ids, tokens, rope_dim)
    kv_scale = torch.full((1,), 1.0 / quant_scale_kv, dtype=torch.float32, device=q_rope.device)
    table = dict(kv_indices=kv_indices, kv_indptr=kv_indptr, batch_indices=batch_indices, cache_positions=positions,
                 kv_layout=layout, positions=pos_ids[None], interleaved=not is_neox, rotary_dim=rope_dim,
                 k_scale=kv_scale, v_scale=kv_scale)
    names = ("q is q_rope, k is k_rope, k_cache is paged_kv_cache's (its rotary channels), v_cache is "
             "paged_kv_cache's v_cache (MLA: ckv_cache, v is k_nope), cos/sin (the table) are the two halves of "
             "cos_sin_cache, positions are pos_ids, cache_positions are positions")
    with in_callers_names("rope_quantize_fp8_append_paged_kv_cache", names):
        # q's float8 output, k's rotary part, and v (MLA: the latent k_nope) in one launch
        q_out, _ = rope_and_cache(q_rope[None], k_heads[None], (nope if mla else v)[None], cos, sin, k_cache=k_cache,
                                  v_cache=nope_cache if mla else v_cache, q_dtype=quantize_dtype,
                                  q_scale=torch.full((1,), 1.0 / quant_scale_q, dtype=torch.float32,
                                                     device=q_rope.device), **table)
        if nope is not None and not mla:  # k's non-rotary channels, beside its rotary ones rewritten alike
            rope_and_cache(q_rope[None, :, :0], k_heads[None], nope[None], cos, sin, k_cache=k_cache,
                           v_cache=nope_cache, **table)
    q_rope_out = q_out[0] if q_rope_out is None else q_rope_out.copy_(q_out[0])
    values = _float8_of(q_nope if q_nope is not None else q_rope.new_empty(*q_rope.shape[:-1], 0), quant_scale_q,
                        quantize_dtype)
    return q_rope_out, values if q_nope_out is None else q_nope_out.copy_(values)


def _rope_halves(cos_sin_cache, pos_ids, tokens: int, rope_dim: int):
    """FlashInfer's float8 calls' table and positions: ``cos_sin_cache`` exactly ``rope_dim`` wide (its two halves
    returned) and ``pos_ids`` one a token."""
    cos, sin = _halves(cos_sin_cache)
    if cos_sin_cache.shape[1] != rope_dim:
        raise ValueError(f"cos_sin_cache must be (max_position, rope_dim) with q_rope's rope_dim {rope_dim} columns "
                         f"(cos then sin), got shape {tuple(cos_sin_cache.shape)}")
    if not isinstance(pos_ids, torch.Tensor) or pos_ids.ndim != 1 or pos_ids.shape[0] != tokens:
        raise ValueError(f"pos_ids must be ({tokens},) (one position a token of q_rope), got "
                         f"{getattr(pos_ids, 'shape', type(pos_ids).__name__)}")
    return cos, sin


def _halves(cos_sin_cache):
    """cos and sin: the two column halves of the engines' ``(max_position, rotary_dim)`` buffer (views)."""
    if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] % 2:
        raise ValueError(f"cos_sin_cache must be (max_position, rotary_dim) with an even rotary_dim, got "
                         f"{getattr(cos_sin_cache, 'shape', type(cos_sin_cache).__name__)}")
    half = cos_sin_cache.shape[1] // 2
    return cos_sin_cache[:, :half], cos_sin_cache[:, half:]
