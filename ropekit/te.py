"""Transformer Engine's ``apply_rotary_pos_emb`` signature, so that a TE model can swap ropekit in.

``apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, fused=False,
cu_seqlens=None, cp_size=1, cp_rank=0)`` returns ``t`` rotated (a new tensor, differentiable), with TE's meaning of
every argument (the argument order of TE 2.4 and later; ``start_positions`` with ``cp_size > 1`` as TE 2.10 takes it):

* ``t``: ``(seq, batch, heads, head_dim)`` for ``"sbhd"``, ``(batch, seq, heads, head_dim)`` for ``"bshd"``, packed
  ``(tokens, heads, head_dim)`` for ``"thd"``; any strides.
* ``freqs``: ``(max_seq, 1, 1, rotary_dim)`` angles, as TE's ``RotaryPositionEmbedding`` returns them: each pair's
  angle twice, in the halves (NeoX) or in neighbouring channels (``interleaved``, GPT-J). Row ``p`` is position
  ``p``. ``rotary_dim <= head_dim``: the channels past it pass through. One copy of each angle is read (the first
  half, or the even channels); ``ROPEKIT_CHECK=1`` refuses a ``freqs`` whose two copies differ (a host read).
* ``start_positions``: ``(batch,)`` integers >= 0, the position of each sequence's first token (a KV cache's length).
* ``cu_seqlens``: for ``"thd"``, the ``(batch + 1,)`` cumulative sequence lengths of the whole (unsplit) batch, each
  padded to a multiple of ``2 * cp_size`` (TE's ``cu_seqlens_padded``), from 0 to ``t``'s tokens times ``cp_size``;
  ignored for the other formats, as TE does. TE reads both on the host, so their values are checked always.
* ``cp_size``/``cp_rank``: context parallelism. Each sequence is cut into ``2 * cp_size`` chunks and this rank holds
  chunks ``cp_rank`` and ``2 * cp_size - 1 - cp_rank`` (for ``"thd"``, ``cu_seqlens // cp_size`` delimit them;
  every length divisible by ``2 * cp_size``); the positions are those of the full sequence.
* ``fused``: accepted for the signature; ropekit always runs its kernel, whose arithmetic is TE's fused one
  (float32 math, one rounding). TE's unfused path rounds cos/sin and each product to ``t``'s dtype: in 16-bit dtypes
  the two differ by an ulp or so.

It is :func:`ropekit.apply_rope` on tables from :func:`ropekit.cos_sin_from_freqs` and the positions of
:mod:`ropekit.positions`' context-parallel helpers. Reading ``cu_seqlens`` for ``"thd"`` is a host sync. The tables
are derived once per ``freqs`` tensor and its version (a model passes one ``freqs`` to every layer of a step) and
kept while that tensor lives; a ``freqs`` changed in place is derived again (a change through ``.data`` does not
count as one: it does not move the tensor's version).
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from .api import apply_rope
from .frequencies import cos_sin_from_freqs
from .positions import context_parallel_positions, context_parallel_varlen_positions
from .triton.launch import PlanCache
from .validate import as_integer, check_mode, in_callers_names, pair_copies

__all__ = ["apply_rotary_pos_emb"]

_FORMATS = ("sbhd", "bshd", "thd")


def _check(t, freqs, tensor_format, start_positions, cu_seqlens, cp_size, cp_rank,
           interleaved) -> tuple[int, int]:
    if tensor_format not in _FORMATS:
        raise ValueError(f"tensor_format must be one of {', '.join(_FORMATS)}, got {tensor_format!r}")
    if not isinstance(t, torch.Tensor) or t.ndim != (3 if tensor_format == "thd" else 4):
        raise ValueError(f"t must be a {'3' if tensor_format == 'thd' else '4'}-D tensor for tensor_format "
                         f"{tensor_format!r}, got {getattr(t, 'shape', type(t).__name__)}")
    if not isinstance(freqs, torch.Tensor) or not freqs.is_floating_point() or freqs.ndim != 4 \
            or freqs.shape[1:3] != (1, 1):
        raise ValueError(f"freqs must be a floating (max_seq, 1, 1, rotary_dim) tensor, got "
                         f"{getattr(freqs, 'shape', type(freqs).__name__)}")
    size, rank = as_integer(cp_size), as_integer(cp_rank)
    if size is None or rank is None:
        raise TypeError(f"cp_size and cp_rank must be ints, got {cp_size!r} and {cp_rank!r}")
    cp_size, cp_rank = size, rank
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_size must be >= 1 and 0 <= cp_rank < cp_size, got cp_size {cp_size}, cp_rank {cp_rank}")
    if tensor_format == "thd" and cu_seqlens is None:
        raise ValueError("tensor_format 'thd' needs cu_seqlens")
    if freqs.shape[-1] > t.shape[-1]:
        raise ValueError(f"freqs' last dimension (the rotary width, {freqs.shape[-1]}) must be <= t's head_dim "
                         f"({t.shape[-1]})")
    if start_positions is not None and (not isinstance(start_positions, torch.Tensor) or start_positions.ndim != 1
                                        or start_positions.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"start_positions must be an int32/int64 (batch,) tensor, got "
                         f"{getattr(start_positions, 'shape', type(start_positions).__name__)}")
    if freqs.shape[-1] % 2:
        raise ValueError(f"freqs' last dimension (the rotary width) must be even, got {freqs.shape[-1]}")
    # TE reads start_positions and cu_seqlens on the host, and so does this: their values are checked always (a meta
    # tensor has none to read)
    for name, x in (("start_positions", start_positions), ("cu_seqlens", cu_seqlens)):
        if isinstance(x, torch.Tensor) and x.is_meta and not t.is_meta:
            raise ValueError(f"{name} is a meta tensor, but its values are read (t is on {t.device})")
    if tensor_format == "thd":
        _check_cu_seqlens(cu_seqlens, t.shape[0], cp_size)
    if start_positions is not None:
        batch = cu_seqlens.shape[0] - 1 if tensor_format == "thd" else t.shape[1 if tensor_format == "sbhd" else 0]
        if start_positions.shape[0] != batch:
            raise ValueError(f"start_positions must hold one position a sequence, {batch}, got "
                             f"{start_positions.shape[0]}")
    if start_positions is not None and not torch.compiler.is_compiling() and start_positions.numel() \
            and int(start_positions.min()) < 0:
        raise ValueError(f"start_positions must be >= 0 (each sequence's first position), got "
                         f"{start_positions.tolist()}"[:300])
    if check_mode() and not torch.compiler.is_compiling():
        # one angle per pair is read: a freqs whose two copies differ would be rotated by the first copy only
        if not torch.equal(*pair_copies(freqs[:, 0, 0], interleaved)):
            raise ValueError("freqs must hold each pair's angle twice, as TE's RotaryPositionEmbedding makes it "
                             f"({'channels 2i and 2i+1' if interleaved else 'channels i and i + rotary_dim/2'}); "
                             "these differ")
    return cp_size, cp_rank


def _check_cu_seqlens(cu_seqlens, tokens: int, cp_size: int) -> None:
    """The whole batch's boundaries: from 0, never decreasing, every length divisible by 2 * cp_size (by 1 without
    context parallelism), ending at this rank's tokens times cp_size."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2 \
            or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be a (batch + 1,) int32/int64 tensor, got "
                         f"{getattr(cu_seqlens, 'shape', type(cu_seqlens).__name__)}"
                         f"{' of ' + str(cu_seqlens.dtype) if isinstance(cu_seqlens, torch.Tensor) else ''}")
    bounds = cu_seqlens.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    if bounds[0] != 0 or min(lengths) < 0:
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {bounds}"[:300])
    split = 1 if cp_size == 1 else 2 * cp_size
    if any(n % split for n in lengths):
        raise ValueError(f"every sequence of cu_seqlens must be divisible by 2 * cp_size ({split}): each is split "
                         f"over the ranks, got lengths {lengths}"[:300])
    if bounds[-1] != tokens * cp_size:
        raise ValueError(f"cu_seqlens must end at the batch's token count, t's {tokens} tokens times cp_size "
                         f"({cp_size}) = {tokens * cp_size}, got {bounds[-1]}")


# freqs' tables by the tensor (its id, checked against a weak reference: an id is reused once a tensor dies) and its
# version; an entry leaves with its tensor
_TABLES = PlanCache(16)


def _tables(freqs: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ropekit.cos_sin_from_freqs` of ``freqs``, derived once per tensor and version (outside torch.compile,
    which traces the derivation into its graph)."""
    if torch.compiler.is_compiling():
        return cos_sin_from_freqs(freqs, interleaved=interleaved)
    key = (id(freqs), freqs._version, interleaved)
    entry = _TABLES.get(key)
    if entry is not None and entry[0]() is freqs:
        return entry[1]
    tables = cos_sin_from_freqs(freqs, interleaved=interleaved)
    _TABLES.put(key, (weakref.ref(freqs, lambda _, key=key: _TABLES.pop(key, None)), tables))
    return tables


def _rotate(t, cos, sin, layout, interleaved, reach, **kwargs) -> torch.Tensor:
    """apply_rope, its errors told in TE's names. ``reach``: a 0-d tensor, one past the largest position, checked
    against freqs' rows (TE asserts it too) where a host read is allowed, rather than rotating by a NaN row."""
    if reach is not None and not torch.compiler.is_compiling() and int(reach) > cos.shape[0]:
        raise ValueError(f"freqs has {cos.shape[0]} rows (positions), but start_positions, the sequence lengths and "
                         f"cp_size reach position {int(reach) - 1}")
    with in_callers_names("te.apply_rotary_pos_emb", "q is t, cos/sin are freqs' cos and sin, positions come from "
                          "start_positions (and cp_size/cp_rank)"):
        return apply_rope(t, None, cos, sin, layout=layout, interleaved=interleaved, **kwargs)[0]


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         start_positions: Optional[torch.Tensor] = None, interleaved: bool = False,
                         fused: bool = False, cu_seqlens: Optional[torch.Tensor] = None, cp_size: int = 1,
                         cp_rank: int = 0) -> torch.Tensor:
    """``t`` rotated by ``freqs`` (Transformer Engine's contract; see the module docstring)."""
    cp_size, cp_rank = _check(t, freqs, tensor_format, start_positions, cu_seqlens, cp_size, cp_rank, interleaved)
    cos, sin = _tables(freqs, interleaved)
    starts = None if start_positions is None else start_positions.to(torch.int64)
    if tensor_format == "thd":
        local = cu_seqlens // cp_size
        lengths = local[1:] - local[:-1]
        longest = int(lengths.max()) if lengths.numel() else 0
        if cp_size == 1:
            positions = None if starts is None else starts[:, None]
            reach = None if starts is None else starts.max() + longest
        else:
            positions = context_parallel_varlen_positions(cu_seqlens, cp_size, cp_rank).to(t.device)
            if starts is not None:
                positions = positions + torch.repeat_interleave(starts, lengths.to(starts.device))
            positions = positions[None]
            reach = positions.max() + 1 if positions.numel() else None
        return _rotate(t, cos, sin, "thd", interleaved, reach, cu_seqlens=local, max_seqlen=longest,
                       positions=positions)
    seq = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    if cp_size == 1:
        positions = None if starts is None else starts[:, None]
        reach = None if starts is None or not starts.numel() else starts.max() + seq
    else:
        if seq % 2:
            raise ValueError(f"with cp_size > 1 a rank holds two equal chunks of each sequence: its {seq} tokens "
                             "must be even")
        positions = context_parallel_positions(seq * cp_size, cp_size, cp_rank, device=t.device)[None]
        if starts is not None:
            positions = starts[:, None] + positions
        reach = positions.max() + 1 if positions.numel() else None
    return _rotate(t, cos, sin, tensor_format, interleaved, reach, positions=positions)
