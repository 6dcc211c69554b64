"""A cache-writing call's cache arguments, drawn as engines lay them out (the fuzzer's cache targets,
:mod:`ropekit.reliability.fuzz_cache`): the caches as vLLM and FlashInfer allocate them, slot mappings, and
FlashInfer's page tables with what check mode refuses in them."""

from __future__ import annotations

import random

import torch

from .fuzz import Arena
from .rope_args import INDEX_KINDS, pick

__all__ = ["FP8", "E5M2", "INT8", "CACHE_KINDS", "PAGE_TABLE", "draw_slots", "draw_page_table", "engine_caches"]

FP8, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
# caches are written: no view kind in which two indices name one element
CACHE_KINDS = (("contiguous", 3), ("padded", 2))


def draw_slots(rng: random.Random, tokens: int, n_slots: int, hostile: bool, repeat: bool) -> list[int]:
    """One slot a token: distinct slots of the cache or -1 (skip); ``hostile`` adds slots past either end of the
    cache, ``repeat`` names one slot twice."""
    free = rng.sample(range(n_slots), min(tokens, n_slots))
    slots = [free[t] if t < len(free) and rng.random() < 0.85 else -1 for t in range(tokens)]
    if hostile and tokens:
        slots[rng.randrange(tokens)] = rng.choice((n_slots, n_slots + 7, -2, 2**40))
    if repeat and tokens >= 2:
        slots[1] = slots[0] = max(slots[0], 0)
    return slots


PAGE_TABLE = ("kv_indices", "kv_indptr", "batch_indices", "cache_positions")


def draw_page_table(arena: Arena, rng: random.Random, tokens: int, num_blocks: int, block_size: int,
                    hostile: bool, repeat: bool) -> tuple[dict, list[int], list[str]]:
    """FlashInfer's page table for ``tokens`` tokens: up to three requests holding distinct pages of the pool
    (``kv_indices``, ``kv_indptr``), each token a request (or -1) and a distinct position in it (``batch_indices``,
    ``cache_positions``), int32 or int64 views with guards; ``hostile`` adds one of: a batch index past the requests,
    a position past its request's pages, a negative position, a page outside the pool; ``repeat`` names one row
    twice. Returns the tensors, each token's slot as the kernel writes it (-1: nowhere) and what check mode refuses
    (docs/fused.md's rules, read from the values drawn)."""
    n_requests = rng.randint(1, 3)
    pages = rng.sample(range(num_blocks), rng.randint(0, num_blocks))
    indptr = [0] + sorted(rng.randint(0, len(pages)) for _ in range(n_requests - 1)) + [len(pages)]
    free = [(b, p) for b in range(n_requests) for p in range((indptr[b + 1] - indptr[b]) * block_size)]
    chosen = rng.sample(free, min(tokens, len(free)))
    pairs = [chosen[t] if t < len(chosen) and rng.random() < 0.85 else (-1, rng.randint(0, 5)) for t in range(tokens)]
    indices = list(pages)
    if hostile and tokens:
        t, kind = rng.randrange(tokens), rng.choice(("request", "past", "negative", "page"))
        b, p = pairs[t]
        if kind == "request":
            pairs[t] = (n_requests + rng.randint(0, 2), p)
        elif kind == "past" and b >= 0:
            pairs[t] = (b, (indptr[b + 1] - indptr[b]) * block_size + rng.randint(0, 3))
        elif kind == "negative" and b >= 0:
            pairs[t] = (b, -rng.randint(1, 5))
        elif kind == "page" and indices:
            indices[rng.randrange(len(indices))] = num_blocks + rng.randint(0, 3)
    if repeat and tokens >= 2 and pairs[0][0] >= 0:
        pairs[1] = pairs[0]
    why, slots = [], []
    if any(not 0 <= i < num_blocks for i in indices):
        why.append("check mode: a page outside the pool")
    for b, p in pairs:
        slot = -1
        if not -1 <= b < n_requests:
            why.append("check mode: a batch index past the requests")
        elif b >= 0 and p < 0:
            why.append("check mode: a negative cache position")
        elif b >= 0 and indptr[b] + p // block_size >= indptr[b + 1]:
            why.append("check mode: a cache position past its request's pages")
        elif b >= 0 and 0 <= indices[indptr[b] + p // block_size] < num_blocks:
            slot = indices[indptr[b] + p // block_size] * block_size + p % block_size
        slots.append(slot)
    cached = [(b, p) for b, p in pairs if 0 <= b < n_requests and 0 <= p and indptr[b] + p // block_size < indptr[
        b + 1]]
    if len(set(cached)) < len(cached):
        why.append("check mode: two tokens name one row")
    values = dict(kv_indices=indices, kv_indptr=indptr, batch_indices=[b for b, _ in pairs],
                  cache_positions=[p for _, p in pairs])
    tensors = {name: arena.place(name, (len(v),), rng.choice((torch.int32, torch.int64)), pick(rng, INDEX_KINDS),
                                 lambda shape, v=v: torch.tensor(v, dtype=torch.int64).reshape(shape))
               for name, v in values.items()}
    return tensors, slots, sorted(set(why))


def engine_caches(arena: Arena, name: str, shape: tuple, dtype: torch.dtype,
                  pair: bool = False) -> tuple[list, dict, torch.Tensor]:
    """The cache(s) of ``shape`` as engines allocate them: vLLM's k and v as ``kv[:, 0]`` and ``kv[:, 1]`` of one
    ``(num_blocks, 2, ...)`` tensor (``pair``), FlashInfer's HND (heads before rows, seen transposed), head dims
    padded in the allocation, blocks a step apart, float8 caches stored as bytes (read through a float8 view or
    passed as vLLM's ``torch.uint8``). Returns the caches (``(blocks, rows, ...)`` views), what was drawn, and the
    allocation as engines hold it (the ``(num_blocks, 2, ...)`` pair, or the cache; HND: heads before rows)."""
    rng = arena.rng
    fp8 = dtype in (FP8, E5M2)
    how = dict(hnd=len(shape) == 4 and rng.random() < 0.3, pad=rng.choice((0, 0, 0, 4)),
               step=rng.choice((1, 1, 1, 2)), uint8=fp8 and rng.random() < 0.5, pair=pair)
    blocks, rows, *heads, dim = shape
    inner = (tuple(heads) + (rows,)) if how["hnd"] else ((rows,) + tuple(heads))
    allocation = (blocks * how["step"],) + ((2,) if pair else ()) + inner + (dim + how["pad"],)
    stored = torch.uint8 if fp8 else dtype
    whole = arena.place(name, allocation, stored, pick(rng, CACHE_KINDS))[::how["step"], ..., :dim]
    if fp8 and not how["uint8"]:
        whole = whole.view(dtype)
    caches = [whole[:, 0], whole[:, 1]] if pair else [whole]
    if how["hnd"]:
        caches = [c.transpose(1, 2) for c in caches]
    return caches, how, whole
