"""The fuzzer's targets for the fused ops that write a KV cache: ``ropekit.rope_and_cache`` (a paged cache, QK-norm
optional, float8 caches with their scales) and ``ropekit.mla_rope_and_cache`` (MLA's latent cache). Caches, slot
mappings and scales are drawn like the activations: views with guard elements around them, slots that are -1, out of
range or (in check mode) repeated, positions past the table. The check: every written slot holds the float64
reference (within the dtype's bound, or one e4m3 spacing of value / scale; v's bits exactly), every other cache
element and every input is bitwise unchanged (the arena's check), and in check mode a bad slot or position raises."""

from __future__ import annotations

import random

import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import check_close_to_reference, ulp

from .fuzz import EITHER, MATCH, RAISE, Arena, Case, same_bits, self_overlapping
from .rope_args import DTYPES, INDEX_KINDS, INPUT_KINDS, pick, position_values

__all__ = ["TARGETS", "draw_rope_and_cache", "draw_mla_rope_and_cache"]

FP8 = torch.float8_e4m3fn
# caches are written: no view kind in which two indices name one element
_CACHE_KINDS = (("contiguous", 3), ("padded", 2))


def _slots(rng: random.Random, tokens: int, n_slots: int, hostile: bool, repeat: bool) -> list[int]:
    """One slot a token: distinct slots of the cache or -1 (skip); ``hostile`` adds slots past either end of the
    cache, ``repeat`` names one slot twice."""
    free = rng.sample(range(n_slots), min(tokens, n_slots))
    slots = [free[t] if t < len(free) and rng.random() < 0.85 else -1 for t in range(tokens)]
    if hostile and tokens:
        slots[rng.randrange(tokens)] = rng.choice((n_slots, n_slots + 7, -2, 2**40))
    if repeat and tokens >= 2:
        slots[1] = slots[0] = max(slots[0], 0)
    return slots


def _place_cache(arena: Arena, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    kind = pick(arena.rng, _CACHE_KINDS)
    if dtype == FP8:  # random bytes, NaN encodings among them: untouched slots are compared bit for bit
        return arena.place(name, shape, torch.uint8, kind).view(FP8)
    return arena.place(name, shape, dtype, kind)


def _refusals(check_mode: bool, positions: torch.Tensor, rows: int, slots: list[int], n_slots: int,
              overlap: bool) -> list[str]:
    """Why the call must raise (empty: it must not): check mode's position and slot checks, in-place overlap."""
    reasons = []
    if check_mode and bool(((positions < 0) | (positions >= rows)).any()):
        reasons.append("check mode: positions outside the table")
    if check_mode and any(s >= n_slots or s < -1 for s in slots):
        reasons.append("check mode: a slot outside the cache")
    if check_mode and len({s for s in slots if s >= 0}) < sum(s >= 0 for s in slots):
        reasons.append("check mode: two tokens name one slot")
    if overlap:
        reasons.append("in place on overlapping memory")
    return reasons


def _table_rows(logical: dict, pos: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """The float64 cos and sin rows at ``pos`` (shape ``pos.shape + (half,)``), NaN where a position is outside the
    table's ``rows`` (the kernel's documented result there)."""
    valid = (pos >= 0) & (pos < rows)
    return [torch.where(valid[..., None], logical[t].to(torch.float64)[pos.clamp(0, rows - 1)],
                        torch.tensor(float("nan"), dtype=torch.float64)) for t in ("cos", "sin")]


def _cache_problems(name: str, after: torch.Tensor, before: torch.Tensor, want: torch.Tensor, slots: list[int],
                    scale, exact: bool) -> list[str]:
    """``after``/``before``: the cache as one row per slot (CPU); ``want``: the float64 rows, one a token."""
    valid = [(t, s) for t, s in enumerate(slots) if 0 <= s < after.shape[0]]
    untouched = torch.ones(after.shape[0], dtype=torch.bool)
    untouched[[s for _, s in valid]] = False
    problems = []
    if not same_bits(after[untouched], before[untouched]):
        problems.append(f"{name}: a slot no token names changed")
    if not valid:
        return problems
    got = after[[s for _, s in valid]]
    expected = want[[t for t, _ in valid]]
    if after.dtype == FP8:
        quotient = expected / float(scale)
        if exact:  # v (exact in float32): one float32 division, then e4m3 (ties to even, saturating)
            quotient32 = (expected.to(torch.float32) / torch.tensor(scale, dtype=torch.float32)).to(torch.float64)
            if not same_bits(got, ref.e4m3(quotient32).to(FP8)):
                problems.append(f"{name}: float8 bits differ from e4m3(v / scale)")
        else:
            target = quotient.clamp(-448.0, 448.0)
            error = (got.to(torch.float64) - target).abs()
            ok = (error <= ulp(target, FP8)) | (torch.isnan(target) & torch.isnan(got.to(torch.float64)))
            if not bool(ok.all()):
                problems.append(f"{name}: float8 values more than one e4m3 spacing from the reference / scale")
    elif exact:
        if not same_bits(got, expected.to(after.dtype)):
            problems.append(f"{name}: not v bit for bit")
    else:
        message = check_close_to_reference(got, expected)
        if message is not None:
            problems.append(f"{name}: {message}")
    return problems


def draw_rope_and_cache(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``rope_and_cache`` on a paged cache: (1, tokens, heads, head_dim) q, k, v with any view kind, position ids,
    QK-norm or not, in place or not, a cache in the activations' dtype or float8 e4m3."""
    arena = Arena(rng, gen, device)
    either = []
    tokens, hq, hk = rng.randint(0, 6), rng.randint(1, 3), rng.randint(1, 2)
    head_dim = rng.choice((8, 16))
    rotary_dim, v_dim = rng.choice((head_dim, head_dim // 2)), rng.choice((head_dim, 8))
    interleaved, norm, inplace = rng.random() < 0.4, rng.random() < 0.4, rng.random() < 0.5
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    cache_dtype = FP8 if dtype != torch.float64 and rng.random() < 0.3 else dtype
    hostile, check_mode = rng.random() < 0.25, rng.random() < 0.2
    rows, block_size, num_blocks = rng.randint(1, 12), rng.choice((1, 2, 4)), rng.randint(1, 4)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    q = arena.place("q", (1, tokens, hq, head_dim), dtype, pick(rng, INPUT_KINDS))
    k = arena.place("k", (1, tokens, hk, head_dim), dtype, pick(rng, INPUT_KINDS))
    v = arena.place("v", (1, tokens, hk, v_dim), dtype, pick(rng, INPUT_KINDS))
    cos = arena.place("cos", (rows, rotary_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
    sin = arena.place("sin", (rows, rotary_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
    positions = arena.place("positions", (1, tokens), rng.choice((torch.int64, torch.int32)), pick(rng, INDEX_KINDS),
                            position_values(gen, 0, rows - 1, hostile, rows))
    k_cache = _place_cache(arena, "k_cache", (num_blocks, block_size, hk, head_dim), cache_dtype)
    v_cache = _place_cache(arena, "v_cache", (num_blocks, block_size, hk, v_dim), cache_dtype)
    n_slots = num_blocks * block_size
    slots = _slots(rng, tokens, n_slots, hostile, repeat=check_mode and rng.random() < 0.3)
    slot_mapping = arena.place("slot_mapping", (tokens,), torch.int64, pick(rng, INDEX_KINDS),
                               lambda shape: torch.tensor(slots, dtype=torch.int64).reshape(shape))
    kwargs = dict(k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping, positions=positions,
                  interleaved=interleaved, inplace=inplace)
    if cache_dtype == FP8:
        kwargs.update(k_scale=arena.place("k_scale", (1,), torch.float32, values=lambda s: torch.full(s, rng.choice(
                          (0.05, 1.0, 3.0)))),
                      v_scale=arena.place("v_scale", (1,), torch.float32, values=lambda s: torch.full(s, rng.choice(
                          (0.003, 1.0, 0.5)))))
    eps, weight_offset = 1e-6, rng.choice((0.0, 1.0))
    if norm:
        kwargs.update(q_weight=arena.place("q_weight", (head_dim,), dtype), eps=eps, weight_offset=weight_offset,
                      k_weight=arena.place("k_weight", (head_dim,), dtype))

    pos = positions.detach().cpu().to(torch.int64)
    overlap = inplace and self_overlapping(q)
    why_raise = _refusals(check_mode, pos, rows, slots, n_slots, overlap)
    expect = RAISE if why_raise else MATCH
    if inplace:
        arena.allow_writes(q)
    arena.allow_writes(k_cache)
    arena.allow_writes(v_cache)
    if tokens == 0:
        either.append("no tokens")

    logical = {name: t.detach().cpu().clone() for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos),
                                                               ("sin", sin))}
    weights = {name: kwargs[name].detach().cpu() for name in ("q_weight", "k_weight") if name in kwargs}
    caches_before = [c.detach().cpu().clone() for c in (k_cache, v_cache)]
    scales = [float(kwargs[name]) for name in ("k_scale", "v_scale")] if cache_dtype == FP8 else [None, None]
    spec = dict(op="rope_and_cache", tokens=tokens, hq=hq, hk=hk, head_dim=head_dim, rotary_dim=rotary_dim,
                v_dim=v_dim, interleaved=interleaved, norm=norm, inplace=inplace, dtype=str(dtype),
                cache_dtype=str(cache_dtype), rows=rows, block_size=block_size, num_blocks=num_blocks, slots=slots,
                positions=pos.tolist(), scales=scales, check_mode=check_mode)

    def rotated(name: str) -> torch.Tensor:
        x = logical[name].to(torch.float64)
        if norm:
            x = ref.rms_norm(x, weights[name + "_weight"], eps=eps, weight_offset=weight_offset)
        table = _table_rows(logical, pos, rows)
        turned = ref.rotate_pairs(x[..., :rotary_dim], table[0][..., None, :], table[1][..., None, :],
                                  interleaved=interleaved)
        return torch.cat((turned, x[..., rotary_dim:]), -1)

    def check(result) -> list[str]:
        q_out, k_out = result
        problems = [] if k_out is None else ["returned a rotated k without write_k"]
        if inplace and q_out is not q:
            problems.append("in place, but the returned q is not q")
        message = check_close_to_reference(q_out, rotated("q"))
        if message is not None:
            problems.append(f"q: {message}")
        for name, cache, before, want, scale, exact in (
                ("k_cache", k_cache, caches_before[0], rotated("k"), scales[0], False),
                ("v_cache", v_cache, caches_before[1], logical["v"].to(torch.float64), scales[1], True)):
            flat = cache.detach().cpu().reshape(n_slots, *cache.shape[2:])
            problems += _cache_problems(name, flat, before.reshape(n_slots, *cache.shape[2:]), want[0], slots,
                                        scale, exact)
        return problems

    return Case("rope_and_cache", spec, arena, lambda: ropekit.rope_and_cache(q, k, v, cos, sin, **kwargs), check,
                expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap, inplace_targets=[t for t in ((q,) if inplace else ()) if t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"},
                tensors=dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping))


def draw_mla_rope_and_cache(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``mla_rope_and_cache``: q_pe (tokens, heads, rope_dim) and the shared k_pe (tokens, rope_dim) rotated, the row
    ``[kv_c | rotated k_pe]`` written at each token's slot of a paged latent cache (float8 with one scale, or the
    activations' dtype); GPT-J or NeoX pairing; in place (the engines' contract) or not."""
    arena = Arena(rng, gen, device)
    either = []
    tokens, heads, rope_dim, latent = rng.randint(0, 6), rng.randint(1, 4), rng.choice((8, 16)), rng.choice((8, 32))
    interleaved, inplace = rng.random() < 0.7, rng.random() < 0.7
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    cache_dtype = FP8 if dtype != torch.float64 and rng.random() < 0.3 else dtype
    hostile, check_mode = rng.random() < 0.25, rng.random() < 0.2
    rows, block_size, num_blocks = rng.randint(1, 12), rng.choice((1, 2, 4)), rng.randint(1, 4)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    q_pe = arena.place("q_pe", (tokens, heads, rope_dim), dtype, pick(rng, INPUT_KINDS))
    k_pe = arena.place("k_pe", (tokens, rope_dim), dtype, pick(rng, INPUT_KINDS))
    kv_c = arena.place("kv_c", (tokens, latent), dtype, pick(rng, INPUT_KINDS))
    cos = arena.place("cos", (rows, rope_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
    sin = arena.place("sin", (rows, rope_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
    positions = arena.place("positions", (tokens,), rng.choice((torch.int64, torch.int32)), pick(rng, INDEX_KINDS),
                            position_values(gen, 0, rows - 1, hostile, rows))
    kv_cache = _place_cache(arena, "kv_cache", (num_blocks, block_size, latent + rope_dim), cache_dtype)
    n_slots = num_blocks * block_size
    slots = _slots(rng, tokens, n_slots, hostile, repeat=check_mode and rng.random() < 0.3)
    slot_mapping = arena.place("slot_mapping", (tokens,), torch.int64, pick(rng, INDEX_KINDS),
                               lambda shape: torch.tensor(slots, dtype=torch.int64).reshape(shape))
    scale = (arena.place("kv_cache_scale", (1,), torch.float32, values=lambda s: torch.full(s, rng.choice(
        (0.05, 1.0, 2.0)))) if cache_dtype == FP8 else None)

    pos = positions.detach().cpu().to(torch.int64)
    overlap = inplace and (self_overlapping(q_pe) or self_overlapping(k_pe))
    why_raise = _refusals(check_mode, pos, rows, slots, n_slots, overlap)
    expect = RAISE if why_raise else MATCH
    if inplace:
        arena.allow_writes(q_pe)
        arena.allow_writes(k_pe)
    arena.allow_writes(kv_cache)
    if tokens == 0:
        either.append("no tokens")
    logical = {name: t.detach().cpu().clone() for name, t in (("q_pe", q_pe), ("k_pe", k_pe), ("kv_c", kv_c),
                                                               ("cos", cos), ("sin", sin))}
    before = kv_cache.detach().cpu().clone().reshape(n_slots, -1)
    scale_value = None if scale is None else float(scale)
    spec = dict(op="mla_rope_and_cache", tokens=tokens, heads=heads, rope_dim=rope_dim, latent=latent,
                interleaved=interleaved, inplace=inplace, dtype=str(dtype), cache_dtype=str(cache_dtype), rows=rows,
                block_size=block_size, num_blocks=num_blocks, slots=slots, positions=pos.tolist(),
                scale=scale_value, check_mode=check_mode)

    def rotated(name: str) -> torch.Tensor:  # (tokens, ..., rope_dim) rotated at each token's position
        x = logical[name].to(torch.float64)
        table = _table_rows(logical, pos, rows)
        shape = (tokens,) + (1,) * (x.ndim - 2) + (rope_dim // 2,)
        return ref.rotate_pairs(x, table[0].reshape(shape), table[1].reshape(shape), interleaved=interleaved)

    def check(result) -> list[str]:
        q_out, k_out = result
        problems = []
        if inplace and (q_out.data_ptr() != q_pe.data_ptr() or k_out.data_ptr() != k_pe.data_ptr()):
            problems.append("in place, but the returned tensors are not q_pe and k_pe")
        for name, got in (("q_pe", q_out), ("k_pe", k_out)):
            message = check_close_to_reference(got, rotated(name))
            if message is not None:
                problems.append(f"{name}: {message}")
        after = kv_cache.detach().cpu().reshape(n_slots, -1)
        problems += _cache_problems("kv_cache (latent part)", after[:, :latent], before[:, :latent],
                                    logical["kv_c"].to(torch.float64), slots, scale_value, True)
        problems += _cache_problems("kv_cache (rope part)", after[:, latent:], before[:, latent:], rotated("k_pe"),
                                    slots, scale_value, False)
        return problems

    return Case("mla_rope_and_cache", spec, arena,
                lambda: ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slot_mapping, positions, cos, sin,
                                                   interleaved=interleaved, inplace=inplace, kv_cache_scale=scale),
                check, expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap, inplace_targets=[t for t in ((q_pe, k_pe) if inplace else ()) if t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"},
                tensors=dict(q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, kv_cache=kv_cache, slot_mapping=slot_mapping))


TARGETS = {name: draw for name, draw in (("rope_and_cache", draw_rope_and_cache),
                                         ("mla_rope_and_cache", draw_mla_rope_and_cache)) if hasattr(ropekit, name)}
