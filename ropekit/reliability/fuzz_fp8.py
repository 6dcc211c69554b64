"""The fuzzer's targets for FlashInfer's float8 calls (:mod:`ropekit.engines`): ``rope_quantize_fp8`` (q and k rotated
and every part, rotary or not, times its scale as float8; MLA's 2-D ``k_rope`` at times; the outputs given or new)
and ``rope_quantize_fp8_append_paged_kv_cache`` (the same q, and k and v appended to a float8 paged cache through
FlashInfer's page table, NHD or HND, or MLA's two caches). Every tensor is drawn with its own dtype, view and values
(positions past the table, a page table with FlashInfer's -1 and, hostile, entries check mode refuses), the scales
and ``quantize_dtype`` from a few values (rarely invalid), and the outputs and caches as float8 views of bytes with
guards around them. The check: each rotary part within one float8 spacing of the float64 rotation times its scale
(NaN where a position lies past the table), each non-rotary part PyTorch's float32 product cast (saturating) bit for
bit, given outputs returned and written, every cache row no token names and every input bitwise unchanged, and a
refused call writes nothing."""

from __future__ import annotations

import random

import torch

import ropekit
from ropekit import reference as ref

from .cache_args import CACHE_KINDS, E5M2, FP8, PAGE_TABLE, draw_page_table
from .cache_readback import cache_problems, table_rows
from .fuzz import EITHER, MATCH, RAISE, Arena, Case, same_bits
from .rope_args import DTYPES, INDEX_KINDS, INPUT_KINDS, pick, position_values

__all__ = ["TARGETS", "draw_rope_quantize_fp8", "draw_rope_quantize_fp8_append_paged_kv_cache"]

# quant_scale_q and quant_scale_kv: powers of two (FlashInfer's product and ropekit's division by the reciprocal
# agree) and one that is not (they may differ by one float8 step at a rounding tie: the bound is one spacing)
_SCALES = (1.0, 2.0, 0.5, 0.3)


def _float8(arena: Arena, name: str, shape: tuple, fmt: torch.dtype, rng: random.Random) -> torch.Tensor:
    """A written float8 tensor as its bytes with guards around them, read through a ``fmt`` view."""
    return arena.place(name, shape, torch.uint8, pick(rng, CACHE_KINDS)).view(fmt)


def _common(rng: random.Random, gen: torch.Generator, arena: Arena, mla: bool) -> dict:
    """What both calls draw: q_rope and k_rope (MLA: a 2-D k_rope), q's non-rotary part, the engines'
    ``cos_sin_cache``, ``pos_ids`` (past the table at times), pairing, ``quantize_dtype`` and the two scales (rarely
    invalid: named in ``why``), check mode."""
    why, either = [], []
    tokens, hq, hk = rng.randint(0, 5), rng.randint(1, 3), 1 if mla else rng.randint(1, 2)
    rope_dim, q_nope_dim = rng.choice((8, 16)), rng.choice((0, 8, 16))
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    rows = rng.randint(1, 10)
    hostile, check_mode = rng.random() < 0.25, rng.random() < 0.2
    fmt = rng.choice((FP8, E5M2))
    quantize_dtype = fmt if rng.random() < 0.7 else None  # None: the given outputs' dtype, else e4m3
    if rng.random() < 0.03:
        quantize_dtype = rng.choice((torch.int8, torch.float16))
        why.append("a quantize_dtype that is not float8")
    scales = {name: rng.choice(_SCALES) for name in ("quant_scale_q", "quant_scale_kv")}
    if rng.random() < 0.03:
        name = rng.choice(sorted(scales))
        scales[name] = rng.choice((0.0, -1.0, float("nan")))
        why.append(f"{name} not a finite float > 0")
    q_rope = arena.place("q_rope", (tokens, hq, rope_dim), dtype, pick(rng, INPUT_KINDS))
    k_rope = arena.place("k_rope", (tokens,) + (() if mla else (hk,)) + (rope_dim,), dtype, pick(rng, INPUT_KINDS))
    q_nope = arena.place("q_nope", (tokens, hq, q_nope_dim), dtype, pick(rng, INPUT_KINDS)) if q_nope_dim else None
    table_dtype = torch.float64 if dtype == torch.float64 else rng.choice((torch.float32, dtype))
    width = rope_dim if rng.random() > 0.03 else 2 * rope_dim
    if width != rope_dim:
        why.append("a cos_sin_cache wider than rope_dim")
    cos_sin_cache = arena.place("cos_sin_cache", (rows, width), table_dtype, pick(rng, INPUT_KINDS))
    length = tokens if rng.random() > 0.03 else tokens + 1
    if length != tokens:
        why.append("pos_ids longer than the tokens")
    pos_ids = arena.place("pos_ids", (length,), rng.choice((torch.int32, torch.int64)), pick(rng, INDEX_KINDS),
                          position_values(gen, 0, rows - 1, hostile, rows))
    pos = pos_ids.detach().cpu().to(torch.int64)[:tokens]
    if check_mode and bool(((pos < 0) | (pos >= rows)).any()):
        why.append("check mode: positions outside the table")
    if tokens == 0:
        either.append("no tokens")
    return dict(tokens=tokens, hq=hq, hk=hk, rope_dim=rope_dim, dtype=dtype, rows=rows, check_mode=check_mode,
                fmt=fmt, quantize_dtype=quantize_dtype, scales=scales, q_rope=q_rope, k_rope=k_rope, q_nope=q_nope,
                cos_sin_cache=cos_sin_cache, pos_ids=pos_ids, pos=pos, is_neox=rng.random() < 0.6, why=why,
                either=either, logical={"cos_sin_cache": cos_sin_cache.detach().cpu().clone()})


def _rotated(d: dict, x: torch.Tensor) -> torch.Tensor:
    """``x`` (``(tokens, ..., rope_dim)``) rotated at each token's ``pos_ids`` by the cos_sin_cache's float64 rows
    (NaN past the table), in float64 on the CPU."""
    half = d["rope_dim"] // 2
    table = d["logical"]["cos_sin_cache"]
    rows = table_rows({"cos": table[:, :half], "sin": table[:, half:2 * half]}, d["pos"], d["rows"])
    shape = (d["tokens"],) + (1,) * (x.ndim - 2) + (half,)
    return ref.rotate_pairs(x.detach().cpu().to(torch.float64), rows[0].reshape(shape), rows[1].reshape(shape),
                            interleaved=not d["is_neox"])


def _nope_problems(name: str, got, x, scale: float, fmt: torch.dtype, like: torch.Tensor) -> list[str]:
    """A non-rotary part: PyTorch's ``x * scale`` in float32, saturating, cast to ``fmt``, bit for bit (an absent
    part: an empty one of ``like``'s tokens and heads)."""
    if x is None:
        want_shape = (*like.shape[:-1], 0)
        return [] if tuple(got.shape) == want_shape and got.dtype == fmt else [
            f"{name}: an absent part came back as {got.dtype} {tuple(got.shape)}, not {fmt} {want_shape}"]
    largest = torch.finfo(fmt).max
    want = (x.detach().cpu().float() * scale).clamp(-largest, largest).to(fmt)
    if got.dtype != fmt or tuple(got.shape) != tuple(x.shape):
        return [f"{name}: {got.dtype} {tuple(got.shape)}, not {fmt} {tuple(x.shape)}"]
    return [] if same_bits(got.detach().cpu(), want) else [f"{name}: not the float32 product's {fmt} cast, bit for bit"]


def _rotary_problems(name: str, got, want: torch.Tensor, fmt: torch.dtype) -> list[str]:
    """A rotary part: within one ``fmt`` spacing of ``want`` (the float64 rotation times its scale), saturating (NaN
    where the rotation is NaN)."""
    if got.dtype != fmt or tuple(got.shape) != tuple(want.shape):
        return [f"{name}: {got.dtype} {tuple(got.shape)}, not {fmt} {tuple(want.shape)}"]
    flat = got.detach().cpu().reshape(-1, want.shape[-1])
    return cache_problems(name, flat, flat, want.reshape(-1, want.shape[-1]), list(range(flat.shape[0])), 1.0, False)


def _format(quantize_dtype, outputs: dict, drawn: torch.dtype) -> torch.dtype:
    """The format the call writes: ``quantize_dtype``, or when None the first given output's dtype, else e4m3 (an
    invalid ``quantize_dtype``, refused: the ``drawn`` one, that the tensors are placed in)."""
    if quantize_dtype is None:
        return next(iter(outputs.values())).dtype if outputs else FP8
    return quantize_dtype if quantize_dtype in (FP8, E5M2) else drawn


def _expectation(why: list, either: list) -> str:
    return RAISE if why else EITHER if either else MATCH


def draw_rope_quantize_fp8(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``rope_quantize_fp8``: q_rope, k_rope (MLA's 2-D one at times) and their non-rotary parts (or None), each
    output given (a float8 view of bytes, rarely of another dtype or shape: refused) or left to the call."""
    arena = Arena(rng, gen, device)
    mla = rng.random() < 0.3
    d = _common(rng, gen, arena, mla)
    why, either, tokens, fmt = d["why"], d["either"], d["tokens"], d["fmt"]
    k_nope_dim = rng.choice((0, 8))
    k_nope = (arena.place("k_nope", (tokens,) + (() if mla else (d["hk"],)) + (k_nope_dim,), d["dtype"],
                          pick(rng, INPUT_KINDS)) if k_nope_dim else None)
    inputs = dict(q_rope=d["q_rope"], k_rope=d["k_rope"], q_nope=d["q_nope"], k_nope=k_nope)
    outputs = {}
    for name in ("q_rope", "k_rope", "q_nope", "k_nope"):
        like = inputs[name]
        if like is None or rng.random() > 0.3:
            continue
        out_dtype, shape = fmt, tuple(like.shape)
        if rng.random() < 0.04:
            if rng.random() < 0.5:
                out_dtype = torch.bfloat16
            else:
                shape = shape[:-1] + (shape[-1] + 1,)
            why.append(f"{name}_out of another dtype or shape")
        outputs[name + "_out"] = (_float8(arena, name + "_out", shape, out_dtype, rng) if out_dtype == fmt else
                                  arena.place(name + "_out", shape, out_dtype, pick(rng, CACHE_KINDS)))
    fmt = _format(d["quantize_dtype"], outputs, fmt)
    for out in outputs.values():
        arena.allow_writes(out)
    kwargs = dict(is_neox=d["is_neox"], quantize_dtype=d["quantize_dtype"], **d["scales"], **outputs)
    logical = {name: None if x is None else x.detach().cpu().clone() for name, x in inputs.items()}
    spec = dict(op="rope_quantize_fp8", tokens=tokens, hq=d["hq"], hk=d["hk"], mla=mla, rope_dim=d["rope_dim"],
                q_nope=None if d["q_nope"] is None else tuple(d["q_nope"].shape), k_nope_dim=k_nope_dim,
                dtype=str(d["dtype"]), quantize_dtype=str(d["quantize_dtype"]), scales=d["scales"],
                is_neox=d["is_neox"], rows=d["rows"], pos_ids=d["pos_ids"].detach().cpu().tolist(),
                cos_sin_cache=str(d["cos_sin_cache"].dtype), outputs=sorted(outputs), check_mode=d["check_mode"])

    def check(result) -> list[str]:
        problems = []
        if not isinstance(result, tuple) or len(result) != 4:
            return [f"returned {type(result).__name__}, not the four parts"]
        for (name, x), got in zip(logical.items(), result):
            given = outputs.get(name + "_out")
            if given is not None and got is not given:
                problems.append(f"{name}_out was given, but another tensor was returned")
            scale = d["scales"]["quant_scale_q" if name.startswith("q") else "quant_scale_kv"]
            if name.endswith("rope"):
                want = _rotated(d, x if x.ndim == 3 else x[:, None]).reshape(x.shape) * scale
                problems += _rotary_problems(name + "_out", got, want, fmt)
            else:
                problems += _nope_problems(name + "_out", got, x, scale, fmt, logical[name[0] + "_rope"])
        return problems

    return Case("rope_quantize_fp8", spec, arena,
                lambda: ropekit.rope_quantize_fp8(d["q_rope"], d["k_rope"], d["q_nope"], k_nope, d["cos_sin_cache"],
                                                  d["pos_ids"], **kwargs),
                check, expect=_expectation(why, either), why_raise="; ".join(why),
                env={"ROPEKIT_CHECK": "1" if d["check_mode"] else "0"},
                tensors={n: t for n, t in {**inputs, **outputs}.items() if t is not None})


def draw_rope_quantize_fp8_append_paged_kv_cache(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``rope_quantize_fp8_append_paged_kv_cache``: q as ``rope_quantize_fp8`` returns it (``q_rope_out`` and
    ``q_nope_out`` given or not), and k (``[rotated k_rope | k_nope]``) and v appended to float8 ``(k_cache,
    v_cache)`` (NHD or HND, the channels padded in the allocation at times), or MLA's ``(ckv_cache, kpe_cache)``,
    through FlashInfer's page table (int32 or int64, -1 padding; hostile entries check mode refuses); rarely a
    ``page_size`` that is not the caches', caches of another float8 format, a missing v, or a ``k_nope`` whose heads
    or dtype are not k's (refused, before anything is written)."""
    arena = Arena(rng, gen, device)
    mla = rng.random() < 0.3
    d = _common(rng, gen, arena, mla)
    why, either, tokens, fmt, hk, rope_dim = d["why"], d["either"], d["tokens"], d["fmt"], d["hk"], d["rope_dim"]
    dtype = d["dtype"]
    no_rope = rng.choice((8, 16)) if mla else rng.choice((0, 8, 16))
    head_dim = rope_dim + no_rope
    k_nope_shape, k_nope_dtype = (tokens,) + (() if mla else (hk,)) + (no_rope,), dtype
    if no_rope and not mla and rng.random() < 0.04:  # k's non-rotary part unlike k_rope
        if rng.random() < 0.5:
            k_nope_shape = (tokens, hk + 1, no_rope)
        else:
            k_nope_dtype = next(t for t in DTYPES if t != dtype)
        why.append("a k_nope whose heads or dtype are not k_rope's")
    k_nope = arena.place("k_nope", k_nope_shape, k_nope_dtype, pick(rng, INPUT_KINDS)) if no_rope else None
    v = None if mla else arena.place("v", (tokens, hk, head_dim), dtype, pick(rng, INPUT_KINDS))
    if v is not None and rng.random() < 0.02:
        v = None
        why.append("no v for a GQA k")
    outputs = {}
    for name, like in (("q_rope", d["q_rope"]), ("q_nope", d["q_nope"])):
        if like is not None and rng.random() < 0.3:
            outputs[name + "_out"] = _float8(arena, name + "_out", tuple(like.shape), fmt, rng)
    fmt = _format(d["quantize_dtype"], outputs, fmt)
    page_size, num_pages, kv_layout = rng.choice((1, 2, 4)), rng.randint(1, 4), rng.choice(("NHD", "HND"))
    cache_fmt = fmt if rng.random() > 0.03 else (E5M2 if fmt == FP8 else FP8)
    if cache_fmt != fmt:
        why.append("caches of another float8 format than quantize_dtype")
    pad = rng.choice((0, 0, 4))

    def cache(name, *shape):  # the channels padded in the allocation at times
        whole = arena.place(name, shape[:-1] + (shape[-1] + pad,), torch.uint8, pick(rng, CACHE_KINDS))
        return whole[..., :shape[-1]].view(cache_fmt)

    if mla:
        caches = (cache("ckv_cache", num_pages, page_size, no_rope), cache("kpe_cache", num_pages, page_size, rope_dim))
        names = ("ckv_cache", "kpe_cache")
    else:
        inner = (hk, page_size) if kv_layout == "HND" else (page_size, hk)
        caches = (cache("k_cache", num_pages, *inner, head_dim), cache("v_cache", num_pages, *inner, head_dim))
        names = ("k_cache", "v_cache")
    table, slots, table_refusals = draw_page_table(arena, rng, tokens, num_pages, page_size, rng.random() < 0.25,
                                                   repeat=d["check_mode"] and rng.random() < 0.3)
    why += table_refusals if d["check_mode"] else []
    given_page_size = page_size if rng.random() > 0.03 else page_size + 1
    if given_page_size != page_size:
        why.append("a page_size that is not the caches'")
    for written in (*caches, *outputs.values()):
        arena.allow_writes(written)
    kwargs = dict(is_neox=d["is_neox"], quantize_dtype=d["quantize_dtype"], **d["scales"], page_size=given_page_size,
                  kv_layout=kv_layout, **outputs)
    logical = {name: None if x is None else x.detach().cpu().clone()
               for name, x in (("q_rope", d["q_rope"]), ("k_rope", d["k_rope"]), ("q_nope", d["q_nope"]),
                               ("k_nope", k_nope), ("v", v))}
    before = [c.detach().cpu().clone() for c in caches]
    n_slots = num_pages * page_size
    spec = dict(op="rope_quantize_fp8_append_paged_kv_cache", tokens=tokens, hq=d["hq"], hk=hk, mla=mla,
                rope_dim=rope_dim, no_rope_dim=no_rope, q_nope=None if d["q_nope"] is None else tuple(
                    d["q_nope"].shape), dtype=str(dtype), quantize_dtype=str(d["quantize_dtype"]),
                cache_dtype=str(cache_fmt), scales=d["scales"], is_neox=d["is_neox"], rows=d["rows"],
                pos_ids=d["pos_ids"].detach().cpu().tolist(), kv_layout=kv_layout, page_size=page_size,
                given_page_size=given_page_size, num_pages=num_pages, pad=pad, slots=slots,
                page_table={n: t.tolist() for n, t in table.items()}, outputs=sorted(outputs),
                check_mode=d["check_mode"])

    def rows_of(c):  # one row a slot: (slots, heads, dim) (MLA: (slots, dim))
        c = c.detach().cpu()
        if not mla and kv_layout == "HND":
            c = c.transpose(1, 2)
        return c.reshape(n_slots, *c.shape[2:])

    def check(result) -> list[str]:
        if not isinstance(result, tuple) or len(result) != 2:
            return [f"returned {type(result).__name__}, not (q_rope_out, q_nope_out)"]
        problems = []
        for name, got in zip(("q_rope", "q_nope"), result):
            given = outputs.get(name + "_out")
            if given is not None and got is not given:
                problems.append(f"{name}_out was given, but another tensor was returned")
        scale_q, scale_kv = d["scales"]["quant_scale_q"], d["scales"]["quant_scale_kv"]
        problems += _rotary_problems("q_rope_out", result[0], _rotated(d, logical["q_rope"]) * scale_q, fmt)
        problems += _nope_problems("q_nope_out", result[1], logical["q_nope"], scale_q, fmt, logical["q_rope"])
        # the reader: stored / quant_scale_kv, stored as x / (1 / quant_scale_kv) in float32
        reciprocal = float(torch.tensor(1.0 / scale_kv, dtype=torch.float32))
        k_rot = _rotated(d, logical["k_rope"] if not mla else logical["k_rope"][:, None])
        if mla:
            problems += cache_problems("kpe_cache", rows_of(caches[1]), rows_of(before[1]), k_rot[:, 0], slots,
                                       reciprocal, False)
            problems += cache_problems("ckv_cache", rows_of(caches[0]), rows_of(before[0]),
                                       logical["k_nope"].to(torch.float64), slots, reciprocal, True)
            return problems
        after_k, before_k = rows_of(caches[0]), rows_of(before[0])
        problems += cache_problems("k_cache (rotary channels)", after_k[..., :rope_dim], before_k[..., :rope_dim],
                                   k_rot, slots, reciprocal, False)
        if no_rope:
            problems += cache_problems("k_cache (k_nope's channels)", after_k[..., rope_dim:],
                                       before_k[..., rope_dim:], logical["k_nope"].to(torch.float64), slots,
                                       reciprocal, True)
        problems += cache_problems("v_cache", rows_of(caches[1]), rows_of(before[1]), logical["v"].to(torch.float64),
                                   slots, reciprocal, True)
        return problems

    return Case("rope_quantize_fp8_append_paged_kv_cache", spec, arena,
                lambda: ropekit.rope_quantize_fp8_append_paged_kv_cache(
                    d["q_rope"], d["k_rope"], d["q_nope"], k_nope, v, d["cos_sin_cache"], d["pos_ids"], caches,
                    table["kv_indices"], table["kv_indptr"], table["batch_indices"], table["cache_positions"],
                    **kwargs),
                check, expect=_expectation(why, either), why_raise="; ".join(why),
                env={"ROPEKIT_CHECK": "1" if d["check_mode"] else "0"},
                tensors=dict(zip(names, caches), **{n: t for n, t in table.items() if n in PAGE_TABLE}, **outputs))


TARGETS = {name: draw for name, draw in (("rope_quantize_fp8", draw_rope_quantize_fp8),
                                         ("rope_quantize_fp8_append_paged_kv_cache",
                                          draw_rope_quantize_fp8_append_paged_kv_cache))
           if hasattr(ropekit, name)}
