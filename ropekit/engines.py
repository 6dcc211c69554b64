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
"""

from __future__ import annotations

import operator
from typing import Optional

import torch

from .api import apply_rope

__all__ = ["rotary_embedding", "apply_rope_with_cos_sin_cache_inplace"]


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
                     cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """Rotate ``query`` and ``key`` in place (vLLM's ``rotary_embedding`` contract; see the module docstring)."""
    try:
        size = None if isinstance(head_size, bool) else operator.index(head_size)  # an int, or numpy's integers
    except TypeError:
        size = None
    if size is None or size <= 0:
        raise TypeError(f"head_size must be a positive int, got {head_size!r}")
    head_size = size
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
    if rotary_dim > head_size:
        raise ValueError(f"cos_sin_cache's rotary_dim ({rotary_dim}) must be <= head_size ({head_size})")
    token_dims = tuple(positions.shape)
    tokens = positions.numel()
    q = _heads_view("query", query, tokens, head_size, token_dims)
    k = None if key is None else _heads_view("key", key, tokens, head_size, token_dims)
    # cos and sin: the two column halves of one buffer (same strides, so the kernel reads them without a copy)
    cos, sin = cos_sin_cache[:, :rotary_dim // 2], cos_sin_cache[:, rotary_dim // 2:]
    try:
        apply_rope(q, k, cos, sin, positions=positions.reshape(1, tokens), layout="bshd", interleaved=not is_neox,
                   rotary_dim=rotary_dim, inplace=True)
    except (TypeError, ValueError, RuntimeError) as error:
        # apply_rope names its own arguments; say which of this call's they are
        raise type(error)(f"{error} [in rotary_embedding: q is query, k is key, cos/sin (the table) are the two "
                          "halves of cos_sin_cache]") from error


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                                          head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """FlashInfer's name for the same contract as :func:`rotary_embedding` (in place, returns None)."""
    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
