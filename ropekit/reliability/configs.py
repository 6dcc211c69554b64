"""The configuration space of the property section: families, configurations and the size ranges they draw from.

A *family* fixes everything that decides which compiled kernel variant runs (switches, dtypes, head_dim and
rotary_dim from a bounded set) and the kind of memory layout; its configurations differ only in sizes, strides and
values, so thousands of configurations cost a bounded number of compiles. The generator is a seeded
``random.Random``: a failing configuration is reproduced from its printed description and seed.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass

__all__ = ["HEAD_DIMS", "POSITIONS", "VARLEN_POSITIONS", "Family", "Config", "Scale", "GPU_SCALE", "CPU_SCALE",
           "draw_family", "draw_config", "coverage"]

# (head_dim, rotary_dim): the bounded set of compile-time sizes. Non-powers of two (40, 48, 80, 96), partial rotary
# with a tail (24 of 40, 32 of 64, 64 of 96, 64 of 128, 128 of 256) and an odd pair count (24 -> 12 pairs).
HEAD_DIMS = ((32, 32), (40, 24), (48, 48), (64, 32), (80, 80), (96, 64), (128, 128), (128, 64), (256, 256),
             (256, 128))


@dataclass(frozen=True)
class Family:
    """Everything that decides which compiled kernel variant runs (switches, dtypes, sizes of head_dim/rotary_dim)
    and the *kind* of memory layout. Configurations of one family differ only in sizes, strides and values."""

    layout: str = "bshd"              # bshd | sbhd | bhsd | thd (packed varlen)
    view: str = "contiguous"          # contiguous | transposed | sliced | expanded | misaligned | packed (q, k, v
                                      # heads of one fused buffer)
    perm: tuple = ()                  # transposed: storage order of the layout's axes
    view_dim: int = 0                 # sliced: axis taken with step 2 (-1: none); expanded: broadcast axis
    dtype: str = "fp32"
    head_dim: int = 64
    rotary_dim: int = 64
    interleaved: bool = False
    conjugate: bool = False
    positions: str = "none"           # how tokens get positions: see build.py
    pos_dtype: str = "int64"
    cos_dtype: str = "fp32"           # per-token rows only
    cos_shape: str = "full"           # per-token rows: full (b, s, r) | shared (1, s, r) | flat (s, r)
    heads: str = "mha"                # k heads: none (k is None) | mha | gqa | mqa | wider (k has more heads)
    inplace: bool = False
    backward: str = ""                # "" | "sum" (TE's broadcast-scalar loss) | "full" (a full gradient tensor)
    table_view: str = "contiguous"    # contiguous | padded (a row stride wider than rotary_dim/2)
    cu_dtype: str = "int32"
    max_seqlen: str = "exact"         # varlen: exact | larger | none (the API then computes it, with a host sync)

    @property
    def varlen(self) -> bool:
        return self.layout == "thd"

    @property
    def per_token(self) -> bool:
        return self.positions == "per-token"


@dataclass(frozen=True)
class Config:
    """One property-test configuration; ``describe()`` is enough to rebuild it (with ``seed`` for the values)."""

    family: Family
    seed: int = 0
    batch: int = 1
    seqlen: int = 1
    lengths: tuple = ()               # varlen: tokens per sequence
    heads_q: int = 1
    heads_k: int = 1                  # 0: k is None
    pad: int = 0                      # sliced views: extra channels after head_dim
    offset: int = 0                   # positions "int": the scalar offset
    span: int = 0                     # largest start position drawn for offsets / ids
    table_extra: int = 0              # table rows beyond the largest position
    base: float = 10000.0
    explicit_rotary_dim: bool = True

    @property
    def tokens(self) -> int:
        return sum(self.lengths) if self.family.varlen else self.batch * self.seqlen

    def describe(self) -> str:
        f = self.family
        view = f.view + (f"{f.perm}" if f.view == "transposed" else "") + \
            (f"[dim{f.view_dim},pad{self.pad}]" if f.view == "sliced" else "") + \
            (f"[dim{f.view_dim}]" if f.view == "expanded" else "")
        shape = (f"t{self.tokens} seqs{list(self.lengths)}" if f.varlen else f"b{self.batch} s{self.seqlen}")
        pos = f.positions + (f"={self.offset}" if f.positions == "int" else "") + \
            (f":{f.pos_dtype}" if f.positions not in ("none", "int", "per-token") else "") + \
            (f":{f.cos_dtype}/{f.cos_shape}" if f.per_token else "")
        mode = "in-place" if f.inplace else "out-of-place"
        parts = [f"{f.layout}:{view}", f.dtype, shape, f"h{self.heads_q}/{self.heads_k or '-'}",
                 f"d{f.head_dim}/r{f.rotary_dim}", "gptj" if f.interleaved else "neox", pos,
                 f"table{'+pad' if f.table_view == 'padded' else ''}+{self.table_extra} base{self.base:g}", mode]
        if f.conjugate:
            parts.append("conjugate")
        if f.backward:
            parts.append(f"backward:{f.backward}")
        if f.varlen:
            parts.append(f"cu:{f.cu_dtype} max_seqlen:{f.max_seqlen}")
        return " ".join(parts) + f" seed={self.seed}"

    def short_id(self) -> str:
        """A compact test id: layout-view-dtype-sizes-pairing-positions-mode."""
        f = self.family
        shape = f"t{self.tokens}" if f.varlen else f"b{self.batch}s{self.seqlen}"
        mode = "inplace" if f.inplace else (f"bwd-{f.backward}" if f.backward else "fwd")
        return "-".join((f.layout, f.view, f.dtype, shape, f"h{self.heads_q}k{self.heads_k}",
                         f"d{f.head_dim}r{f.rotary_dim}", "gptj" if f.interleaved else "neox", f.positions, mode))


@dataclass(frozen=True)
class Scale:
    """Size ranges: real sizes on a GPU, tiny ones under the interpreter (every program there is Python)."""

    batches: tuple
    seqlens: tuple                    # (value or (low, high)), drawn uniformly from the list; 0 tokens: 5%
    heads: tuple
    max_heads: int                    # GQA draws q heads = k heads x ratio, capped here
    max_seqs: int
    max_length: int
    max_numel: int
    max_span: int


GPU_SCALE = Scale(batches=(1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 6, 8, 8),
                  seqlens=(1, 1, 1, (2, 32), (2, 32), (2, 32), (33, 300), (33, 300), (33, 300)),
                  heads=(1, 2, 3, 4, 5, 6, 8, 12, 16),
                  max_heads=32, max_seqs=8, max_length=200, max_numel=400_000, max_span=4000)
CPU_SCALE = Scale(batches=(1, 1, 2, 2, 3), seqlens=(1, 1, (2, 9), (2, 9), (10, 24)),
                  heads=(1, 2, 3, 4, 5), max_heads=8, max_seqs=4, max_length=12, max_numel=6_000, max_span=200)

POSITIONS = ("none", "int", "offsets", "offsets-2d", "offsets-0d", "ids", "ids-1d", "ids-broadcast", "ids-strided",
              "per-token")
VARLEN_POSITIONS = ("none", "int", "offsets", "ids", "per-token")


def draw_family(rng: random.Random) -> Family:
    """One random family: layout and view kind, dtype, head_dim/rotary_dim, pairing, positions, heads, mode."""
    layout = rng.choice(("bshd", "bshd", "sbhd", "bhsd", "thd"))
    ndim = 3 if layout == "thd" else 4
    view = rng.choice(("contiguous", "contiguous", "transposed", "transposed", "sliced", "expanded", "misaligned",
                       "packed"))
    perm, view_dim = (), 0
    if view == "transposed":
        perm = tuple(range(ndim))
        while perm == tuple(range(ndim)):
            perm = tuple(rng.sample(range(ndim), ndim))  # may move head_dim too: a channel stride other than 1
    elif view == "sliced":
        view_dim = rng.choice(tuple(range(ndim - 1)) + (-1,))
    elif view == "expanded":
        axes = "th" if layout == "thd" else layout.replace("s", "").replace("d", "")  # batch or heads (or tokens)
        view_dim = layout.index(rng.choice(axes)) if layout != "thd" else rng.choice((0, 1))
    head_dim, rotary_dim = rng.choice(HEAD_DIMS)
    positions = rng.choice(VARLEN_POSITIONS if layout == "thd" else POSITIONS)
    dtype = rng.choice(("fp32", "fp32", "bf16", "bf16", "fp16", "fp16", "fp64"))
    inplace = view != "expanded" and rng.random() < 0.25  # an expanded view aliases itself: never written in place
    backward = "" if inplace or rng.random() < 0.6 else rng.choice(("sum", "full"))
    return Family(
        layout=layout, view=view, perm=perm, view_dim=view_dim, dtype=dtype, head_dim=head_dim, rotary_dim=rotary_dim,
        interleaved=rng.random() < 0.5, conjugate=rng.random() < 0.1, positions=positions,
        pos_dtype=rng.choice(("int32", "int64")), cos_dtype=rng.choice(("fp32", dtype)),
        cos_shape="full" if layout == "thd" else rng.choice(("full", "shared", "flat")),
        heads=rng.choice(("none", "mha", "gqa", "gqa", "mqa", "wider")), inplace=inplace, backward=backward,
        table_view=rng.choice(("contiguous", "padded")), cu_dtype=rng.choice(("int32", "int64")),
        max_seqlen=rng.choice(("exact", "exact", "larger", "none")))


def _draw_size(rng: random.Random, choices: tuple) -> int:
    value = rng.choice(choices)
    return rng.randint(*value) if isinstance(value, tuple) else value


def draw_config(rng: random.Random, family: Family, scale: Scale) -> Config:
    """Sizes and values for one configuration of ``family`` (numel kept under ``scale.max_numel``)."""
    f = family
    heads_k_choice = {"none": lambda h: 0, "mha": lambda h: h, "mqa": lambda h: 1, "wider": lambda h: h + 1}
    if f.heads == "gqa":
        heads_k = rng.choice((1, 2, 3, 4))
        heads_q = heads_k * rng.choice([r for r in (2, 4, 8) if heads_k * r <= scale.max_heads] or [2])
    else:
        heads_q = rng.choice(scale.heads)
        heads_k = heads_k_choice[f.heads](heads_q)
    batch, seqlen, lengths = rng.choice(scale.batches), _draw_size(rng, scale.seqlens), ()
    if rng.random() < 0.05:  # empty inputs: no tokens at all
        batch, seqlen = rng.choice(((0, seqlen), (batch, 0), (0, 0)))
    if f.varlen:
        lengths = tuple(rng.choice((0, 1, 1, rng.randint(2, scale.max_length), rng.randint(2, scale.max_length)))
                        for _ in range(rng.randint(1, scale.max_seqs)))
        if seqlen == 0 or batch == 0:
            lengths = (0,) * len(lengths)
    per_token_elems = max(heads_q, heads_k) * (f.head_dim + 16) * (2 if f.view == "sliced" else 1)
    while (sum(lengths) if f.varlen else batch * seqlen) * per_token_elems > scale.max_numel:
        if f.varlen:
            lengths = tuple(n // 2 for n in lengths)
        elif seqlen > 1:
            seqlen //= 2
        elif batch > 1:
            batch //= 2
        else:
            break  # one token: as small as it gets
    return Config(family=f, seed=rng.randrange(2**31), batch=batch, seqlen=seqlen, lengths=lengths, heads_q=heads_q,
                  heads_k=heads_k, pad=rng.choice((2, 8, 16)) if f.view == "sliced" else 0,
                  offset=rng.choice((0, 1, rng.randint(2, scale.max_span))), span=rng.randint(0, scale.max_span),
                  table_extra=rng.choice((0, 0, 1, rng.randint(2, 64))), base=rng.choice((10000.0, 500000.0, 1e6)),
                  explicit_rotary_dim=rng.random() < 0.7)



def coverage(configs: list[Config]) -> dict:
    """How often each value of each dimension occurs (the doc shows that the space was really covered)."""
    counters = defaultdict(Counter)
    for cfg in configs:
        f = cfg.family
        counters["layout"][f.layout] += 1
        counters["view"][f.view] += 1
        counters["dtype"][f.dtype] += 1
        counters["head_dim/rotary_dim"][f"{f.head_dim}/{f.rotary_dim}"] += 1
        counters["pairing"]["gptj" if f.interleaved else "neox"] += 1
        counters["positions"][f.positions] += 1
        counters["k heads"][f.heads] += 1
        counters["mode"]["in-place" if f.inplace else "out-of-place"] += 1
        counters["backward"][f.backward or "forward only"] += 1
        counters["seqlen"]["0" if cfg.tokens == 0 else ("1" if (not f.varlen and cfg.seqlen == 1) else ">1")] += 1
        counters["conjugate"][str(f.conjugate)] += 1
    return {k: dict(sorted(v.items())) for k, v in counters.items()}
