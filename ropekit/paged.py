"""A paged KV cache's bookkeeping and a reference paged attention, in plain PyTorch.

The cache layout is the one :func:`ropekit.rope_and_cache` writes: ``(num_blocks, block_size, kv_heads, head_dim)``.
A sequence owns a list of blocks (its row of the *block table*); its token at position ``p`` lives in block
``table[p // block_size]``, row ``p % block_size``, i.e. at the flat *slot* ``table[p // block_size] * block_size +
p % block_size``. ``slot_mapping`` gives that slot for every token of a step, and ``-1`` for a token that must write
nothing (padding).

* :class:`BlockAllocator` hands out blocks (in a shuffled order, so that a sequence's blocks are not adjacent and a
  kernel that ignored the table could not pass by luck) and keeps each sequence's table and length;
* :func:`slot_mapping` turns block tables and positions into the int64 slots;
* :func:`gather` reads one sequence's tokens back out of a cache (dequantising a float8 cache by its scale);
* :func:`paged_attention` is causal attention over the paged cache.

This is a **correctness reference**, not a fast kernel: one Python loop over the sequences, float32 math (float64
for float64 inputs). The end-to-end check (:mod:`ropekit.model_check`) and notebook 09 read the cache through it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["BlockAllocator", "slot_mapping", "gather", "paged_attention"]


class BlockAllocator:
    """Blocks of ``block_size`` slots for ``n_seqs`` sequences, handed out from a shuffled free list.

    ``append(seq, n)`` reserves room for ``n`` more tokens of sequence ``seq`` and returns their positions; the
    block table and the lengths are then read as tensors (:meth:`block_tables`, :meth:`lengths`).
    """

    def __init__(self, num_blocks: int, block_size: int, n_seqs: int, *, seed: Optional[int] = 0):
        if num_blocks < 1 or block_size < 1 or n_seqs < 1:
            raise ValueError(f"num_blocks, block_size and n_seqs must be >= 1, got {num_blocks}, {block_size}, "
                             f"{n_seqs}")
        self.num_blocks, self.block_size = num_blocks, block_size
        order = list(range(num_blocks))
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
            order = torch.randperm(num_blocks, generator=generator).tolist()
        self._free = order
        self.tables: list[list[int]] = [[] for _ in range(n_seqs)]
        self.lens: list[int] = [0] * n_seqs

    def append(self, seq: int, n: int) -> list[int]:
        """Reserve ``n`` more tokens for sequence ``seq``; returns their positions (the old length onwards)."""
        start = self.lens[seq]
        needed = -(-(start + n) // self.block_size) - len(self.tables[seq])
        if needed > len(self._free):
            raise RuntimeError(f"out of cache blocks: sequence {seq} needs {needed} more, {len(self._free)} free")
        self.tables[seq].extend(self._free.pop(0) for _ in range(needed))
        self.lens[seq] = start + n
        return list(range(start, start + n))

    def block_tables(self, device=None) -> torch.Tensor:
        """int64 ``(n_seqs, max_blocks)``, rows padded with -1."""
        width = max(1, max(len(t) for t in self.tables))
        rows = [t + [-1] * (width - len(t)) for t in self.tables]
        return torch.tensor(rows, dtype=torch.int64, device=device)

    def lengths(self, device=None) -> torch.Tensor:
        return torch.tensor(self.lens, dtype=torch.int64, device=device)


def slot_mapping(block_tables: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """int64 slots ``block_tables[seq, pos // block_size] * block_size + pos % block_size`` per token; a token with
    ``seq_ids`` or ``positions`` < 0 (padding) gets -1. All arguments on one device; no host sync."""
    seq_ids, positions = seq_ids.to(torch.int64), positions.to(torch.int64)
    pad = (seq_ids < 0) | (positions < 0)
    s, p = seq_ids.clamp(min=0), positions.clamp(min=0)
    blocks = block_tables[s, p // block_size]
    slots = blocks * block_size + p % block_size
    return torch.where(pad | (blocks < 0), torch.full_like(slots, -1), slots)


def gather(cache: torch.Tensor, block_table: torch.Tensor, length: int, scale: Optional[torch.Tensor] = None,
           dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Sequence tokens ``0..length-1`` of a paged ``cache`` as ``(length, heads, dim)`` in ``dtype`` (default: the
    cache's; float32 for a float8 cache, multiplied by ``scale``)."""
    block_size = cache.shape[1]
    n_blocks = -(-length // block_size)
    rows = cache[block_table[:n_blocks].to(torch.int64)].reshape(-1, *cache.shape[2:])[:length]
    if cache.dtype == torch.float8_e4m3fn:
        rows = rows.to(torch.float32) * (1.0 if scale is None else scale.to(torch.float32))
    return rows.to(dtype or rows.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: Sequence[int], query_lens: Sequence[int], *, scale: Optional[float] = None,
                    k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Causal attention of packed queries over a paged KV cache (grouped-query heads).

    Args:
        q: ``(tokens, heads_q, head_dim)``, the queries of every sequence packed in order; sequence ``b`` has
            ``query_lens[b]`` of them, the *last* ones of its ``context_lens[b]`` tokens (a prefill chunk or one
            decode token), so query ``i`` of ``b`` sits at position ``context_lens[b] - query_lens[b] + i`` and sees
            the cache's tokens up to it.
        k_cache, v_cache: ``(num_blocks, block_size, heads_kv, head_dim)`` (float8 ones with ``k_scale``/``v_scale``).
        block_tables: ``(n_seqs, max_blocks)`` int64; context_lens, query_lens: host ints per sequence.
        scale: the softmax scale, default ``head_dim ** -0.5``.

    Returns ``(tokens, heads_q, head_dim)`` in q's dtype; the math in float32 (float64 for float64 q).
    """
    math_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    start = 0
    for b, (ctx, n_q) in enumerate(zip(context_lens, query_lens)):
        ctx, n_q = int(ctx), int(n_q)
        qb = q[start:start + n_q].to(math_dtype)
        kb = gather(k_cache, block_tables[b], ctx, k_scale, math_dtype)
        vb = gather(v_cache, block_tables[b], ctx, v_scale, math_dtype)
        group = qb.shape[1] // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        q_pos = torch.arange(ctx - n_q, ctx, device=q.device)[:, None]
        visible = torch.arange(ctx, device=q.device)[None, :] <= q_pos
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start:start + n_q] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vb).to(q.dtype)
        start += n_q
    return out
