"""The fuzzer's targets for the fused pre-processing ops (``ropekit.qk_norm_rope``, ``ropekit.rotary_embedding``,
``ropekit.rope_and_cache``, ``ropekit.mla_rope_and_cache``): their extra tensors (norm weights, the engines'
``cos_sin_cache``, caches, ``slot_mapping``, scales) drawn as hostile as apply_rope's. A target is registered only
where the installed ropekit has its op."""

from __future__ import annotations

import random

import torch

import ropekit
from ropekit import reference as ref
from ropekit.layouts import to_bshd
from ropekit.testing import check_close_to_reference

from .fuzz import EITHER, MATCH, RAISE, Arena, Case, footprint, same_bits, self_overlapping
from .fuzz_cache import pool_overlaps
from .fuzz_rope import rope_case
from .rope_args import DTYPES, INDEX_KINDS, INPUT_KINDS, pick, position_values, draw_rope_args

__all__ = ["TARGETS", "draw_qk_norm_rope", "draw_rotary_embedding", "draw_flashinfer"]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: float,
              over_heads: bool = False) -> torch.Tensor:
    """RMSNorm per head over head_dim in float64: ``x * rsqrt(mean(x^2) + eps) * (weight_offset + weight)`` (no
    weight: ``x * rsqrt(mean(x^2) + eps)``); ``over_heads``: over each token's (heads, head_dim) together."""
    if over_heads:
        return _rms_norm(x.flatten(-2), weight, eps, weight_offset).unflatten(-1, x.shape[-2:])
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * (weight_offset + weight.to(torch.float64))


def draw_qk_norm_rope(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``qk_norm_rope`` with apply_rope's hostile arguments and its own weights (or none), the norm before or after
    the rotation, over each head or across all heads (``norm_over``); in a share of the cases q and one tensor it
    reads (a weight, a table, positions or cu_seqlens) carved from one byte pool: apart, or on each other's bytes in
    place (to be refused; out of place both are only read)."""
    arena, inplace = Arena(rng, gen, device), None
    placement, weighted = rng.choice(("before", "after")), rng.random() < 0.7
    norm_over = rng.choice(("head", "heads"))
    if rng.random() < 0.3:
        apart = rng.random() < 0.25
        partners = (("q_weight", "k_weight") if weighted else ()) + ("cos", "sin", "positions", "cu_seqlens")
        arena.share("q", rng.choice(partners), apart=apart)
        inplace = None if apart else True
    args = draw_rope_args(rng, gen, device, conjugate=False, arena=arena, inplace=inplace)
    del args.kwargs["conjugate"], args.kwargs["backend"]
    head_dim = args.spec["head_dim"]
    weights, logical = [], {}
    for name, x in (("q_weight", args.q), ("k_weight", args.k)):
        if x is None or not weighted:
            weights.append(None)
            continue
        # (across all heads: a weight a channel of every head, heads x head_dim)
        wanted = head_dim * (to_bshd(x, args.kwargs["layout"]).shape[-2] if norm_over == "heads" else 1)
        length = wanted if rng.random() > 0.03 else wanted + 2
        if length != wanted:
            args.refuse(f"{name} not of {'heads x ' if norm_over == 'heads' else ''}head_dim elements")
        w = args.arena.place(name, (length,), rng.choice((x.dtype, torch.float32)), pick(rng, INPUT_KINDS))
        weights.append(w)
        logical[name[0]] = w.detach().cpu().clone()
    for name, x in (("q", args.q), ("k", args.k)):  # a weight placed on q's bytes changed them
        if x is not None:
            args.logical[name] = x.detach().cpu().clone()
    reads = dict(cos=args.cos, sin=args.sin, positions=args.kwargs["positions"], cu_seqlens=args.kwargs["cu_seqlens"],
                 q_weight=weights[0], k_weight=weights[1])
    aliased, spans = pool_overlaps(args.arena, args.spec, {"q": args.q, "k": args.k} if args.kwargs["inplace"] else {},
                                   {n: t for n, t in reads.items() if isinstance(t, torch.Tensor)})
    for why in aliased:
        args.refuse(why)
    if spans:
        args.either.append("byte spans that meet, elements apart")
    eps, weight_offset = rng.choice((1e-6, 1e-5)), rng.choice((0.0, 1.0)) if weighted else 0.0
    args.kwargs.update(eps=eps, weight_offset=weight_offset, norm=placement, norm_over=norm_over)
    args.spec.update(eps=eps, weight_offset=weight_offset, norm=placement, norm_over=norm_over,
                     q_weight=_shape(weights[0]), k_weight=_shape(weights[1]))

    def normed(x, name):
        return _rms_norm(x, logical.get(name), eps, weight_offset, norm_over == "heads")

    def identity(x, name):
        return x

    # (after the rotation the tail is normalised too: transform and after are never both None)
    return rope_case("qk_norm_rope", args, ropekit.qk_norm_rope, gen, extra=tuple(weights),
                     transform=normed if placement == "before" else identity,
                     after=normed if placement == "after" else None)


def _shape(t):
    return None if t is None else {"shape": tuple(t.shape), "stride": t.stride(), "dtype": str(t.dtype)}


def draw_rotary_embedding(rng: random.Random, gen: torch.Generator, device,
                          op_name: str = "rotary_embedding") -> Case:
    """The engines' in-place ``op(positions, query, key, head_size, cos_sin_cache, is_neox)`` (vLLM's
    ``rotary_embedding``, FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``)."""
    arena = Arena(rng, gen, device)
    expect, why_raise, either = MATCH, [], []
    tokens, hq, hk = rng.randint(0, 6), rng.randint(1, 3), rng.choice((None, 1, 2))
    head_size = rng.choice((8, 16))
    rotary_dim = rng.choice((head_size, head_size // 2))
    is_neox, flat, packed = rng.random() < 0.6, rng.random() < 0.5, hk is not None and rng.random() < 0.4
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    rows = rng.randint(1, 10)
    hostile, check_mode = rng.random() < 0.2, rng.random() < 0.2

    def heads(n):
        return (tokens, n * head_size) if flat else (tokens, n, head_size)

    if packed:  # query, key (and value) as column slices of one projection's output, as engines pass them
        hv = rng.randint(0, 2)
        qkv = arena.place("qkv", (tokens, (hq + hk + hv) * head_size), dtype, rng.choice(("contiguous", "padded")))
        query, key = qkv[:, :hq * head_size], qkv[:, hq * head_size:(hq + hk) * head_size]
        if not flat:
            query, key = query.unflatten(-1, (hq, head_size)), key.unflatten(-1, (hk, head_size))
    else:
        query = arena.place("query", heads(hq), dtype, pick(rng, INPUT_KINDS))
        key = None if hk is None else arena.place("key", heads(hk), dtype, pick(rng, INPUT_KINDS))
    cache_dtype = rng.choice((torch.float32, dtype))
    cache = arena.place("cos_sin_cache", (rows, rotary_dim), cache_dtype, pick(rng, INPUT_KINDS))
    positions = arena.place("positions", (tokens,), rng.choice((torch.int64, torch.int32)),
                            pick(rng, INDEX_KINDS), position_values(gen, 0, rows - 1, hostile, rows))
    pos = positions.detach().cpu().to(torch.int64)
    if bool(((pos < 0) | (pos >= rows)).any()) and check_mode:
        expect, why_raise = RAISE, why_raise + ["check mode: positions outside the cache"]
    overlap = any(t is not None and self_overlapping(t) for t in (query, key))
    if key is not None and arena.buffer_of(key) is arena.buffer_of(query):
        base = arena.buffer_of(query).base
        overlap = overlap or bool((footprint(query, base) & footprint(key, base)).any())
    if overlap:
        expect, why_raise = RAISE, why_raise + ["in place on overlapping memory"]
    for t in (query, key):
        if t is not None:
            arena.allow_writes(t)
            if flat and t.stride(-1) != 1 and t.shape[-1] > 1:
                either.append("a flat query/key whose channels are strided (split into heads or refused)")
    if tokens == 0:
        either.append("no tokens")
    logical = {"query": query.detach().cpu().clone(), "key": None if key is None else key.detach().cpu().clone(),
               "cache": cache.detach().cpu().to(torch.float64)}
    spec = dict(op=op_name, tokens=tokens, hq=hq, hk=hk, head_size=head_size, rotary_dim=rotary_dim, is_neox=is_neox,
                flat=flat, packed=packed, dtype=str(dtype), cache_dtype=str(cache_dtype), rows=rows,
                positions=pos.tolist(), check_mode=check_mode, query=_shape(query), key=_shape(key),
                cos_sin_cache=_shape(cache))

    def check(result) -> list[str]:
        problems = [] if result is None else ["returned something other than None"]
        valid = (pos >= 0) & (pos < rows)
        row = logical["cache"][pos.clamp(0, rows - 1)]
        half = rotary_dim // 2
        nan = torch.full_like(row[:, :half], float("nan"))
        cos = torch.where(valid[:, None], row[:, :half], nan)[:, None, :]
        sin = torch.where(valid[:, None], row[:, half:rotary_dim], nan)[:, None, :]
        for name, t, n_heads in (("query", query, hq), ("key", key, hk)):
            if t is None:
                continue
            x = logical[name].to(torch.float64).reshape(tokens, n_heads, head_size)
            rotated = ref.rotate_pairs(x[..., :rotary_dim], cos, sin, interleaved=not is_neox)
            want = torch.cat((rotated, x[..., rotary_dim:]), -1).reshape(t.shape)
            message = check_close_to_reference(t, want)
            if message is not None:
                problems.append(f"{name}: {message}")
            if not same_bits(t[..., rotary_dim:] if not flat else t.unflatten(-1, (n_heads, head_size))[..., rotary_dim:],
                             logical[name][..., rotary_dim:] if not flat else
                             logical[name].unflatten(-1, (n_heads, head_size))[..., rotary_dim:]):
                problems.append(f"{name}: the channels past rotary_dim changed")
        return problems

    op = getattr(ropekit, op_name)
    return Case(op_name, spec, arena, lambda: op(positions, query, key, head_size, cache, is_neox), check,
                expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap, inplace_targets=[t for t in (query, key) if t is not None and t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"})


def draw_flashinfer(rng: random.Random, gen: torch.Generator, device) -> Case:
    return draw_rotary_embedding(rng, gen, device, "apply_rope_with_cos_sin_cache_inplace")


TARGETS = {name: draw for name, draw in (("qk_norm_rope", draw_qk_norm_rope),
                                         ("rotary_embedding", draw_rotary_embedding),
                                         ("apply_rope_with_cos_sin_cache_inplace", draw_flashinfer))
           if hasattr(ropekit, name)}
