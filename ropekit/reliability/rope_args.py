"""The arguments of a rotary call drawn hostile-but-plausible (apply_rope's, which the fused ops share), what the
documentation says the call must do with them, and the float64 reference of its result.

Drawn independently: q's and k's dtype and view, k's aliasing with q (a slice of q's heads, q itself), the tables'
dtypes and views (cos and sin each their own), half-width tables or per-token rows (halves equal), the position form
(none, host int, 0-d / per-sequence offsets, position ids, broadcast ids, and for ``apply_rope`` and ``qk_norm_rope``
M-RoPE's three ids per token with ``mrope_section`` and ``mrope_interleaved``) with its dtype, view and values (in and
out of the table, negative), for them too the inverse frequencies the kernel computes the angles from instead of the
tables (``inv_freq``: its dtype, view and length; ``scale``), for ``apply_rope`` a Llama 4 NoPE layer instead of a
table (``nope_temperature``: no rotation, q scaled, k passed through), for ``thd`` the ``cu_seqlens`` dtype, view and
values (valid, ending past or before the tokens, decreasing, not starting at 0, negative) and ``max_seqlen``; layout,
pairing, ``rotary_dim``, conjugate, in place, autograd and check mode. What the documentation says about each
combination decides what the oracle expects.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import torch

from ropekit import reference as ref
from ropekit.frequencies import inverse_frequencies
from ropekit.layouts import TO_BSHD, to_bshd

from .fuzz import EITHER, MATCH, RAISE, Arena, footprint, self_overlapping

__all__ = ["RopeArgs", "draw_rope_args", "DTYPES", "INPUT_KINDS", "INDEX_KINDS", "ANGLE_SCALES", "pick",
           "position_values", "draw_angles", "angle_rows", "draw_mrope_section", "to_tokens", "from_tokens"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEAD_AXIS = {"bshd": 2, "sbhd": 2, "bhsd": 1, "thd": 1}
INPUT_KINDS = (("contiguous", 3), ("padded", 2), ("stepped", 1), ("permuted", 2), ("expanded", 1),
                ("overlapping", 1))
TABLE_KINDS = INPUT_KINDS
INDEX_KINDS = (("contiguous", 3), ("padded", 1), ("stepped", 2), ("permuted", 1))
_EXOTIC = ("expanded", "overlapping")
# int32's limits (a position tensor may be int32): an index computed from them must not wrap into the table
_EXTREME_POSITIONS = (2**31 - 1, -2**31, 2**31 - 2, -(2**31 - 1))
# the scales of table-free angles: a compile-time constant of the kernel, so a few values (1: no scaling)
ANGLE_SCALES = (1.0, 1.0, 0.875, 1.25)


def pick(rng: random.Random, weighted) -> str:
    names, weights = zip(*weighted)
    return rng.choices(names, weights=weights)[0]


def _describe(t) -> object:
    if not isinstance(t, torch.Tensor):
        return t
    d = {"shape": tuple(t.shape), "stride": t.stride(), "offset": t.storage_offset(),
         "dtype": str(t.dtype).removeprefix("torch.")}
    if not t.is_floating_point() and t.numel() <= 64:
        d["values"] = t.cpu().tolist()
    return d


def _layout_shape(layout, batch, seq, heads, head_dim, tokens):
    if layout == "thd":
        return (tokens, heads, head_dim)
    return tuple((batch, seq, heads, head_dim)[i] for i in TO_BSHD[layout])


def to_tokens(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x in (batch, seq, heads, head_dim) (or (tokens, heads, head_dim)), float64 on the CPU."""
    return to_bshd(x.detach().cpu().to(torch.float64), layout)


from_tokens = to_bshd  # the permutations are their own inverses


def _rotate(x_tokens, cos_half, sin_half, rotary_dim, interleaved, conjugate):
    """Rotate (batch, seq, heads, D) or (tokens, heads, D) by per-token half-width angles (token shape + (R/2,))."""
    rotated = ref.rotate_pairs(x_tokens[..., :rotary_dim], cos_half[..., None, :], sin_half[..., None, :],
                               interleaved=interleaved, conjugate=conjugate)
    return torch.cat((rotated, x_tokens[..., rotary_dim:]), dim=-1)


def _row_values(core_shape, gen, interleaved: bool, equal: bool) -> torch.Tensor:
    """Per-token rows whose pairs share one angle (``equal``: halves equal for NeoX, neighbours for GPT-J, the
    documented form) or not (what the eager formula ``x * cos + rotate_half(x) * sin`` also accepts)."""
    width = core_shape[-1]
    if width == 1 or not equal:  # (width 1: expanded along the row, every column the same value)
        return torch.rand(core_shape, generator=gen, dtype=torch.float64) * 2 - 1
    half = torch.rand(*core_shape[:-1], width // 2, generator=gen, dtype=torch.float64) * 2 - 1
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


def _pairs_share_angles(rows: torch.Tensor, interleaved: bool) -> bool:
    rows = rows.detach().cpu()
    first, second = (rows[..., 0::2], rows[..., 1::2]) if interleaved else rows.chunk(2, dim=-1)
    return torch.equal(first, second)


def position_values(gen, low: int, high: int, hostile: bool, rows: int):
    def values(core_shape):
        v = torch.randint(low, max(high, low) + 1, core_shape, generator=gen)
        if hostile and v.numel():
            poke = torch.rand(core_shape, generator=gen) < 0.4
            far = torch.where(torch.rand(core_shape, generator=gen) < 0.5,
                              rows + torch.randint(0, 4, core_shape, generator=gen),
                              -torch.randint(1, 4, core_shape, generator=gen))
            extreme = torch.tensor(_EXTREME_POSITIONS)[torch.randint(0, len(_EXTREME_POSITIONS), core_shape,
                                                                     generator=gen)]
            far = torch.where(torch.rand(core_shape, generator=gen) < 0.2, extreme, far)
            v = torch.where(poke, far, v)
        return v
    return values


def _uncovered_rows(cu: list, tokens: int) -> torch.Tensor:
    """The packed rows that no sequence of ``cu`` covers."""
    covered = torch.zeros(tokens, dtype=torch.bool)
    for start, end in zip(cu, cu[1:]):
        covered[max(start, 0):max(min(end, tokens), 0)] = True
    return ~covered


def _cu_values(rng: random.Random, lengths: list) -> tuple[list, str]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    how = rng.choices(("valid", "past_end", "far_past_end", "short_end", "decreasing", "start_nonzero", "negative"),
                      weights=(12, 3, 1, 1, 1, 1, 1))[0]
    if how == "past_end":
        cu[-1] += rng.randint(1, 3)
    elif how == "far_past_end":  # past any guard: a write there corrupts another allocation
        cu[-1] += rng.randint(20, 200)
    elif how == "short_end" and cu[-1] > 0:
        cu[-1] -= 1
    elif how == "decreasing" and len(cu) > 2 and cu[1] > 0:
        cu[1] = cu[2] + 1
    elif how == "start_nonzero":
        cu[0] = rng.randint(1, 2)
    elif how == "negative" and len(cu) > 2:
        cu[1] = -rng.randint(1, 3)
    else:
        how = "valid"
    return cu, how


@dataclass
class RopeArgs:
    """The drawn arguments of a rotary call (apply_rope's, shared by the fused ops) and what the oracle expects."""

    arena: Arena
    spec: dict
    q: torch.Tensor
    k: torch.Tensor | None
    cos: torch.Tensor
    sin: torch.Tensor
    kwargs: dict  # apply_rope's keyword arguments
    expect: str
    why_raise: list
    either: list
    overlap: bool
    grad: bool
    rotate_ref: Callable | None  # (x float64 in the tokens' layout, cos, sin) -> reference; None: values unspecified
    logical: dict  # CPU copies of q, k, cos, sin as drawn
    untouched: torch.Tensor | None = None  # thd: packed rows no sequence covers (in place they must stay as they were)
    past_max: torch.Tensor | None = None  # thd: rows past max_seqlen in their sequence (see ``rope_case``)
    rotate_ref_k: Callable | None = None  # k's reference where it differs from q's (a NoPE layer passes k through)

    def refuse(self, why: str) -> None:
        self.expect, self.why_raise = RAISE, self.why_raise + [why]

    def expectation(self) -> str:
        return EITHER if self.expect == MATCH and self.either else self.expect


def draw_angles(rng: random.Random, arena: Arena, columns: int) -> tuple[torch.Tensor, float, list[str]]:
    """Table-free angles: ``inv_freq`` of ``columns`` pairs (a rope type's frequencies, all <= 1: the kernel reduces
    the angle exactly for positions below 2**31 then), float32 or float64 (rarely a half dtype or 2-D: refused), in
    any view, and ``scale`` from :data:`ANGLE_SCALES` (rarely not finite: refused). Returns the tensor, the scale and
    why the call must raise."""
    why = []
    freqs = inverse_frequencies(2 * columns, rng.choice((10000.0, 500000.0))) / rng.choice((1.0, 1.0, 4.0))
    dtype = rng.choice((torch.float32, torch.float64))
    if rng.random() < 0.03:
        dtype = rng.choice((torch.float16, torch.bfloat16))
        why.append("inv_freq of a half dtype")
    shape = (columns,)
    if rng.random() < 0.03:
        shape = (1, columns)
        why.append("a 2-D inv_freq")
    inv_freq = arena.place("inv_freq", shape, dtype, pick(rng, INPUT_KINDS),
                           lambda core: freqs[:math.prod(core)].reshape(core))
    scale = rng.choice(ANGLE_SCALES)
    if rng.random() < 0.03:
        scale = rng.choice((float("nan"), float("inf")))
        why.append("a scale that is not finite")
    return inv_freq, scale, why


def angle_rows(inv_freq: torch.Tensor, positions: torch.Tensor, pairs: int, scale: float,
               per_pair: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (times ``scale``) of ``position * inv_freq[i]`` for the first ``pairs`` frequencies, in float64:
    ``positions.shape + (pairs,)``, or with ``per_pair`` (M-RoPE: a position a pair) ``positions.shape``."""
    freqs = inv_freq.detach().cpu().to(torch.float64).reshape(-1)[:pairs]
    theta = positions.to(torch.float64) * freqs if per_pair else positions.to(torch.float64)[..., None] * freqs
    return torch.cos(theta) * scale, torch.sin(theta) * scale


def draw_mrope_section(rng: random.Random, pairs: int) -> list[int]:
    """Three sections (temporal, height, width) of ``pairs`` pairs, any of them possibly empty."""
    first, second = sorted(rng.randint(0, pairs) for _ in range(2))
    return [first, second - first, pairs - second]


def draw_rope_args(rng: random.Random, gen: torch.Generator, device, *, backend: str = "triton",
                   conjugate: bool = True, arena: Arena | None = None, inplace: bool | None = None,
                   switches: bool = False, mrope: bool | None = None, angles: bool = False) -> RopeArgs:
    """Draw every argument of a rotary call (see the module docstring); ``conjugate``: may the call take one;
    ``arena``: where to place the tensors (a fresh one by default); ``inplace``: given rather than drawn;
    ``switches``: may the call take ``apply_rope``'s own switches (M-RoPE positions, a NoPE layer); ``mrope``: may it
    take M-RoPE's (default: ``switches``); ``angles``: may it take ``inv_freq`` and ``scale`` instead of tables."""
    mrope = switches if mrope is None else mrope
    arena = arena or Arena(rng, gen, device)
    expect, why_raise, either = MATCH, [], []
    layout = rng.choice(("bshd", "sbhd", "bhsd", "thd"))
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    head_dim = rng.choice((8, 16))
    rotary_dim = rng.choice((head_dim, head_dim // 2))
    interleaved, conjugate = rng.random() < 0.4, conjugate and rng.random() < 0.2
    per_token, drawn_inplace = rng.random() < 0.25, rng.random() < 0.35
    nope = switches and not per_token and rng.random() < 0.12
    if nope:
        rotary_dim = head_dim  # a NoPE layer scales the whole head
    inplace = drawn_inplace if inplace is None else inplace
    grad = not inplace and rng.random() < 0.1
    check_mode = rng.random() < 0.2
    hq = rng.choice((1, 2, 3)) if rng.random() > 0.04 else 0
    hk = rng.choice((None, 1, 2, 3)) if rng.random() > 0.04 else 0
    spec = dict(layout=layout, dtype=str(dtype), head_dim=head_dim, rotary_dim=rotary_dim, interleaved=interleaved,
                conjugate=conjugate, per_token=per_token, inplace=inplace, grad=grad, check_mode=check_mode,
                backend=backend)

    # -- tokens -----------------------------------------------------------------------------------------------------
    cu = cu_how = max_seqlen = None
    if layout == "thd":
        lengths = [rng.randint(0, 4) for _ in range(rng.randint(1, 3))]
        batch, seq, tokens = len(lengths), max(lengths), sum(lengths)
        token_shape = (tokens,)
        cu_list, cu_how = _cu_values(rng, lengths)
        cu_kind = pick(rng, INDEX_KINDS)
        cu = arena.place("cu_seqlens", (len(cu_list),), rng.choice((torch.int32, torch.int64)), cu_kind,
                         lambda shape: torch.tensor(cu_list))
        longest = max([b - a for a, b in zip(cu_list, cu_list[1:])] + [0])
        max_how = rng.choices(("exact", "larger", "none", "shorter"), weights=(7, 1, 1, 1))[0]
        max_seqlen = {"exact": longest, "larger": longest + rng.randint(1, 2), "none": None,
                      "shorter": max(longest - 1, 0)}[max_how]
        short = max_seqlen is not None and max_seqlen < longest
        index_hostile = cu_how != "valid" or short
        untouched = _uncovered_rows(cu_list, tokens)
        seq_local = (torch.arange(tokens) - torch.repeat_interleave(torch.tensor(cu_list[:-1]), torch.tensor(lengths))
                     if cu_how == "valid" else None)  # each packed token's index in its sequence
        spec.update(lengths=lengths, cu_seqlens_how=cu_how, cu_kind=cu_kind, max_seqlen=max_seqlen)
    else:
        batch = rng.randint(1, 3) if rng.random() > 0.03 else 0
        seq = rng.randint(1, 5) if rng.random() > 0.03 else 0
        token_shape, tokens, index_hostile, untouched, short = (batch, seq), batch * seq, False, None, False
    if 0 in (hq, tokens) or hk == 0:
        either.append("an edge shape (zero heads or tokens)")

    # -- q and k ------------------------------------------------------------------------------------------------------
    q_kind = pick(rng, INPUT_KINDS)
    k_how = "none" if hk is None else rng.choices(("own", "packed", "slice-of-q", "q-itself"),
                                                  weights=(7, 2, 1, 1))[0]
    if (k_how == "slice-of-q" and (hk > hq or hk == 0)) or (k_how == "q-itself" and hk != hq) or (
            k_how == "packed" and layout == "bhsd"):
        k_how = "own"
    k = k_kind = None
    if k_how == "packed":
        # q, k (and v) as head slices of one fused projection's output: disjoint, in one buffer
        token_dims = {"bshd": (batch, seq), "sbhd": (seq, batch), "thd": (tokens,)}[layout]
        hv = rng.randint(0, 2)
        q_kind = rng.choice(("contiguous", "padded"))
        qkv = arena.place("qkv", (*token_dims, (hq + hk + hv) * head_dim), dtype, q_kind)
        q = qkv[..., :hq * head_dim].unflatten(-1, (hq, head_dim))
        k = qkv[..., hq * head_dim:(hq + hk) * head_dim].unflatten(-1, (hk, head_dim))
    else:
        q = arena.place("q", _layout_shape(layout, batch, seq, hq, head_dim, tokens), dtype, q_kind)
    if k_how == "own":
        k_dtype = dtype if rng.random() > 0.03 else rng.choice([d for d in DTYPES if d != dtype])
        k_kind = pick(rng, INPUT_KINDS)
        k = arena.place("k", _layout_shape(layout, batch, seq, hk, head_dim, tokens), k_dtype, k_kind)
        if k_dtype != dtype:
            expect, why_raise = RAISE, why_raise + ["k's dtype differs from q's"]
    elif k_how == "slice-of-q":
        k = q.narrow(_HEAD_AXIS[layout], rng.randint(0, hq - hk), hk)
    elif k_how == "q-itself":
        k = q
    spec.update(q_kind=q_kind, k_how=k_how, k_kind=k_kind)
    overlap = False
    if inplace:
        shared = k is not None and arena.buffer_of(k) is arena.buffer_of(q)
        both = (footprint(q, arena.buffer_of(q).base) & footprint(k, arena.buffer_of(q).base)).any() if shared \
            else False
        overlap = bool(self_overlapping(q) or (k is not None and self_overlapping(k)) or both)
        if overlap:
            expect, why_raise = RAISE, why_raise + ["in place on overlapping memory"]
        for t in (q, k):
            if t is not None:
                arena.allow_writes(t)

    # -- positions, tables or per-token rows ----------------------------------------------------------------------------
    rotate_ref = None  # (x float64 in tokens' layout, cos, sin) -> the reference output, differentiable in x
    positions = None
    switch_kwargs = {}  # apply_rope's own switches: M-RoPE's sections or a NoPE layer's temperature
    rotate_ref_k = None
    valid_tokens = None
    if per_token:
        width = rotary_dim if rng.random() > 0.15 else rotary_dim + 2 * rng.randint(1, 2)
        if width > head_dim:
            width = rotary_dim
        if layout == "thd":
            row_shape = rng.choice(((tokens, width), (1, width)))
        else:
            row_shape = rng.choice(((batch, seq, width), (1, seq, width), (seq, width), (batch, 1, width)))
        kinds = [pick(rng, INDEX_KINDS + (("expanded", 1),)) for _ in range(2)]
        dtypes = [rng.choice(DTYPES) for _ in range(2)]
        equal = width > rotary_dim or rng.random() > 0.15
        cos = arena.place("cos", row_shape, dtypes[0], kinds[0], lambda s: _row_values(s, gen, interleaved, equal))
        sin = arena.place("sin", row_shape, dtypes[1], kinds[1], lambda s: _row_values(s, gen, interleaved, equal))
        equal = _pairs_share_angles(cos, interleaved) and _pairs_share_angles(sin, interleaved)  # (no rows: they do)
        if width > rotary_dim:
            either.append("per-token rows wider than rotary_dim")
        if not equal and all(row_shape):  # empty rows hold no pair that could differ
            if check_mode:
                expect, why_raise = RAISE, why_raise + ["check mode: per-token rows whose pairs differ"]
            if grad:
                either.append("autograd through per-token rows whose pairs differ (may be refused)")
        spec.update(rows=row_shape, cos_kind=kinds[0], sin_kind=kinds[1], row_width=width, pairs_equal=equal)

        def rotate_ref(x, c, s):
            c, s = (t.detach().cpu().to(torch.float64).expand(*token_shape, width) for t in (c, s))
            if not equal:  # the eager formula, channel by channel
                return ref.rope_from_cos_sin(x, c[..., None, :rotary_dim], s[..., None, :rotary_dim],
                                             interleaved=interleaved, conjugate=conjugate)
            pick = (lambda t: t[..., 0:rotary_dim:2]) if interleaved else (lambda t: t[..., :rotary_dim // 2])
            return _rotate(x, pick(c), pick(s), rotary_dim, interleaved, conjugate)
        columns = width // 2
    elif nope:
        cos = sin = None
        switch_kwargs, rotate_ref, rotate_ref_k, why = _draw_nope(rng, gen, arena, device, layout, batch, seq, tokens,
                                                                 token_shape, lengths if layout == "thd" else None,
                                                                 cu, cu_how, check_mode, backend)
        for kind, reason in why:
            if kind == RAISE:
                expect, why_raise = RAISE, why_raise + [reason]
            else:
                either.append(reason)
        positions = switch_kwargs.pop("positions")
        spec.update(nope=True, positions_form="nope")
        columns = head_dim // 2
    else:
        form = rng.choice(("none", "int", "t0d", "offsets", "ids") + (() if layout == "thd" else
                                                                       ("offsets2d", "ids1d", "ids_bcast")))
        if mrope and rng.random() < 0.2:
            form = "mrope"
            section = draw_mrope_section(rng, rotary_dim // 2)
            if rng.random() < 0.05:
                section[rng.randrange(3)] += 1
                expect, why_raise = RAISE, why_raise + ["an mrope_section that does not sum to rotary_dim/2"]
            switch_kwargs = dict(mrope_section=section, mrope_interleaved=rng.random() < 0.5)
            if backend == "cuda":
                expect, why_raise = RAISE, why_raise + ["M-RoPE on the CUDA backend"]
            spec.update(switch_kwargs)
        # the angles computed in the kernel from inverse frequencies, no table (rows: the positions' range)
        by_angles = angles and rng.random() < 0.25
        span = seq
        rows = rng.randint(max(span, 1), max(span, 1) + 6) if rng.random() > 0.02 else 0
        if rows == 0 and not by_angles:
            either.append("a table of zero rows")
        hostile = rng.random() < 0.2
        pos_dtype = rng.choice((torch.int32, torch.int64)) if rng.random() > 0.02 else torch.float32
        pos_kind = pick(rng, INDEX_KINDS + (("expanded", 1),))
        starts = torch.tensor(cu.cpu().tolist()[:-1]) if layout == "thd" else None
        local = (torch.arange(tokens) - torch.repeat_interleave(starts, torch.tensor(lengths))
                 if layout == "thd" and cu_how == "valid" else
                 torch.arange(seq).expand(batch, seq) if layout != "thd" else None)
        offset_values = position_values(gen, 0, rows - span, hostile, rows)
        id_values = position_values(gen, 0, rows - 1, hostile, rows)
        raw = None
        if form == "int":
            positions = rng.randint(0, max(rows - span, 0)) if not hostile else rng.choice((-rng.randint(1, 3),
                                                                                    rows - span + rng.randint(1, 3)))
            if by_angles:  # no table to leave: only a negative offset is refused
                if positions < 0:
                    if tokens:
                        expect, why_raise = RAISE, why_raise + ["a negative host-int offset"]
                    else:
                        either.append("a negative host-int offset of no tokens")
            elif tokens and positions >= 0 and layout == "thd" and max_seqlen is not None and max_seqlen < span \
                    and positions + span > rows:
                either.append("a host-int offset past the table only through a sequence longer than max_seqlen")
            elif tokens and (positions < 0 or positions + span > rows):
                expect, why_raise = RAISE, why_raise + ["a host-int offset outside the table"]
            elif layout == "thd" and max_seqlen is not None and positions + max_seqlen > rows:
                either.append("a host-int offset that max_seqlen (not the sequences) takes past the table")
            token_pos = None if local is None else local + positions
        elif form == "none":
            token_pos = local
            if layout == "thd" and max_seqlen is not None and max_seqlen > rows and not by_angles:
                either.append("max_seqlen (not the sequences) reaches past the table")
        else:
            shape = {"t0d": (), "offsets": (batch,), "offsets2d": (batch, 1), "ids": token_shape,
                     "ids1d": (seq,), "ids_bcast": token_shape, "mrope": (3, *token_shape)}[form]
            kind = "expanded" if form == "ids_bcast" else pos_kind
            elsewhere = rng.random() < 0.03 and str(device).startswith("cuda")  # (drawn on every device alike)
            positions = arena.place("positions", shape, pos_dtype, kind,
                                    id_values if form.startswith("ids") or form == "mrope" else offset_values,
                                    device="cpu" if elsewhere else None)
            if elsewhere:
                expect, why_raise = RAISE, why_raise + ["positions on another device than q"]
            raw = positions.detach().cpu().to(torch.int64)
            if pos_dtype == torch.float32:
                expect, why_raise = RAISE, why_raise + ["float positions"]
            as_ids = form.startswith("ids") or (form == "offsets" and layout != "thd" and batch == seq > 1)
            if layout == "thd" and form in ("offsets", "ids") and batch == tokens > 1:
                # (n_seqs,) == (tokens,): the call does not say which it means
                same = local is not None and bool((local == 0).all())
                if not same:
                    expect, why_raise = RAISE, why_raise + ["thd positions of ambiguous shape"]
                else:
                    either.append("thd positions of ambiguous shape (both readings agree)")
            if local is None:
                token_pos = None
            elif form == "mrope":  # a position per pair: (*tokens, rotary_dim / 2)
                token_pos = ref.mrope_pair_positions(raw.expand(3, *token_shape), switch_kwargs["mrope_section"],
                                                     mrope_interleaved=switch_kwargs["mrope_interleaved"])
            elif as_ids:
                token_pos = raw.expand(*token_shape) if layout != "thd" else raw
            elif layout == "thd":
                token_pos = local + (raw.reshape(-1).expand(batch) if form == "t0d" else raw)[
                    torch.repeat_interleave(torch.arange(batch), torch.tensor(lengths))]
            else:
                token_pos = local + raw.reshape(-1, 1)
            if kind in _EXOTIC:
                either.append("an exotic positions view")
        spec.update(positions_form=form, positions_kind=pos_kind, positions_dtype=str(pos_dtype), table_rows=rows,
                    hostile_positions=hostile)
        columns = rotary_dim // 2 + (rng.randint(1, 2) if rng.random() < 0.25 else 0)
        with_tables = not by_angles or rng.random() < 0.04  # (inv_freq and tables together: refused)
        if by_angles:
            inv_freq, angle_scale, why = draw_angles(rng, arena, columns)
            why += ["inv_freq together with cos/sin"] if with_tables else []
            if backend == "cuda":
                why.append("table-free angles on the CUDA backend")
            if why:
                expect, why_raise = RAISE, why_raise + why
            switch_kwargs.update(inv_freq=inv_freq, scale=angle_scale)
            spec.update(angles=True, inv_freq=_describe(inv_freq), scale=angle_scale)
        elif rng.random() < 0.01:  # a scale without inv_freq: refused (a table is scaled in itself)
            switch_kwargs["scale"] = rng.choice((0.5, 2.0))
            expect, why_raise = RAISE, why_raise + ["scale other than 1 without inv_freq"]
            spec.update(scale=switch_kwargs["scale"])
        cos = sin = None
        if with_tables:
            kinds = [pick(rng, TABLE_KINDS) for _ in range(2)]
            cos_dtype = torch.float32 if rng.random() < 0.6 else rng.choice(DTYPES)
            sin_dtype = cos_dtype if rng.random() < 0.85 else rng.choice(DTYPES)
            cos = arena.place("cos", (rows, columns), cos_dtype, kinds[0])
            sin = arena.place("sin", (rows, columns), sin_dtype, kinds[1])
            spec.update(cos_kind=kinds[0], sin_kind=kinds[1], table_columns=columns)
            if any(kind in _EXOTIC for kind in kinds):
                either.append("an exotic table view")
        if by_angles and token_pos is not None:
            negative = bool((token_pos < 0).any()) if token_pos.numel() else False
            if raw is not None and check_mode:  # no table: check mode refuses negative positions only
                if negative:
                    expect, why_raise = RAISE, why_raise + ["check mode: negative positions"]
                elif bool((raw < 0).any()):
                    either.append("check mode: a negative offset that no token uses")

            def rotate_ref(x, c, s, token_pos=token_pos, per_pair=form == "mrope", inv_freq=inv_freq,
                           scale=angle_scale):
                cos_half, sin_half = angle_rows(inv_freq, token_pos, rotary_dim // 2, scale, per_pair)
                return _rotate(x, cos_half, sin_half, rotary_dim, interleaved, conjugate)
        elif token_pos is not None:
            valid_tokens = (token_pos >= 0) & (token_pos < rows)
            out_of_table = not bool(valid_tokens.all()) if token_pos.numel() else False
            if raw is not None and check_mode:
                if out_of_table:
                    expect, why_raise = RAISE, why_raise + ["check mode: positions outside the table"]
                elif bool(((raw < 0) | (raw >= rows)).any()):
                    either.append("check mode: an offset outside the table that no token uses")

            def rotate_ref(x, c, s, token_pos=token_pos, valid=valid_tokens, per_pair=form == "mrope"):
                def half(t):
                    t = t.detach().cpu().to(torch.float64)
                    if not rows:
                        t = torch.zeros(*token_pos.shape[:len(token_shape)], rotary_dim // 2, dtype=torch.float64)
                    elif per_pair:  # M-RoPE: pair i reads column i of its own axis' row
                        t = t[token_pos.clamp(0, rows - 1), torch.arange(rotary_dim // 2)]
                    else:
                        t = t[token_pos.clamp(0, rows - 1)][..., :rotary_dim // 2]
                    return torch.where(valid if per_pair else valid[..., None], t, torch.full_like(t, float("nan")))
                return _rotate(x, half(c), half(s), rotary_dim, interleaved, conjugate)
    past_max = None
    if index_hostile:
        if check_mode:
            expect, why_raise = RAISE, why_raise + ["check mode: invalid cu_seqlens or max_seqlen"]
        either.append("invalid cu_seqlens or max_seqlen")
        if cu_how != "valid":
            rotate_ref = None  # what the kernel then computes is unspecified: only the guards are checked
        elif short:
            # a token past max_seqlen in its sequence: out of place unspecified, in place left or rotated right
            past_max = seq_local >= max_seqlen

    # -- rotary_dim -------------------------------------------------------------------------------------------------
    rotary_arg = None if 2 * columns == rotary_dim and rng.random() < 0.75 else rotary_dim
    if rng.random() < 0.04:
        rotary_arg = rng.choice((rotary_dim + 1, head_dim + 2, 0, -2))
        expect, why_raise = RAISE, why_raise + ["an invalid rotary_dim"]
    spec.update(rotary_arg=rotary_arg, max_seqlen_arg=max_seqlen)
    if expect == MATCH and either:
        expect = EITHER

    kwargs = dict(positions=positions, layout=layout, interleaved=interleaved, rotary_dim=rotary_arg, inplace=inplace,
                  cu_seqlens=cu, max_seqlen=max_seqlen, per_token=per_token, conjugate=conjugate, backend=backend,
                  **switch_kwargs)
    spec.update(q=_describe(q), k=_describe(k), cos=_describe(cos), sin=_describe(sin),
                positions=_describe(positions), cu_seqlens=_describe(cu))
    if nope:
        spec["nope_temperature"] = list(kwargs["nope_temperature"])
    logical = {name: None if t is None else t.detach().cpu().clone() for name, t in
               (("q", q), ("k", k), ("cos", cos), ("sin", sin))}
    return RopeArgs(arena, spec, q, k, cos, sin, kwargs, expect, why_raise, either, overlap, grad, rotate_ref,
                    logical, untouched, past_max, rotate_ref_k)


def _draw_nope(rng, gen, arena, device, layout, batch, seq, tokens, token_shape, lengths, cu, cu_how, check_mode,
               backend):
    """A Llama 4 NoPE layer's arguments: ``nope_temperature`` (sometimes invalid), positions in any form (past
    several multiples of floor_scale, sometimes negative), and the references of q (scaled by the temperature) and
    k (passed through). Returns (keyword arguments with ``positions``, q's reference, k's, [(RAISE or EITHER,
    why)])."""
    why = []
    floor_scale = rng.choice((1, 2, 4, 8192, 8192.0))
    attn_scale = rng.choice((0.1, 0.5, 2.0))
    if rng.random() < 0.05:
        floor_scale, attn_scale = rng.choice(((0, attn_scale), (2.5, attn_scale), (floor_scale, float("nan"))))
        why.append((RAISE, "an invalid nope_temperature"))
    if backend == "cuda":
        why.append((RAISE, "a NoPE layer on the CUDA backend"))
    form = rng.choice(("none", "int", "offsets", "ids") + (() if layout == "thd" else ("ids_bcast",)))
    hostile = rng.random() < 0.2
    reach = 3 * int(floor_scale) if floor_scale else 8
    local = None
    if layout == "thd" and cu_how == "valid":
        local = torch.arange(tokens) - torch.repeat_interleave(torch.tensor(cu.cpu().tolist()[:-1]),
                                                               torch.tensor(lengths))
    elif layout != "thd":
        local = torch.arange(seq).expand(batch, seq)
    positions, token_pos = None, local
    if form == "int":
        positions = rng.randint(0, reach) if not hostile else -rng.randint(1, 3)
        if positions < 0:
            why.append((RAISE, "a negative host-int offset"))
        token_pos = None if local is None else local + positions
    elif form != "none":
        shape = {"offsets": (batch,), "ids": token_shape, "ids_bcast": token_shape}[form]
        kind = "expanded" if form == "ids_bcast" else pick(rng, INDEX_KINDS)
        positions = arena.place("positions", shape, rng.choice((torch.int32, torch.int64)), kind,
                                lambda core: torch.where(torch.rand(core, generator=gen) < (0.3 if hostile else 0),
                                                         -torch.randint(1, 4, core, generator=gen),
                                                         torch.randint(0, reach + 1, core, generator=gen)))
        raw = positions.detach().cpu().to(torch.int64)
        as_ids = form.startswith("ids") or (layout != "thd" and batch == seq > 1)
        if layout == "thd" and batch == tokens > 1:
            if local is not None and bool((local == 0).all()):
                why.append((EITHER, "thd positions of ambiguous shape (both readings agree)"))
            else:
                why.append((RAISE, "thd positions of ambiguous shape"))
        if check_mode and bool((raw < 0).any()):
            why.append((RAISE, "check mode: negative positions"))
        if kind in _EXOTIC:
            why.append((EITHER, "an exotic positions view"))
        if local is None:
            token_pos = None
        elif as_ids:
            token_pos = raw.expand(*token_shape) if layout != "thd" else raw
        elif layout == "thd":
            token_pos = local + raw[torch.repeat_interleave(torch.arange(batch), torch.tensor(lengths))]
        else:
            token_pos = local + raw.reshape(-1, 1)
    rotate_q = rotate_k = None
    if token_pos is not None and not any(kind == RAISE for kind, _ in why):
        def rotate_q(x, c, s, token_pos=token_pos):
            return ref.nope_temperature(x, token_pos, int(floor_scale), attn_scale)

        def rotate_k(x, c, s):
            return x * 1
    return dict(positions=positions, nope_temperature=(floor_scale, attn_scale)), rotate_q, rotate_k, why
