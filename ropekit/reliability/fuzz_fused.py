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

from .cache_args import CACHE_KINDS, draw_slots
from .cache_readback import cache_problems, refusals
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
    """``qk_norm_rope`` with apply_rope's hostile arguments (M-RoPE positions, and table-free angles: ``inv_freq``
    and ``scale``, among them) and its own weights (or none), the norm before or after the rotation, over each head
    or across all heads (``norm_over``); in a share of the cases q and one tensor it reads (a weight, a table, the
    inverse frequencies, positions or cu_seqlens) carved from one byte pool: apart, or on each other's bytes in place
    (to be refused; out of place both are only read)."""
    arena, inplace = Arena(rng, gen, device), None
    placement, weighted = rng.choice(("before", "after")), rng.random() < 0.7
    norm_over = rng.choice(("head", "heads"))
    if rng.random() < 0.3:
        apart = rng.random() < 0.25
        partners = (("q_weight", "k_weight") if weighted else ()) + ("cos", "sin", "inv_freq", "positions",
                                                                     "cu_seqlens")
        arena.share("q", rng.choice(partners), apart=apart)
        inplace = None if apart else True
    args = draw_rope_args(rng, gen, device, conjugate=False, arena=arena, inplace=inplace, mrope=True, angles=True)
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
                 q_weight=weights[0], k_weight=weights[1], inv_freq=args.kwargs.get("inv_freq"))
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
    ``rotary_embedding``, FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``); for vLLM's, ``rope_dim_offset``
    (the last channels rotated at times; rarely negative or past the head: refused) and ``inverse``; for
    FlashInfer's, ``enable_pdl`` and in a share of the cases SGLang's ``fused_set_kv_buffer_arg``
    (:func:`_draw_kv_buffer`)."""
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
    kv_write = None
    if op_name == "apply_rope_with_cos_sin_cache_inplace" and rng.random() < (0.3 if hk is not None else 0.02):
        v_slice = qkv[:, (hq + hk) * head_size:] if packed and hv == hk else None
        kv_write, kv_why = _draw_kv_buffer(rng, arena, tokens, hk, head_size, dtype, flat, v_slice, hostile,
                                           check_mode)
        if kv_why:
            expect, why_raise = RAISE, why_raise + kv_why
        if flat and kv_write["arg"].value.stride(-1) != 1 and kv_write["arg"].value.shape[-1] > 1:
            either.append("a flat value whose channels are strided (split into heads or refused)")
    # the op's own switches: vLLM's rotated channels' offset and inverse rotation, FlashInfer's launch hint
    offset, inverse, extra = 0, False, {}
    if op_name == "rotary_embedding":
        offset, inverse = rng.choice((0, 0, head_size - rotary_dim)), rng.random() < 0.2
        if rng.random() < 0.015:
            offset = rng.choice((-1, head_size - rotary_dim + 1))
            expect, why_raise = RAISE, why_raise + ["a rope_dim_offset outside the head"]
        extra = dict(rope_dim_offset=offset, inverse=inverse) if offset or inverse or rng.random() < 0.3 else {}
    elif rng.random() < 0.3:
        extra = dict(enable_pdl=rng.random() < 0.5)
    cache_dtype = rng.choice((torch.float32, dtype))
    cache = arena.place("cos_sin_cache", (rows, rotary_dim), cache_dtype, pick(rng, INPUT_KINDS))
    positions = arena.place("positions", (tokens,), rng.choice((torch.int64, torch.int32)),
                            pick(rng, INDEX_KINDS), position_values(gen, 0, rows - 1, hostile, rows))
    pos = positions.detach().cpu().to(torch.int64)
    if bool(((pos < 0) | (pos >= rows)).any()) and check_mode:
        expect, why_raise = RAISE, why_raise + ["check mode: positions outside the cache"]
    # (query and key are written in place, whatever channels rope_dim_offset rotates: neither may overlap itself or
    # the other, PyTorch's in-place rule)
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
                cos_sin_cache=_shape(cache), fused_set_kv_buffer_arg=None if kv_write is None else kv_write["spec"],
                **extra)
    channels = slice(offset, offset + rotary_dim)  # (the rotated ones; the others pass through)

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
            rotated = ref.rotate_pairs(x[..., channels], cos, sin, interleaved=not is_neox, conjugate=inverse)
            want = torch.cat((x[..., :offset], rotated, x[..., offset + rotary_dim:]), -1).reshape(t.shape)
            message = check_close_to_reference(t, want)
            if message is not None:
                problems.append(f"{name}: {message}")
            by_head = [u.reshape(tokens, n_heads, head_size) for u in (t.detach().cpu(), logical[name])]
            if not all(same_bits(*(u[..., part] for u in by_head)) for part in (slice(0, offset),
                                                                                slice(offset + rotary_dim, None))):
                problems.append(f"{name}: the channels outside the rotated ones changed")
            if name == "key" and kv_write is not None:  # the pools' rows at cache_loc: the rotated key, the value
                problems += kv_write["check"](want.reshape(tokens, hk, head_size))
        return problems

    op = getattr(ropekit, op_name)
    if kv_write is not None:
        extra["fused_set_kv_buffer_arg"] = kv_write["arg"]
    return Case(op_name, spec, arena, lambda: op(positions, query, key, head_size, cache, is_neox, **extra), check,
                expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap, inplace_targets=[t for t in (query, key) if t is not None and t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"}, tensors={} if kv_write is None else dict(
                    k_buffer=kv_write["arg"].k_buffer, v_buffer=kv_write["arg"].v_buffer))


def _draw_kv_buffer(rng: random.Random, arena: Arena, tokens: int, hk, head_size: int, dtype: torch.dtype,
                    flat: bool, v_slice, hostile: bool, check_mode: bool) -> tuple[dict, list[str]]:
    """SGLang's ``fused_set_kv_buffer_arg``: ``value`` (the v slice of the packed projection when it has k's heads,
    else its own tensor, flat or by head), token-indexed ``k_buffer`` and ``v_buffer`` pools in the model's dtype
    (flat or by head, padded rows at times), ``cache_loc`` int64 (distinct slots and -1; ``hostile``: past either
    end; in check mode a slot named twice at times), the scales None or 1.0 (rarely another value, or no key:
    refused). Returns ``{"arg", "spec", "check"}`` (``check(rotated_key)``: the pools' problems) and why the call
    must raise."""
    why = []
    heads = 1 if hk is None else hk
    if hk is None:
        why.append("fused_set_kv_buffer_arg without a key")
    if v_slice is not None and rng.random() < 0.7:
        value = v_slice if flat else v_slice.unflatten(-1, (heads, head_size))
    else:
        value = arena.place("value", (tokens, heads * head_size) if flat else (tokens, heads, head_size), dtype,
                            pick(rng, INPUT_KINDS))
    n_slots = rng.randint(max(tokens, 1), tokens + 4)
    pools = {}
    for name in ("k_buffer", "v_buffer"):
        pools[name] = arena.place(name, (n_slots, heads * head_size) if rng.random() < 0.5 else
                                  (n_slots, heads, head_size), dtype, pick(rng, CACHE_KINDS))
        arena.allow_writes(pools[name])
    slots = draw_slots(rng, tokens, n_slots, hostile, repeat=check_mode and rng.random() < 0.3)
    cache_loc = arena.place("cache_loc", (tokens,), torch.int64, pick(rng, INDEX_KINDS),
                            lambda shape: torch.tensor(slots, dtype=torch.int64).reshape(shape))
    scales = dict(k_scale=rng.choice((None, None, 1.0)), v_scale=rng.choice((None, None, 1.0)))
    if rng.random() < 0.03:
        scales[rng.choice(("k_scale", "v_scale"))] = 2.0
        why.append("a scale other than None or 1.0 (the pools hold the model's dtype)")
    why += refusals(check_mode, torch.zeros(0, dtype=torch.int64), 1, slots, n_slots, False)
    arg = ropekit.engines.FusedSetKVBufferArg(value=value, k_buffer=pools["k_buffer"], v_buffer=pools["v_buffer"],
                                              cache_loc=cache_loc, **scales)
    before = {name: t.detach().cpu().clone().reshape(n_slots, heads, head_size) for name, t in pools.items()}
    logical_v = value.detach().cpu().to(torch.float64).reshape(tokens, heads, head_size)

    def check(rotated_key: torch.Tensor) -> list[str]:
        after = {name: t.detach().cpu().reshape(n_slots, heads, head_size) for name, t in pools.items()}
        return (cache_problems("k_buffer", after["k_buffer"], before["k_buffer"], rotated_key, slots, None, False)
                + cache_problems("v_buffer", after["v_buffer"], before["v_buffer"], logical_v, slots, None, True))

    spec = dict(value=_shape(value), k_buffer=_shape(pools["k_buffer"]), v_buffer=_shape(pools["v_buffer"]),
                cache_loc=slots, **scales)
    return dict(arg=arg, spec=spec, check=check), why


def draw_flashinfer(rng: random.Random, gen: torch.Generator, device) -> Case:
    return draw_rotary_embedding(rng, gen, device, "apply_rope_with_cos_sin_cache_inplace")


TARGETS = {name: draw for name, draw in (("qk_norm_rope", draw_qk_norm_rope),
                                         ("rotary_embedding", draw_rotary_embedding),
                                         ("apply_rope_with_cos_sin_cache_inplace", draw_flashinfer))
           if hasattr(ropekit, name)}
