"""Turn the user's way of saying "where is each token" into the one form the kernels take.

A kernel sees a position *mode* (a compile-time switch), one integer and at most one integer tensor:

=====================  ====================================================  ==============================
mode                   position of token ``s`` of sequence ``b``              what the kernel reads
=====================  ====================================================  ==============================
``SCALAR_OFFSET`` (0)  ``offset + s``                                        a host integer
``SEQ_OFFSETS``   (1)  ``offsets[b] + s``                                    ``(batch,)`` tensor on the GPU
``POSITION_IDS``  (2)  ``position_ids[b, s]`` (strides may be 0: broadcast)  ``(batch, seq)`` strided view
M-RoPE (3 and up)      pair ``i``: ``position_ids[axis(i), b, s]``           ``(3, batch, seq)`` strided view
=====================  ====================================================  ==============================

M-RoPE (multimodal RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) gives every token three positions (temporal, height, width)
and every rotary pair one of the three axes; the pair reads the table row of its axis' position, so one table serves.
Its mode value holds the sections as well (:func:`mrope_mode`): a kernel switch that travels wherever the position
mode goes (every kernel that reads positions, the custom ops' ``pos_mode``), so no helper takes a new argument.

Varlen packing (``cu_seqlens``) is orthogonal: ``b`` is then the sequence index, ``s`` counts from that sequence's
start, and a position-id tensor is indexed by the packed token. Nothing here expands positions into a per-token
tensor or adds a launch: decode steps stay capturable in a CUDA graph (offsets live on the GPU, no host sync).

This module also holds the position helpers for context parallelism, which produce ordinary position ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "SCALAR_OFFSET",
    "SEQ_OFFSETS",
    "POSITION_IDS",
    "MROPE_IDS",
    "PositionSpec",
    "mrope_mode",
    "mrope_sections",
    "mrope_axis_of_pair",
    "resolve_positions",
    "context_parallel_positions",
    "context_parallel_shard",
    "context_parallel_varlen_positions",
]

SCALAR_OFFSET, SEQ_OFFSETS, POSITION_IDS = 0, 1, 2
MROPE_IDS = 3  # the first M-RoPE mode: every mode >= MROPE_IDS is M-RoPE (mrope_mode)
MROPE_SECTION_BASE = 4096  # each section is below this: mrope_mode packs them as digits of this base


def mrope_mode(mrope_section, interleaved: bool) -> int:
    """The position mode of M-RoPE with sections ``(t, h, w)`` (pairs per axis, summing to ``rotary_dim/2``):
    ``MROPE_IDS + interleaved + 2 * (t + 4096 * (h + 4096 * w))``. The kernels read the sections back from it at
    compile time (``ropekit.triton.v4._mrope_positions``); :func:`mrope_sections` is the inverse."""
    t, h, w = mrope_section
    return MROPE_IDS + int(bool(interleaved)) + 2 * (t + MROPE_SECTION_BASE * (h + MROPE_SECTION_BASE * w))


def mrope_sections(mode: int) -> tuple[tuple[int, int, int], bool]:
    """``(mrope_section, interleaved)`` of an M-RoPE mode: the inverse of :func:`mrope_mode`."""
    sections, interleaved = divmod(mode - MROPE_IDS, 2)
    t, rest = sections % MROPE_SECTION_BASE, sections // MROPE_SECTION_BASE
    return (t, rest % MROPE_SECTION_BASE, rest // MROPE_SECTION_BASE), bool(interleaved)


def mrope_axis_of_pair(mrope_section, interleaved: bool) -> list[int]:
    """The position axis (0 temporal, 1 height, 2 width) of every rotary pair.

    Contiguous (Qwen2-VL, Qwen2.5-VL): the sections are consecutive ranges of pairs, ``t`` temporal pairs, then
    ``h`` height, then ``w`` width. Interleaved (Qwen3-VL's ``mrope_interleaved``): the axes take turns pair by pair,
    pair ``i`` follows height when ``i % 3 == 1`` and ``i < 3h``, width when ``i % 3 == 2`` and ``i < 3w``, temporal
    otherwise."""
    t, h, w = mrope_section
    if not interleaved:
        return [0] * t + [1] * h + [2] * w
    return [1 if i % 3 == 1 and i < 3 * h else 2 if i % 3 == 2 and i < 3 * w else 0 for i in range(t + h + w)]


@dataclass(frozen=True)
class PositionSpec:
    """What a kernel launch needs to know about positions (see the module docstring)."""

    mode: int = SCALAR_OFFSET
    offset: int = 0
    # SEQ_OFFSETS: (batch,); POSITION_IDS: (batch, seq) or (tokens,) for varlen; M-RoPE: (3, batch, seq) or (3, tokens)
    tensor: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None  # (n_seqs + 1,) int32/int64, varlen only
    max_seqlen: int | None = None  # host int, varlen only

    @property
    def is_varlen(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def is_mrope(self) -> bool:
        return self.mode >= MROPE_IDS


def longest_sequence(cu_seqlens: torch.Tensor) -> int:
    """The longest sequence of a packed batch (a host sync: callers that can, pass ``max_seqlen`` instead)."""
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.shape[0] > 1 else 0


def _same_device(a: torch.device, b: torch.device) -> bool:
    # "cuda" (current device) and "cuda:0" name the same device when the index is unspecified
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def resolve_positions(*, batch: int, seqlen: int, positions=None, cu_seqlens=None, max_seqlen=None,
                      device=None, mrope_section=None, mrope_interleaved: bool = False) -> PositionSpec:
    """Classify ``positions`` (None, int, (batch,) offsets or position ids) into a :class:`PositionSpec`.

    ``batch``/``seqlen`` are the token shape of q (for varlen: ``batch`` = number of sequences and ``seqlen`` the
    packed token count). Position ids of any shape that broadcasts to ``(batch, seqlen)`` are turned into a strided
    view with zero strides, never copied. Raises ``TypeError``/``ValueError`` naming ``positions``.

    With ``mrope_section`` (validated by the caller), a tensor of three position ids per token, ``(3, batch, seq)``
    (``(3, tokens)`` packed; any shape with a leading 3 that broadcasts to it), is M-RoPE's; every other form places
    text tokens, whose three axes agree, and is classified as without it.
    """
    if cu_seqlens is not None:
        if max_seqlen is None:
            raise ValueError("max_seqlen (a host int, the longest sequence) is required with cu_seqlens")
    if positions is None:
        return PositionSpec(SCALAR_OFFSET, 0, None, cu_seqlens, max_seqlen)
    if isinstance(positions, bool):
        raise TypeError("positions must be None, an int offset or an integer tensor, got a bool")
    if isinstance(positions, int):
        return PositionSpec(SCALAR_OFFSET, positions, None, cu_seqlens, max_seqlen)
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be None, an int offset or an integer tensor, got {type(positions).__name__}")
    if positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"positions must be an int32 or int64 tensor, got {positions.dtype}")
    if device is not None and not _same_device(positions.device, torch.device(device)):
        raise ValueError(f"positions is on {positions.device} but q is on {device}")
    if mrope_section is not None and positions.ndim == (2 if cu_seqlens is not None else 3):
        return _mrope_positions(positions, batch, seqlen, cu_seqlens, max_seqlen, mrope_section, mrope_interleaved)
    if positions.ndim == 0:
        # A 0-d tensor is a per-batch offset broadcast to every sequence (stays on the device: no .item()).
        return PositionSpec(SEQ_OFFSETS, 0, positions.reshape(1).expand(batch), cu_seqlens, max_seqlen)
    if cu_seqlens is not None:
        if positions.ndim == 2 and positions.shape == (batch, 1):
            return PositionSpec(SEQ_OFFSETS, 0, positions[:, 0], cu_seqlens, max_seqlen)
        if positions.ndim == 2 and positions.shape == (1, seqlen):
            return PositionSpec(POSITION_IDS, 0, positions[0], cu_seqlens, max_seqlen)
        if positions.ndim == 1 and batch == seqlen > 1:  # one sequence of one token: both readings agree
            raise ValueError(f"positions of shape ({seqlen},) are ambiguous with {batch} sequences of {seqlen} packed "
                             f"tokens: pass per-sequence offsets as shape ({batch}, 1) or per-token position ids as "
                             f"shape (1, {seqlen})")
        if positions.ndim == 1 and positions.shape[0] == batch:
            return PositionSpec(SEQ_OFFSETS, 0, positions, cu_seqlens, max_seqlen)
        if positions.ndim == 1 and positions.shape[0] == seqlen:
            return PositionSpec(POSITION_IDS, 0, positions, cu_seqlens, max_seqlen)
        raise ValueError(f"with cu_seqlens, positions must have shape ({batch},) or ({batch}, 1) (per-sequence "
                         f"offsets) or ({seqlen},) or (1, {seqlen}) (per-token position ids), "
                         f"got {tuple(positions.shape)}")
    if positions.ndim == 1 and positions.shape[0] == batch and not (batch == seqlen and batch > 1):
        # (batch,) is a per-sequence offset. When batch == seqlen > 1 the shape is ambiguous; a 1-D tensor of
        # length seq is treated as position ids shared by the batch (HF's convention), so use offsets.reshape(-1, 1)
        # ... or pass a (batch, 1) tensor for offsets.
        return PositionSpec(SEQ_OFFSETS, 0, positions, None, None)
    if positions.ndim <= 2:
        try:
            view = positions.expand(batch, seqlen)
        except RuntimeError:
            view = None
        if positions.ndim == 2 and positions.shape[1] == 1 and positions.shape[0] == batch and seqlen != 1:
            # (batch, 1): an offset per sequence, written the way that broadcasts.
            return PositionSpec(SEQ_OFFSETS, 0, positions[:, 0], None, None)
        if view is not None:
            return PositionSpec(POSITION_IDS, 0, view, None, None)
    raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast to (batch, seq) = "
                     f"({batch}, {seqlen}) and are not per-sequence offsets of shape ({batch},)")


def _mrope_positions(positions: torch.Tensor, batch: int, seqlen: int, cu_seqlens, max_seqlen, mrope_section,
                     interleaved: bool) -> PositionSpec:
    if cu_seqlens is not None:
        if positions.shape != (3, seqlen):
            # packed sequences: any other 2-D tensor is an ordinary form ((n_seqs, 1) offsets, (1, tokens) ids)
            return resolve_positions(batch=batch, seqlen=seqlen, positions=positions, cu_seqlens=cu_seqlens,
                                     max_seqlen=max_seqlen)
        return PositionSpec(mrope_mode(mrope_section, interleaved), 0, positions, cu_seqlens, max_seqlen)
    try:
        view = positions.expand(3, batch, seqlen) if positions.shape[0] == 3 else None
    except RuntimeError:
        view = None
    if view is None:
        raise ValueError(f"M-RoPE positions must be (3, batch, seq) = (3, {batch}, {seqlen}) (the temporal, height "
                         f"and width position ids of every token; a (3, 1, seq) tensor is shared by the batch), got "
                         f"{tuple(positions.shape)}")
    return PositionSpec(mrope_mode(mrope_section, interleaved), 0, view, None, None)


# --------------------------------------------------------------------------------------------------------------------
# Context parallelism (Transformer Engine's load-balanced split).
# --------------------------------------------------------------------------------------------------------------------

def _check_ranks(cp_size: int, cp_rank: int) -> None:
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, cp_size), got cp_rank={cp_rank}, cp_size={cp_size}")


def _cp_chunks(seqlen: int, cp_size: int, cp_rank: int) -> tuple[range, range]:
    _check_ranks(cp_size, cp_rank)
    if seqlen % (2 * cp_size):
        raise ValueError(f"seqlen ({seqlen}) must be divisible by 2 * cp_size ({2 * cp_size})")
    chunk = seqlen // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return range(first * chunk, (first + 1) * chunk), range(second * chunk, (second + 1) * chunk)


def context_parallel_positions(seqlen: int, cp_size: int, cp_rank: int, *, device=None) -> torch.Tensor:
    """Positions of the tokens rank ``cp_rank`` holds when a sequence of ``seqlen`` is split over ``cp_size`` ranks.

    The sequence is cut into ``2 * cp_size`` chunks and rank ``r`` holds chunks ``r`` and ``2*cp_size - 1 - r`` (so
    that causal attention work is balanced). Pass the result as ``positions=`` (position ids, shared by the batch).
    """
    first, second = _cp_chunks(seqlen, cp_size, cp_rank)
    return torch.cat((torch.arange(first.start, first.stop), torch.arange(second.start, second.stop))).to(device)


def context_parallel_shard(x: torch.Tensor, cp_size: int, cp_rank: int, *, seq_dim: int = 1) -> torch.Tensor:
    """The slice of ``x`` (full sequence along ``seq_dim``) that rank ``cp_rank`` holds, in the same order as
    :func:`context_parallel_positions`."""
    first, second = _cp_chunks(x.shape[seq_dim], cp_size, cp_rank)
    return torch.cat((x.narrow(seq_dim, first.start, len(first)), x.narrow(seq_dim, second.start, len(second))),
                     dim=seq_dim)


def context_parallel_varlen_positions(cu_seqlens: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Per-token positions of rank ``cp_rank``'s share of a packed batch: every sequence is split as above
    (each length divisible by ``2 * cp_size``). Returns a ``(tokens_on_rank,)`` tensor for ``layout="thd"``.

    ``cu_seqlens`` (int32/int64, ``(n_seqs + 1,)``) is read on the host (the positions are built there): it must
    never decrease, and every length must be divisible by ``2 * cp_size``; errors name ``cu_seqlens``.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be an int32 or int64 tensor, got "
                        f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)}")
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D with n_seqs + 1 entries, got shape {tuple(cu_seqlens.shape)}")
    _check_ranks(cp_size, cp_rank)
    bounds = cu_seqlens.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    for i, n in enumerate(lengths):
        if n < 0:
            raise ValueError(f"cu_seqlens must never decrease (sequence {i} would hold {n} tokens), got {bounds}")
        if n % (2 * cp_size):
            raise ValueError(f"cu_seqlens: every sequence's length must be divisible by 2 * cp_size ({2 * cp_size}), "
                             f"sequence {i} holds {n} tokens")
    parts = [context_parallel_positions(n, cp_size, cp_rank) for n in lengths]
    return torch.cat(parts).to(cu_seqlens.device) if parts else torch.zeros(0, dtype=torch.int64,
                                                                            device=cu_seqlens.device)
