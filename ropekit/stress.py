"""``python -m ropekit stress``: the reliability run — proof that a kernel imported into someone's training run is
never quietly wrong, on every backend, written to JSON and rendered into ``docs/reliability.md``.

Sections (each one function that returns a JSON-able dict; ``main`` runs them in order):

1. ``property``      seeded random configurations (shapes, strides, views, dtypes, pairings, positions, GQA, in place,
                     backward) against the float64 reference. Compile-time values are drawn from a bounded set of
                     *families*, and each family may use only a few Triton kernel variants (counted exactly, see
                     :class:`_VariantRecorder`), so thousands of configurations cost a bounded number of compiles.
2. ``te_matrix``     Transformer Engine's fused-rope test matrix (its tests/pytorch/test_fused_rope.py) against our
                     reference.
3. sanitizer         ``tools/sanitize.sh`` runs ``python -m ropekit.stress --sanitize-driver`` under compute-sanitizer.
4. ``large``         one tensor past 2**31 elements, spot-checked against the reference.
5. ``determinism``   repeated runs and batch / prefill-decode / layout invariance, bit for bit.
6. ``safety``        invalid inputs raise the documented error before any write; NaN/Inf stay inside their pair.
7. ``long_context``  positions up to 1e6: the float64-angle table vs the common float32-angle table.

Commands::

    python -m ropekit stress --out docs/reliability.json          # the GPU run (~2,000 configurations)
    python -m ropekit stress --quick --out /tmp/rel.json          # a smoke run
    python -m ropekit.stress --sanitize-driver                     # what tools/sanitize.sh runs under the sanitizer
    python -m ropekit.stress --render docs/reliability.json docs/reliability.md [--sanitizer docs/sanitize.json]

The float64 reference (``ropekit.reference``) and the accuracy bound (``ropekit.testing``) are the only definitions of
"correct" used here. hypothesis is not needed: the generator is a seeded ``random.Random``, so a failing
configuration is reproduced from its printed seed and description.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import torch


from . import device as _device  # first: the interpreter switch must precede any triton import
from . import reference as ref
from .api import apply_rope
from .frequencies import cos_sin_table, inverse_frequencies
from .progress import Progress
from .testing import check_close_to_reference
from .triton import v4
from .triton.v4 import LaunchConfig

__all__ = [
    "Family", "Config", "Scale", "GPU_SCALE", "CPU_SCALE", "Unsupported",
    "available_backends", "draw_family", "draw_config", "generate_configs", "run_config", "kernel_variants",
    "reference_on_device", "te_cases", "run_te_case", "INVALID_INPUTS", "run_invalid_input", "nan_propagation",
    "run_property", "run_te_matrix", "run_large", "run_determinism", "run_safety", "run_long_context",
    "sanitize_driver", "coverage", "render_markdown", "main",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# (head_dim, rotary_dim): the bounded set of compile-time sizes. Non-powers of two (40, 48, 80, 96), partial rotary
# with a tail (24 of 40, 32 of 64, 64 of 96, 64 of 128, 128 of 256) and an odd pair count (24 -> 12 pairs).
HEAD_DIMS = ((32, 32), (40, 24), (48, 48), (64, 32), (80, 80), (96, 64), (128, 128), (128, 64), (256, 256),
             (256, 128))
_TO_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}  # involutions: also bshd -> layout
MAX_FAILURES_KEPT = 25


class Unsupported(Exception):
    """A backend said NotImplementedError for this configuration (e.g. CUDA and varlen 'thd'): counted, not failed."""


def available_backends() -> tuple[list[str], str]:
    """The backends to test here: always "triton" (v4); "cuda" when ``ropekit.cuda.available()`` says it works."""
    try:
        from .cuda import available

        ok, why = available()
    except ImportError as error:
        ok, why = False, f"ropekit.cuda is not importable ({error})"
    return (["triton", "cuda"] if ok else ["triton"]), why


def _to_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "thd" else x.permute(_TO_BSHD[layout])


_from_bshd = _to_bshd  # the permutations are their own inverses


def _layout_shape(layout: str, batch: int, seqlen: int, heads: int, head_dim: int, tokens: int = 0) -> tuple:
    if layout == "thd":
        return (tokens, heads, head_dim)
    sizes = {"b": batch, "s": seqlen, "h": heads, "d": head_dim}
    return tuple(sizes[axis] for axis in layout)


def _inverse(perm: tuple) -> tuple:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


def _tensor_summary(t: Optional[torch.Tensor]) -> str:
    return "None" if t is None else f"{tuple(t.shape)}/{tuple(t.stride())}"


# ====================================================================================================================
# 1. Property-based configurations
# ====================================================================================================================

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
    positions: str = "none"           # see _positions()
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

_POSITIONS = ("none", "int", "offsets", "offsets-2d", "offsets-0d", "ids", "ids-1d", "ids-broadcast", "ids-strided",
              "per-token")
_VARLEN_POSITIONS = ("none", "int", "offsets", "ids", "per-token")


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
    positions = rng.choice(_VARLEN_POSITIONS if layout == "thd" else _POSITIONS)
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


# --- building one configuration's tensors ---------------------------------------------------------------------------

@dataclass
class _Operand:
    """A q or k operand: ``storage`` is the allocation, ``view(storage)`` the tensor handed to apply_rope."""

    storage: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor]

    def tensor(self) -> torch.Tensor:
        return self.view(self.storage)


def _operand(gen: torch.Generator, shape: tuple, dtype: torch.dtype, family: Family, pad: int, device,
             values: bool = True) -> _Operand:
    def randn(size):
        if not values:
            return torch.empty(size, dtype=dtype, device=device)
        return torch.randn(size, generator=gen, dtype=torch.float32).to(dtype).to(device)

    if family.view == "contiguous":
        return _Operand(randn(shape), lambda s: s)
    if family.view == "transposed":
        perm = family.perm
        return _Operand(randn(tuple(shape[p] for p in perm)), lambda s: s.permute(_inverse(perm)))
    if family.view == "sliced":
        big = list(shape)
        big[-1] += pad
        step_axis = family.view_dim
        if step_axis >= 0:
            big[step_axis] *= 2
        head_dim = shape[-1]

        def sliced(s):
            index = [slice(None)] * len(shape)
            if step_axis >= 0:
                index[step_axis] = slice(None, None, 2)
            return s[tuple(index)][..., :head_dim]

        return _Operand(randn(tuple(big)), sliced)
    if family.view == "expanded":
        small = list(shape)
        small[family.view_dim] = 1
        return _Operand(randn(tuple(small)), lambda s: s.expand(shape))
    if family.view == "misaligned":  # storage offset of one element: not 16-byte aligned (vector-load fallbacks)
        numel = math.prod(shape)
        return _Operand(randn((numel + 1,)), lambda s: s[1:].view(shape))
    raise ValueError(family.view)


def _full_width(half: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Half-width cos/sin (..., r/2) -> transformers' full-width rows (..., r) in the order the pairing reads them."""
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


@dataclass
class _Case:
    q: _Operand
    k: Optional[_Operand]
    cos: torch.Tensor
    sin: torch.Tensor
    kwargs: dict                      # apply_rope keyword arguments (no backend)
    ref_positions: Optional[torch.Tensor] = None  # (batch, seq) or (tokens,) int64 on the CPU
    ref_cos: Optional[torch.Tensor] = None        # per-token: float64 rows broadcastable over heads
    ref_sin: Optional[torch.Tensor] = None


def _positions(cfg: Config, gen: torch.Generator, device) -> tuple:
    """(positions argument for apply_rope, reference positions on the CPU). Random positions lie in
    [0, span + length): the table size depends on the sizes only, never on the values drawn."""
    f, b, s = cfg.family, cfg.batch, cfg.seqlen
    pos_dtype = getattr(torch, f.pos_dtype)

    def randint(high, size):
        return torch.randint(0, high + 1, size, generator=gen, dtype=torch.int64)

    if f.varlen:
        cu = torch.tensor((0, *itertools.accumulate(cfg.lengths)), dtype=torch.int64)
        n = len(cfg.lengths)
        if f.positions == "none":
            arg, pos = None, ref.varlen_positions(cu)
        elif f.positions == "int":
            arg, pos = cfg.offset, ref.varlen_positions(cu, offsets=cfg.offset)
        elif f.positions == "offsets":
            offsets = randint(cfg.span, (n,))
            # (n_seqs, 1) and (1, tokens) say which reading is meant, whatever the counts
            arg, pos = offsets.to(device, pos_dtype).reshape(n, 1), ref.varlen_positions(cu, offsets=offsets)
        else:  # ids, or per-token rows built from these positions
            pos = randint(cfg.span, (cfg.tokens,))
            arg = pos.to(device, pos_dtype).reshape(1, -1) if f.positions == "ids" else None
        return arg, pos
    kind = f.positions
    if kind == "none":
        arg, pos = None, ref.token_positions(b, s)
    elif kind == "int":
        arg, pos = cfg.offset, ref.token_positions(b, s, offsets=cfg.offset)
    elif kind in ("offsets", "offsets-2d"):
        offsets = randint(cfg.span, (b,))
        # (batch,) is ambiguous when batch == seq > 1 (read as shared position ids): say (batch, 1) then.
        as_column = kind == "offsets-2d" or (b == s and b > 1)
        arg = (offsets[:, None] if as_column else offsets).to(device, pos_dtype)
        pos = ref.token_positions(b, s, offsets=offsets)
    elif kind == "offsets-0d":
        offset = randint(cfg.span, ())
        arg, pos = offset.to(device, pos_dtype), ref.token_positions(b, s, offsets=offset)
    elif kind in ("ids", "per-token"):
        shared = kind == "per-token" and f.cos_shape != "full"  # per-token rows shared by the batch: (1, s)
        pos = randint(cfg.span, (1, s) if shared else (b, s)).expand(b, s).clone()
        arg = pos.to(device, pos_dtype) if kind == "ids" else None
    elif kind == "ids-1d":
        ids = randint(cfg.span, (s,))
        arg, pos = ids.to(device, pos_dtype), ids.expand(b, s).clone()
    elif kind == "ids-broadcast":
        ids = randint(cfg.span, (1, s))
        arg, pos = ids.to(device, pos_dtype), ids.expand(b, s).clone()
    elif kind == "ids-strided":
        wide = randint(cfg.span, (b, 2 * s))
        arg, pos = wide.to(device, pos_dtype)[:, ::2], wide[:, ::2].clone()
    else:
        raise ValueError(kind)
    return arg, pos


def _table_rows(cfg: Config, max_seqlen: Optional[int]) -> int:
    """Rows of the cos/sin table: enough for every position the configuration can draw, plus ``table_extra``.

    A function of the sizes only (the table length is a kernel argument that Triton specialises on), so drawing new
    position values never needs another kernel variant."""
    f = cfg.family
    length = (max_seqlen if max_seqlen is not None else max(cfg.lengths, default=0)) if f.varlen else cfg.seqlen
    start = {"none": 0, "int": cfg.offset}.get(f.positions, cfg.span)
    return start + length + cfg.table_extra


def _build_case(cfg: Config, device, values: bool = True) -> _Case:
    """Tensors of ``cfg`` on ``device``; ``values=False`` (a dry run) leaves q/k uninitialised."""
    f = cfg.family
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = DTYPES[f.dtype]
    tokens = cfg.tokens
    if f.view == "packed":  # q, k and v heads side by side in one buffer: q and k are views of the same storage
        axis = 1 if f.varlen else f.layout.index("h")
        heads_q, heads_k = cfg.heads_q, cfg.heads_k
        shape = _layout_shape(f.layout, cfg.batch, cfg.seqlen, heads_q + 2 * heads_k, f.head_dim, tokens)
        fused = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device) if values else \
            torch.empty(shape, dtype=dtype, device=device)
        q = _Operand(fused, lambda st: st.narrow(axis, 0, heads_q))
        k = _Operand(fused, lambda st: st.narrow(axis, heads_q, heads_k)) if heads_k else None
    else:
        q = _operand(gen, _layout_shape(f.layout, cfg.batch, cfg.seqlen, cfg.heads_q, f.head_dim, tokens), dtype, f,
                     cfg.pad, device, values)
        k = None
        if cfg.heads_k:
            k = _operand(gen, _layout_shape(f.layout, cfg.batch, cfg.seqlen, cfg.heads_k, f.head_dim, tokens), dtype,
                         f, cfg.pad, device, values)
    arg, pos = _positions(cfg, gen, device)
    kwargs = dict(positions=arg, layout=f.layout, interleaved=f.interleaved, inplace=f.inplace,
                  conjugate=f.conjugate, rotary_dim=f.rotary_dim if cfg.explicit_rotary_dim else None)
    if f.varlen:
        cu = torch.tensor((0, *itertools.accumulate(cfg.lengths)), dtype=getattr(torch, f.cu_dtype))
        longest = max(cfg.lengths) if cfg.lengths else 0
        kwargs.update(cu_seqlens=cu.to(device),
                      max_seqlen={"exact": longest, "larger": longest + 3, "none": None}[f.max_seqlen])
    case = _Case(q, k, None, None, kwargs)
    inv_freq = inverse_frequencies(f.rotary_dim, cfg.base)
    if f.per_token:
        shared = not f.varlen and f.cos_shape != "full"
        # shared rows: the positions of the first sequence (all sequences have the same ones)
        row_positions = ref.token_positions(1, cfg.seqlen, position_ids=pos[:1]) if shared and cfg.batch else pos
        if shared and not cfg.batch:
            row_positions = torch.zeros(1, cfg.seqlen, dtype=torch.int64)
        half = ref.angles(row_positions, inv_freq)
        cos_rows = _full_width(torch.cos(half), f.interleaved).to(DTYPES[f.cos_dtype])
        sin_rows = _full_width(torch.sin(half), f.interleaved).to(DTYPES[f.cos_dtype])
        if f.cos_shape == "flat" and shared:
            cos_rows, sin_rows = cos_rows[0], sin_rows[0]  # (s, r)
        case.cos, case.sin = cos_rows.to(device), sin_rows.to(device)
        token_shape = pos.shape
        case.ref_cos = cos_rows.to(torch.float64).expand(*token_shape, f.rotary_dim)[..., None, :]
        case.ref_sin = sin_rows.to(torch.float64).expand(*token_shape, f.rotary_dim)[..., None, :]
        case.kwargs.update(per_token=True, positions=None)
    else:
        rows = _table_rows(cfg, kwargs.get("max_seqlen"))
        if values:
            cos, sin = cos_sin_table(rows, f.rotary_dim, base=cfg.base, device=device)
        else:  # a dry run: same shape, dtype and strides, no values
            cos, sin = (torch.empty(rows, f.rotary_dim // 2, device=device) for _ in range(2))
        if f.table_view == "padded":
            wide_cos = torch.zeros(rows, f.rotary_dim // 2 + 8, device=device)
            wide_sin = torch.zeros_like(wide_cos)
            wide_cos[:, :f.rotary_dim // 2], wide_sin[:, :f.rotary_dim // 2] = cos, sin
            cos, sin = wide_cos[:, :f.rotary_dim // 2], wide_sin[:, :f.rotary_dim // 2]
        case.cos, case.sin, case.ref_positions = cos, sin, pos
    return case


def _reference(cfg: Config, case: _Case, x: torch.Tensor, *, backward: bool = False) -> torch.Tensor:
    """float64 reference of the forward (or, ``backward``, of the vector-Jacobian product) in x's layout."""
    f = cfg.family
    conjugate = f.conjugate != backward  # the backward rotates by the opposite angle
    x_bshd = _to_bshd(x.detach(), f.layout)
    if f.per_token:
        out = ref.rope_from_cos_sin(x_bshd, case.ref_cos, case.ref_sin, interleaved=f.interleaved,
                                    conjugate=conjugate)
    else:
        out = ref.rope(x_bshd, case.ref_positions, base=cfg.base, rotary_dim=f.rotary_dim, interleaved=f.interleaved,
                       conjugate=conjugate)
    return _from_bshd(out, f.layout)


def _call(fn):
    try:
        return fn()
    except NotImplementedError as error:
        raise Unsupported(str(error)) from None


def run_config(cfg: Config, backend: str = "triton", device=None) -> list[str]:
    """Run one configuration on ``backend`` and return what went wrong (empty list: it passed).

    Checked: outputs vs the float64 reference (``ropekit.testing`` bound); out of place: inputs untouched, output
    contiguous with the input's shape, the partial-rotary tail copied bit for bit; in place: the result lands in q/k,
    nothing outside the views is written, the tail is untouched; backward: gradients vs the reference's VJP.
    Raises :class:`Unsupported` when the backend says NotImplementedError.
    """
    device = device or _device.DEVICE
    f = cfg.family
    case = _build_case(cfg, device)
    operands = [("q", case.q)] + ([("k", case.k)] if case.k is not None else [])
    storages = {id(op.storage): op.storage for _, op in operands}  # packed q/k share one
    if f.backward:
        for storage in storages.values():
            storage.requires_grad_()
    inputs = {name: op.tensor() for name, op in operands}
    if f.backward:
        for x in inputs.values():
            x.retain_grad()
    storage_before = {key: storage.detach().clone() for key, storage in storages.items()}
    values_before = {name: x.detach().clone() for name, x in inputs.items()}
    expected = {name: _reference(cfg, case, x) for name, x in inputs.items()}
    out_q, out_k = _call(lambda: apply_rope(inputs["q"], inputs.get("k"), case.cos, case.sin, backend=backend,
                                            **case.kwargs))
    outputs = {"q": out_q, "k": out_k}
    failures = []
    if case.k is None and out_k is not None:
        failures.append("k is None but k_out is not")
    rd = f.rotary_dim
    for name, op in operands:
        out, x = outputs[name], inputs[name]
        message = check_close_to_reference(out, expected[name], DTYPES[f.dtype])
        if message:
            failures.append(f"{name}: {message}")
        if f.inplace:
            if out.data_ptr() != x.data_ptr():
                failures.append(f"{name}: in-place output is not the input tensor")
            if rd < f.head_dim and not torch.equal(x.detach()[..., rd:], values_before[name][..., rd:]):
                failures.append(f"{name}: in-place call changed the tail past rotary_dim")
        else:
            if tuple(out.shape) != tuple(x.shape) or not out.is_contiguous():
                failures.append(f"{name}: output {_tensor_summary(out)} is not a contiguous {tuple(x.shape)}")
            elif rd < f.head_dim and not torch.equal(out.detach()[..., rd:], x.detach()[..., rd:]):
                failures.append(f"{name}: the tail past rotary_dim was not copied bit for bit")
    for key, storage in storages.items():
        if f.inplace:
            # Put the original values back into the views: anything written outside them then shows.
            probe = storage.detach().clone()
            for name, op in operands:
                if id(op.storage) == key:
                    op.view(probe).copy_(values_before[name])
            if not torch.equal(probe, storage_before[key]):
                views = [_tensor_summary(x) for x in inputs.values()]
                failures.append(f"in-place call wrote outside the views {views}")
        elif not torch.equal(storage.detach(), storage_before[key]):
            failures.append("out-of-place call modified its input")
    if f.backward and not failures:
        grads = {}
        if f.backward == "sum":  # Transformer Engine's first loss: the gradient arrives as an expanded scalar
            loss = sum(outputs[name].sum() for name, _ in operands) * 2
        else:
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            for name, _ in operands:
                grads[name] = torch.randn(outputs[name].shape, generator=gen).to(outputs[name].dtype).to(device)
            loss = sum((outputs[name] * grads[name]).sum() for name, _ in operands)
        _call(loss.backward)
        for name, _ in operands:
            x = inputs[name]
            grad_out = grads.get(name, torch.full(x.shape, 2.0, dtype=x.dtype))
            if x.grad is None:
                failures.append(f"{name}: no gradient reached the input")
                continue
            message = check_close_to_reference(x.grad, _reference(cfg, case, grad_out, backward=True),
                                               DTYPES[f.dtype])
            if message:
                failures.append(f"{name}.grad: {message}")
    return failures


# --- bounding compiles: count the Triton kernel variants a configuration needs ---------------------------------------

def _arg_class(value):
    """Triton's specialisation of one launch argument, or finer: it compiles one kernel per distinct tuple of these.

    Integers: equal to 1 (becomes a constant), divisible by 16, fits in 32 bits. Tensors: dtype and 16-byte
    alignment. Constexpr keyword arguments: their value.
    """
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -2**31 <= value < 2**31)
    if isinstance(value, float):
        return "float"
    return repr(value)


class _VariantRecorder:
    """Stands in for v4's launch during a dry run: records each launch's specialisation key, runs nothing.

    It replaces ``ropekit.triton.v4._launch(grid, pointers, ints, constexprs, num_warps, static_key)`` (below v4's
    direct-launch cache, which must not learn about launches that never ran), or the kernel object itself
    (``kernel[grid](*args, **kwargs)``) in a v4 without that function.
    """

    def __init__(self):
        self.keys: list = []

    def launch(self, grid, pointers, ints, constexprs, num_warps, static_key=None):
        self._record(*pointers, *ints, **constexprs, num_warps=num_warps)

    def __getitem__(self, grid):
        return self._record

    def _record(self, *args, **kwargs):
        self.keys.append(tuple(_arg_class(a) for a in args) + tuple(sorted((k, _arg_class(v))
                                                                          for k, v in kwargs.items())))


@contextlib.contextmanager
def _dry_run(simulate_gpu: bool = False):
    """Swap v4's launch for a recorder (and, ``simulate_gpu``, take the GPU's launch configuration)."""
    from .triton import v4

    recorder, interpret = _VariantRecorder(), _device.INTERPRET
    name, stand_in = ("_launch", recorder.launch) if hasattr(v4, "_launch") else ("rope_v4_kernel", recorder)
    real = getattr(v4, name)
    setattr(v4, name, stand_in)
    if simulate_gpu:
        _device.INTERPRET = False
    try:
        yield recorder
    finally:
        setattr(v4, name, real)
        _device.INTERPRET = interpret


def kernel_variants(cfg: Config, device=None, simulate_gpu: bool = False) -> frozenset:
    """The v4 kernel variants (specialisation keys) that running ``cfg`` forward (and backward) compiles."""
    with _dry_run(simulate_gpu) as recorder:
        run_config_dry(cfg, device or _device.DEVICE)
    return frozenset(recorder.keys)


def run_config_dry(cfg: Config, device) -> None:
    """The launches of :func:`run_config` on the Triton backend, without any checking."""
    case = _build_case(cfg, device, values=False)
    operands = [case.q] + ([case.k] if case.k is not None else [])
    if cfg.family.backward:
        for op in operands:
            op.storage.requires_grad_()
    q = case.q.tensor()
    k = case.k.tensor() if case.k is not None else None
    out_q, out_k = apply_rope(q, k, case.cos, case.sin, backend="triton", **case.kwargs)
    if cfg.family.backward:
        (out_q.sum() + (out_k.sum() if out_k is not None else 0)).backward()


def generate_configs(count: int, *, seed: int = 0, scale: Scale = GPU_SCALE, n_families: int = 48,
                     variant_quota: Optional[int] = None, device=None, simulate_gpu: bool = False,
                     jitter_tries: int = 3) -> tuple[list[Config], dict]:
    """``count`` configurations drawn round-robin from ``n_families`` random families.

    With ``variant_quota``, a family uses at most that many distinct v4 kernel variants (forward and backward
    together; each is a compile on the GPU), counted exactly by a dry run. A fresh draw is kept when its variants fit
    the family's quota; otherwise it is replaced by one of the family's earlier configurations with jittered sizes
    (kept if the dry run needs no new variant) or, failing that, with new values only (same sizes, new seed). Fresh
    draws are never redrawn, so the share of edge cases (empty tensors, one token) stays that of the generator.
    """
    rng = random.Random(seed)
    families = [draw_family(rng) for _ in range(n_families)]
    known: dict = defaultdict(set)      # family -> variants it uses
    templates: dict = defaultdict(list)  # family -> accepted configurations that launch something
    how = Counter()
    configs = []
    for i in range(count):
        family = families[i % n_families]
        cfg = draw_config(rng, family, scale)
        if variant_quota is not None:
            keys = kernel_variants(cfg, device, simulate_gpu)
            if keys <= known[family] or len(known[family] | keys) <= variant_quota:
                known[family] |= keys
                if keys:
                    templates[family].append(cfg)
                how["fresh"] += 1
            else:
                for _ in range(jitter_tries):
                    candidate = _jitter(rng, rng.choice(templates[family]), scale)
                    if kernel_variants(candidate, device, simulate_gpu) <= known[family]:
                        cfg = candidate
                        how["jittered sizes"] += 1
                        break
                else:
                    cfg = dataclasses.replace(rng.choice(templates[family]), seed=rng.randrange(2**31),
                                              base=rng.choice((10000.0, 500000.0, 1e6)))
                    how["new values"] += 1
        configs.append(cfg)
    stats = {"seed": seed, "families": n_families, "variant_quota": variant_quota,
             "kernel_variants": len(set().union(*known.values())) if variant_quota is not None else None,
             "draws": dict(how)}
    return configs, stats


def _jitter(rng: random.Random, template: Config, scale: Scale) -> Config:
    """``template`` with other sizes that usually keep its kernel variants (token counts moved by multiples of 16,
    another batch, other sequence lengths with the same longest one) and new values."""
    f = template.family
    changes = dict(seed=rng.randrange(2**31), base=rng.choice((10000.0, 500000.0, 1e6)),
                   span=max(0, template.span + 16 * rng.randint(-4, 4)))
    if f.varlen:
        longest = max(template.lengths, default=0)
        lengths = [rng.randint(0, longest) for _ in range(rng.randint(1, scale.max_seqs))] + [longest]
        rng.shuffle(lengths)
        if not (f.positions == "ids" and sum(lengths) == len(lengths) and longest != 1):
            changes["lengths"] = tuple(lengths)
    else:
        changes["batch"] = rng.choice([b for b in scale.batches if b > 0])
        if template.seqlen >= 2:
            changes["seqlen"] = max(2, template.seqlen + 16 * rng.randint(-4, 4))
    if template.offset >= 2:
        changes["offset"] = max(2, template.offset + 16 * rng.randint(-4, 4))
    candidate = dataclasses.replace(template, **changes)
    heads = max(candidate.heads_q, candidate.heads_k) * (f.head_dim + 16) * (2 if f.view == "sliced" else 1)
    return candidate if candidate.tokens * heads <= scale.max_numel else dataclasses.replace(template, **{
        k: v for k, v in changes.items() if k in ("seed", "base")})


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


class _Tally:
    """Counts of one section: passes, failures (the first few kept in full), unsupported per backend."""

    def __init__(self):
        self.checked = 0
        self.failed = 0
        self.unsupported: Counter = Counter()
        self.not_run = 0  # jobs left when a section's time budget ran out
        self.failures: list = []

    def record(self, what: str, backend: str, fn: Callable[[], list]) -> Optional[list]:
        """Run ``fn`` (returns failure messages) and count the outcome; returns the messages (None: unsupported)."""
        try:
            messages = fn()
        except Unsupported as why:
            self.add_unsupported(backend, str(why))
            return None
        except Exception as error:  # a crash is a failure of this configuration, not of the run
            messages = [f"raised {type(error).__name__}: {error}"]
            if os.environ.get("ROPEKIT_STRESS_TRACEBACK"):
                traceback.print_exc()
        self.add(what, backend, messages)
        return messages

    def add(self, what: str, backend: str, messages: list) -> None:
        self.checked += 1
        if messages:
            self.failed += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append({"case": what, "backend": backend, "messages": messages[:4]})

    def add_unsupported(self, backend: str, why: str) -> None:
        self.unsupported[f"{backend}: {why[:120]}"] += 1

    def add_outcomes(self, what: str, outcome: Optional[dict]) -> None:
        """A job's outcome: {backend: failure messages, or "unsupported: why"}; None: not run (time budget)."""
        if outcome is None:
            self.not_run += 1
            return
        for backend, result in outcome.items():
            if isinstance(result, str):
                self.add_unsupported(backend, result.removeprefix("unsupported: "))
            else:
                self.add(what, backend, result)

    def as_dict(self) -> dict:
        return {"checked": self.checked, "passed": self.checked - self.failed, "failed": self.failed,
                "unsupported": dict(self.unsupported), "not_run": self.not_run, "failures": self.failures}


def run_property(count: int, *, seed: int = 0, backends=("triton",), scale: Optional[Scale] = None,
                 n_families: int = 48, variant_quota: Optional[int] = 4, workers: int = 1,
                 budget_s: Optional[float] = None, device=None) -> dict:
    """Section 1: ``count`` random configurations on every backend (each forward, some backward)."""
    device = device or _device.DEVICE
    scale = scale or (CPU_SCALE if _device.INTERPRET else GPU_SCALE)
    start = time.perf_counter()
    configs, stats = generate_configs(count, seed=seed, scale=scale, n_families=n_families,
                                      variant_quota=None if _device.INTERPRET else variant_quota, device=device)
    generated = time.perf_counter()
    families = {}
    groups = [families.setdefault(cfg.family, len(families)) for cfg in configs]  # a family's variants: one worker
    outcomes = run_jobs([("property", cfg, tuple(backends), {}) for cfg in configs], groups, workers, budget_s)
    tally = _Tally()
    for cfg, outcome in zip(configs, outcomes):
        tally.add_outcomes(cfg.describe(), outcome)
    return {"configs": len(configs) - tally.not_run, "planned": len(configs), "backends": list(backends),
            **tally.as_dict(), "generator": stats,
            "with_backward": sum(bool(c.family.backward) for c in configs), "coverage": coverage(configs),
            "workers": workers, "seconds_generating": round(generated - start, 1),
            "seconds": round(time.perf_counter() - start, 1)}


# --- independent jobs, optionally spread over worker processes ------------------------------------------------------
# Every new Triton kernel variant is a compile (about a second of one CPU core); the property run and TE's matrix
# need a few hundred. Jobs that share variants (one family; one TE dtype/size/pairing group) go to the same worker,
# so each variant is compiled once, in parallel with the others.

def _run_job(job) -> dict:
    """One job -> {backend: list of failure messages, or "unsupported: why"}."""
    kind, item, backends, options = job
    if kind == "property":
        result = {}
        for backend in backends:
            try:
                result[backend] = run_config(item, backend)
            except Unsupported as why:
                result[backend] = f"unsupported: {why}"
            except Exception as error:  # noqa: BLE001 - a crash fails this configuration only
                result[backend] = [f"raised {type(error).__name__}: {error}"]
        return result
    if kind == "te":
        return {backend: (f"unsupported: {outcome}" if isinstance(outcome, Unsupported) else outcome)
                for backend, outcome in run_te_case(item, backends, **options).items()}
    raise ValueError(kind)


def run_jobs(jobs: list, groups: list, workers: int = 1, budget_s: Optional[float] = None) -> list:
    """Run ``jobs`` and return their outcomes in order (None for a job not started within ``budget_s``).

    With ``workers`` > 1, the jobs of one group run in the same ``python -m ropekit.stress --worker`` process (groups
    spread over the workers, largest first; inside a worker the groups take turns, so that a run cut short by the
    budget still covers every group). Each worker streams its outcomes to a file, so a killed worker loses nothing
    it finished.
    """
    deadline = None if budget_s is None else time.time() + budget_s
    if workers <= 1 or len(set(groups)) <= 1:
        return [_run_job(job) if deadline is None or time.time() < deadline else None for job in jobs]
    import pickle
    import subprocess
    import tempfile

    members = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    loads, shards = [0] * workers, [[] for _ in range(workers)]
    for group in sorted(members, key=lambda g: -len(members[g])):
        w = loads.index(min(loads))
        shards[w].append(members[group])
        loads[w] += len(members[group])
    outcomes: list = [None] * len(jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // workers)))
    with tempfile.TemporaryDirectory(prefix="ropekit-stress-") as tmp:
        procs = []
        for w, group_lists in enumerate(shards):
            # interleave this worker's groups: job 0 of every group, then job 1 of every group, ...
            shard = [i for rank in range(max(map(len, group_lists), default=0)) for g in group_lists
                     if rank < len(g) for i in (g[rank],)]
            if not shard:
                continue
            jobs_path, out_path, log_path = (os.path.join(tmp, f"{w}.{ext}") for ext in ("jobs", "out", "log"))
            with open(jobs_path, "wb") as handle:
                pickle.dump(([jobs[i] for i in shard], deadline), handle)
            log = open(log_path, "w")
            procs.append((shard, out_path, log_path, log, subprocess.Popen(
                [sys.executable, "-m", "ropekit.stress", "--worker", jobs_path, out_path], stdout=log,
                stderr=subprocess.STDOUT, env=env)))
        hard_stop = time.time() + (budget_s if budget_s is not None else 3600) + 120
        for shard, out_path, log_path, log, proc in procs:
            try:
                proc.wait(timeout=max(1.0, hard_stop - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            finished = []
            if os.path.exists(out_path):
                with open(out_path, "rb") as handle:
                    while True:
                        try:
                            finished.append(pickle.load(handle))
                        except (EOFError, pickle.UnpicklingError):
                            break
            for index, outcome in zip(shard, finished):
                outcomes[index] = outcome
            if proc.returncode != 0:
                with open(log_path) as handle:
                    tail = handle.read()[-600:]
                if len(finished) < len(shard):  # the job that was running when the worker died failed
                    crashed = shard[len(finished)]
                    outcomes[crashed] = {b: [f"worker exited with {proc.returncode}: {tail}"]
                                         for b in jobs[crashed][2]}
    return outcomes


def _worker(jobs_path: str, out_path: str) -> int:
    """``--worker``: run the pickled jobs until the deadline, appending each outcome to ``out_path``."""
    import pickle

    with open(jobs_path, "rb") as handle:
        jobs, deadline = pickle.load(handle)
    with open(out_path, "wb") as out:
        for job in jobs:
            outcome = _run_job(job) if deadline is None or time.time() < deadline else None
            pickle.dump(outcome, out)
            out.flush()
    return 0


# ====================================================================================================================
# 2. Transformer Engine's test matrix
# ====================================================================================================================

def reference_on_device(x: torch.Tensor, positions: torch.Tensor, *, rotary_dim: int, interleaved: bool,
                        conjugate: bool = False, base: float = 10000.0) -> torch.Tensor:
    """``ref.rope``'s arithmetic, kept on x's device (for GPU-sized tensors): the float64 angles and cos/sin of
    ``ref.angles`` (computed on the CPU exactly as ``ref.rope`` does) and the pair rotation of ``ref.rotate_pairs``.
    Bit-identical to ``ref.rope`` on the CPU (tested)."""
    theta = ref.angles(positions, inverse_frequencies(rotary_dim, base))[..., None, :]
    cos, sin = torch.cos(theta).to(x.device), torch.sin(theta).to(x.device)
    x64 = x.detach().to(torch.float64)
    rotated = ref.rotate_pairs(x64[..., :rotary_dim], cos, sin, interleaved=interleaved, conjugate=conjugate)
    return torch.cat((rotated, x64[..., rotary_dim:]), dim=-1)


@dataclass(frozen=True)
class TECase:
    """One row of TE's matrix (``test_fused_rope`` / ``test_fused_rope_thd``), loss shapes included."""

    dtype: str
    seq_length: int                   # rows of the cos/sin table (TE's ``emb``); tokens = seq_length - margin
    hidden_size: int                  # head_dim
    rotary_percent: float
    margin: int
    tensor_format: str                # sbhd | bshd | thd
    transpose: Optional[tuple]        # TE's non-contiguous input: storage transposed along these axes
    interleaved: bool
    start_positions: bool
    cu_seqlens: tuple = ()            # thd only

    @property
    def rotary_dim(self) -> int:
        return int(self.hidden_size * self.rotary_percent)

    def describe(self) -> str:
        return (f"{self.tensor_format} {self.dtype} seq{self.seq_length} hidden{self.hidden_size} "
                f"rotary{self.rotary_percent} margin{self.margin} transpose={self.transpose} "
                f"{'gptj' if self.interleaved else 'neox'} start_positions={self.start_positions}")


TE_CU_SEQLENS = (0, 400, 542, 711, 727, 752, 1270, 1426, 1450, 1954, 2044, 2048)  # TE's packed batch


def te_cases(full: bool = True, seq_scale: int = 1) -> list[TECase]:
    """TE's parameter matrix. ``full``: every combination TE runs (its skips applied: start positions need a
    margin); otherwise a seeded slice that still covers every value of every dimension. ``seq_scale`` divides
    the sequence lengths (and the packed lengths) for the interpreter."""
    cases = []
    for dtype in ("fp32", "bf16", "fp16"):
        for seq in (2048, 4096):
            for hidden in (128, 256):
                for rp in (0.5, 1.0):
                    for margin in (0, 10):
                        for fmt in ("sbhd", "bshd"):
                            for transpose in (None, (0, 1), (2, 3)):
                                for interleaved in (True, False):
                                    for start in (True, False):
                                        if margin == 0 and start:
                                            continue  # TE: start positions need table rows beyond the sequence
                                        cases.append(TECase(dtype, seq // seq_scale, hidden, rp, margin, fmt,
                                                            transpose, interleaved, start))
    cu = tuple(round(c / seq_scale) for c in TE_CU_SEQLENS)
    for dtype in ("fp32", "bf16", "fp16"):
        for hidden in (128, 256):
            for rp in (0.5, 1.0):
                for transpose in (None, (1, 2)):
                    for interleaved in (True, False):
                        for start in (True, False):
                            cases.append(TECase(dtype, cu[-1], hidden, rp, 10, "thd", transpose, interleaved, start,
                                                cu))
    if full:
        return cases
    rng = random.Random(0)
    fixed = [c for c in cases if c.tensor_format != "thd"]
    thd = [c for c in cases if c.tensor_format == "thd"]
    chosen = rng.sample(fixed, 12) + rng.sample(thd, 4)
    # make sure every value of every dimension appears at least once
    for attr in ("dtype", "hidden_size", "rotary_percent", "margin", "tensor_format", "transpose", "interleaved",
                 "start_positions"):
        for value in {getattr(c, attr) for c in cases}:
            if not any(getattr(c, attr) == value for c in chosen):
                chosen.append(next(c for c in cases if getattr(c, attr) == value))
    return chosen


def run_te_case(case: TECase, backends=("triton",), *, batch: int = 2, heads: int = 8, seed: int = 0,
                device=None) -> dict:
    """Run one TE row on every backend: forward vs the reference, then both of TE's loss shapes (each gradient vs
    the reference's VJP). Returns {backend: [failure messages]} (or an :class:`Unsupported` where the backend says
    NotImplementedError; any other exception is a failure message)."""
    device = device or _device.DEVICE
    dtype = DTYPES[case.dtype]
    gen = torch.Generator(device=device).manual_seed(seed)
    rd = case.rotary_dim
    cos, sin = cos_sin_table(case.seq_length, rd, device=device)  # TE's emb: seq_length rows
    if case.tensor_format == "thd":
        cu = torch.tensor(case.cu_seqlens, dtype=torch.int32, device=device)
        n_seqs, tokens = len(case.cu_seqlens) - 1, case.cu_seqlens[-1]
        values = torch.randn((tokens, heads, case.hidden_size), generator=gen, device=device).to(dtype)
        starts = torch.randint(0, case.margin, (n_seqs,), generator=gen, device=device, dtype=torch.int32) \
            if case.start_positions else None
        positions = ref.varlen_positions(case.cu_seqlens, offsets=starts.cpu() if starts is not None else 0)
        kwargs = dict(layout="thd", cu_seqlens=cu, max_seqlen=max(b - a for a, b in zip(case.cu_seqlens,
                                                                                        case.cu_seqlens[1:])))
    else:
        tokens = case.seq_length - case.margin
        values = torch.randn((tokens, batch, heads, case.hidden_size), generator=gen, device=device).to(dtype)
        if case.tensor_format == "bshd":
            values = values.transpose(0, 1).contiguous()
        starts = torch.randint(0, case.margin, (batch,), generator=gen, device=device, dtype=torch.int32) \
            if case.start_positions else None
        positions = ref.token_positions(batch, tokens, offsets=starts.cpu() if starts is not None else 0)
        kwargs = dict(layout=case.tensor_format)
    if case.transpose:  # TE: t.transpose(*p).contiguous().transpose(*p) — same values, other strides
        values = values.transpose(*case.transpose).contiguous().transpose(*case.transpose)
    grad_full = torch.randn(values.shape, generator=gen, device=device).to(dtype)

    def expect(x, conjugate=False):
        out = reference_on_device(_to_bshd(x, case.tensor_format), positions, rotary_dim=rd,
                                  interleaved=case.interleaved, conjugate=conjugate)
        return _from_bshd(out, case.tensor_format)

    want = expect(values)
    want_grad = {"sum": expect(torch.full(values.shape, 2.0, dtype=dtype, device=device), conjugate=True),
                 "full": expect(grad_full, conjugate=True)}
    results = {}
    for backend in backends:
        failures = []
        x = values.detach().clone().requires_grad_()  # clone keeps the (transposed) strides
        try:
            out, _ = apply_rope(x, None, cos, sin, positions=starts, interleaved=case.interleaved, rotary_dim=rd,
                                backend=backend, **kwargs)
            message = check_close_to_reference(out, want, dtype)
            if message:
                failures.append(f"output: {message}")
            if not out.is_contiguous():
                failures.append(f"output is not contiguous: {_tensor_summary(out)}")
            for loss_name in ("sum", "full"):
                x.grad = None
                loss = out.sum() * 2 if loss_name == "sum" else (out * grad_full).sum()  # TE's two loss shapes
                loss.backward(retain_graph=loss_name == "sum")
                message = check_close_to_reference(x.grad, want_grad[loss_name], dtype)
                if message:
                    failures.append(f"grad ({loss_name} loss): {message}")
        except NotImplementedError as why:
            results[backend] = Unsupported(str(why))
            continue
        except Exception as error:  # noqa: BLE001 - a crash fails this case, the matrix goes on
            failures.append(f"raised {type(error).__name__}: {error}")
        results[backend] = failures
    return results


def run_te_matrix(*, full: bool = True, backends=("triton",), seq_scale: int = 1, batch: int = 2, heads: int = 8,
                  workers: int = 1, budget_s: Optional[float] = None) -> dict:
    """Section 2: TE's matrix; every row counts as two TE cases (one per loss shape), as TE parametrises it."""
    start = time.perf_counter()
    cases = te_cases(full, seq_scale)
    jobs = [("te", case, tuple(backends), dict(batch=batch, heads=heads, seed=i)) for i, case in enumerate(cases)]
    kernel_groups = {}  # compile-time values of a row: dtype, head_dim, rotary_dim, pairing
    groups = [kernel_groups.setdefault((c.dtype, c.hidden_size, c.rotary_percent, c.interleaved), len(kernel_groups))
              for c in cases]
    tally = _Tally()
    for case, outcome in zip(cases, run_jobs(jobs, groups, workers, budget_s)):
        tally.add_outcomes(case.describe(), outcome)
    ran = len(cases) - tally.not_run
    dimensions = {name: sorted({str(getattr(c, attr)) for c in cases}) for name, attr in (
        ("dtype", "dtype"), ("seq_length (table rows)", "seq_length"), ("hidden (head_dim)", "hidden_size"),
        ("rotary_percent", "rotary_percent"), ("margin", "margin"), ("format", "tensor_format"),
        ("transpose", "transpose"), ("interleaved", "interleaved"), ("start positions", "start_positions"))}
    return {"rows": ran, "planned_rows": len(cases), "te_cases": 2 * ran, "full_matrix": full, "dimensions": dimensions,
            "backends": list(backends),
            "batch": batch, "heads": heads, "seq_lengths": sorted({c.seq_length for c in cases}),
            "formats": dict(Counter(c.tensor_format for c in cases)), **tally.as_dict(), "workers": workers,
            "seconds": round(time.perf_counter() - start, 1)}


# ====================================================================================================================
# 3. The driver compute-sanitizer runs (tools/sanitize.sh)
# ====================================================================================================================

def sanitize_configs() -> list[Config]:
    """Shapes that exercise every mask and tail of v4 / CUDA: non-power-of-two head_dim and pair counts, partial
    rotary with a masked tail, head and token blocks with remainders, GQA, k None, in place, varlen with empty and
    uneven sequences, per-token rows, misaligned storage, every dtype, backward (conjugate). Tables have exactly
    the rows needed, so any read past them is outside the allocation."""
    F, C = Family, Config
    return [
        C(F(layout="bshd", dtype="fp32", head_dim=80, rotary_dim=80, heads="gqa"), 1, 2, 37, (), 6, 2),
        C(F(layout="sbhd", view="sliced", view_dim=0, dtype="bf16", head_dim=40, rotary_dim=24, interleaved=True,
            positions="offsets"), 2, 3, 19, (), 5, 1, pad=8, span=50),
        C(F(layout="bhsd", view="transposed", perm=(0, 2, 3, 1), dtype="fp16", head_dim=96, rotary_dim=64,
            positions="ids", inplace=True), 3, 2, 21, (), 3, 3, span=70),
        C(F(layout="bshd", view="misaligned", dtype="bf16", head_dim=128, rotary_dim=128, positions="int",
            heads="mqa"), 4, 3, 33, (), 7, 1, offset=5),
        C(F(layout="bshd", view="misaligned", dtype="fp16", head_dim=128, rotary_dim=64, interleaved=True,
            positions="ids-1d", heads="none"), 5, 2, 17, (), 9, 0, span=30),
        C(F(layout="bshd", dtype="fp32", head_dim=256, rotary_dim=128, positions="per-token", cos_dtype="bf16",
            cos_shape="shared", backward="full"), 6, 2, 13, (), 3, 1, span=40),
        C(F(layout="bshd", dtype="fp64", head_dim=48, rotary_dim=48, interleaved=True, positions="offsets-0d",
            backward="sum"), 7, 2, 9, (), 2, 2, span=9),
        C(F(layout="bshd", dtype="bf16", head_dim=128, rotary_dim=128, positions="offsets", heads="gqa"),
          8, 5, 1, (), 12, 3, span=90),  # decode: one token per sequence
        C(F(layout="bshd", dtype="bf16", head_dim=64, rotary_dim=64), 9, 2, 0, (), 4, 2),  # empty sequence
        C(F(layout="thd", dtype="bf16", head_dim=80, rotary_dim=80, positions="offsets", max_seqlen="larger",
            heads="gqa"), 10, 0, 0, (5, 0, 1, 23, 2), 4, 2, span=40),
        C(F(layout="thd", view="transposed", perm=(1, 0, 2), dtype="fp16", head_dim=64, rotary_dim=32,
            interleaved=True, positions="ids", cu_dtype="int64"), 11, 0, 0, (7, 3, 11), 3, 1, span=60),
        C(F(layout="thd", dtype="fp32", head_dim=128, rotary_dim=128, positions="per-token", backward="full"),
          12, 0, 0, (4, 9), 2, 2, span=20),
        C(F(layout="bshd", view="packed", dtype="bf16", head_dim=128, rotary_dim=64, positions="offsets",
            heads="gqa", inplace=True), 13, 3, 11, (), 8, 2, span=30),  # q, k, v heads of one fused buffer
        C(F(layout="bshd", dtype="fp32", head_dim=80, rotary_dim=80, positions="ids", backward="full"),
          14, 3, 7, (), 3, 3, span=40),  # q and k of one shape: the paired flat path, forward and conjugate
    ]


def _ladder_launchers() -> list:
    """v1..v3 launchers ``rope_vN(x, cos, sin)`` (positions 0..S-1, NeoX) with the inputs each one accepts:
    (name, launcher or None, why not, dtypes, views, head_dim). v1 takes contiguous fp32 and power-of-two head_dim
    only (no channel masks); v2/v3 get head_dim 80 (40 pairs in a block of 64: masked)."""
    import importlib

    ladder = []
    for name, dtypes, views, head_dim in (("v1", ("fp32",), ("contiguous",), 64),
                                          ("v2", ("fp32", "bf16", "fp16"), ("contiguous", "transposed"), 80),
                                          ("v3", ("fp32", "bf16", "fp16"), ("contiguous", "transposed"), 80)):
        try:
            launch = getattr(importlib.import_module(f"ropekit.triton.{name}"), f"rope_{name}")
        except (ImportError, AttributeError) as error:
            ladder.append((name, None, str(error), (), (), head_dim))
            continue
        ladder.append((name, launch, "", dtypes, views, head_dim))
    return ladder


_SANITIZE_V4_TILES = (None, LaunchConfig(2, 1, 16, fused_qk=True, evict_first=True),
                      LaunchConfig(2, 1, 32, fused_qk=True, evict_first=True),
                      LaunchConfig(2, 1, 16, fused_qk=True, evict_first=True, flat=2048, flat_warps=8),
                      LaunchConfig(2, 1, 16, fused_qk=True, evict_first=True, flat=512, flat_warps=8,
                                   flat_paired=True, flat_streaming=False))


@contextlib.contextmanager
def _forced_v4_tile(tile):
    """Make Triton v4 use ``tile`` for every shape (None: its own launch table)."""
    if tile is None:
        yield
        return
    saved = v4.launch_config
    v4.launch_config = lambda *args: tile
    try:
        yield
    finally:
        v4.launch_config = saved


def sanitize_driver(device=None, verbose: bool = True) -> int:
    """Run every kernel once on mask-and-tail shapes (what compute-sanitizer watches). Returns 0 when everything ran
    and matched the reference, 1 otherwise; prints one line per launch."""
    device = device or _device.DEVICE
    backends, why = available_backends()
    ran, problems = [], []

    def say(line):
        if verbose:
            print(line, flush=True)

    for name, launch, error, dtypes, views, d in _ladder_launchers():
        if launch is None:
            say(f"skip  triton {name}: not available ({error})")
            continue
        for dtype in dtypes:
            for view in views:
                # 37 tokens and 3 heads: remainders in every token and head block (5 tokens under the interpreter,
                # where v1/v2 run one Python program per row)
                b, s, h = 2, (37 if device == "cuda" else 5), 3
                x = torch.randn(b, s, h, d, device=device).to(DTYPES[dtype])
                if view == "transposed":
                    x = x.transpose(1, 2).contiguous().transpose(1, 2)
                cos, sin = cos_sin_table(s, d, device=device)  # exactly s rows
                label = f"triton {name} {dtype} {view} {tuple(x.shape)}"
                try:
                    out = launch(x, cos, sin)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    message = check_close_to_reference(out, ref.rope(x, ref.token_positions(b, s)))
                except Exception as exc:  # noqa: BLE001 - report and keep going: the sanitizer wants every kernel
                    message = f"raised {type(exc).__name__}: {exc}"
                (problems if message else ran).append(f"{label}: {message}" if message else label)
                say(("FAIL  " if message else "ok    ") + label + (f": {message}" if message else ""))
    for backend in backends:
        # v4 picks its tile from the token count; the small sanitizer shapes would never reach the fused tile that
        # large prefills use, so the Triton configurations also run with it forced.
        for tile in _SANITIZE_V4_TILES if backend == "triton" else (None,):
            for cfg in sanitize_configs():
                label = f"{backend} {cfg.describe()}" + (f" tile={tuple(tile)}" if tile else "")
                try:
                    with _forced_v4_tile(tile):
                        messages = run_config(cfg, backend, device)
                        if device == "cuda":
                            torch.cuda.synchronize()
                except Unsupported as reason:
                    say(f"skip  {label}: unsupported ({reason})")
                    continue
                except Exception as exc:  # noqa: BLE001
                    messages = [f"raised {type(exc).__name__}: {exc}"]
                (problems if messages else ran).append(label)
                say(("FAIL  " if messages else "ok    ") + label + (f": {messages}" if messages else ""))
        # positions beyond the table: the kernel must mask the loads (NaN out), never read past the table
        q = torch.randn(2, 5, 3, 80, device=device)
        cos, sin = cos_sin_table(8, 80, device=device)
        label = f"{backend} out-of-table position ids (masked loads)"
        try:
            out, _ = apply_rope(q, None, cos, sin, positions=torch.tensor([[0, 1, 7, 8, 1000]] * 2, device=device),
                                backend=backend)
            ok = bool(torch.isfinite(out[:, :3]).all()) and bool(torch.isnan(out[:, 3:]).all())
            message = "" if ok else "tokens past the table are not NaN (or tokens inside it are not finite)"
        except Exception as exc:  # noqa: BLE001
            message = f"raised {type(exc).__name__}: {exc}"
        (problems if message else ran).append(label)
        say(("FAIL  " if message else "ok    ") + label + (f": {message}" if message else ""))
    if "cuda" in backends:
        from .cuda import cos_sin_table_cuda

        for fast in (False, True):  # the table kernel (fast=True: the course's float32-angle variant)
            label = f"cuda table kernel fast={fast} (1003 rows, rotary_dim 80)"
            try:
                cos, sin = cos_sin_table_cuda(1003, 80, 500000.0, fast=fast)
                torch.cuda.synchronize()
                message = "" if cos.shape == (1003, 40) and bool(torch.isfinite(cos).all()) else "bad table"
            except Exception as exc:  # noqa: BLE001
                message = f"raised {type(exc).__name__}: {exc}"
            (problems if message else ran).append(label)
            say(("FAIL  " if message else "ok    ") + label + (f": {message}" if message else ""))
    else:
        say(f"skip  cuda backend: {why}")
    say(f"sanitize driver: {len(ran)} launches ok, {len(problems)} problems")
    return 1 if problems else 0


# ====================================================================================================================
# 4. Large tensors
# ====================================================================================================================

def run_large(backends=("triton",), *, numel: int = 2_200_000_000, heads: int = 32, head_dim: int = 128,
              dtype: torch.dtype = torch.bfloat16, device=None) -> dict:
    """Section 4: q of ``numel`` elements (past 2**31 by default) as (2, seq, heads, head_dim); spot-check the first,
    middle and last tokens, and the tokens around element 2**31, against the reference."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    batch = 2
    seqlen = -(-numel // (batch * heads * head_dim))
    shape = (batch, seqlen, heads, head_dim)
    total = math.prod(shape)
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    cos, sin = cos_sin_table(seqlen, head_dim, device=device)
    per_token = heads * head_dim
    boundary_token = (2**31 // per_token)  # flat token index holding element 2**31
    spots = {"first": (0, 0), "middle": (0, seqlen // 2), "last": (batch - 1, seqlen - 1)}
    if total > 2**31:
        b, s = divmod(boundary_token, seqlen)
        spots["element 2**31"] = (b, s)
    tally = _Tally()
    rows, outputs = [], {}
    for backend in backends:
        def check(backend=backend):
            try:
                out, _ = apply_rope(q, None, cos, sin, backend=backend)
            except NotImplementedError as why:
                raise Unsupported(str(why)) from None
            messages = []
            for name, (b, s) in spots.items():
                lo, hi = max(0, s - 2), min(seqlen, s + 3)  # a few tokens around each spot
                expected = ref.rope(q[b:b + 1, lo:hi], ref.token_positions(1, hi - lo, offsets=lo))[0]
                message = check_close_to_reference(out[b, lo:hi], expected)
                rows.append({"backend": backend, "spot": name, "batch": b, "tokens": [lo, hi], "ok": message is None})
                if message:
                    messages.append(f"{name}: {message}")
            if bool(torch.isnan(out).any()):
                messages.append("NaN in the output")
            outputs[backend] = out
            return messages
        tally.record(f"q {shape}", backend, check)
    cross = None
    if len(outputs) == 2:
        a, b = outputs.values()
        cross = bool(torch.equal(a, b))
    result = {"shape": list(shape), "numel": total, "past_2_31": total > 2**31, "dtype": DTYPE_NAMES[dtype],
              "spots": rows, "backends_bitwise_equal": cross, **tally.as_dict(),
              "seconds": round(time.perf_counter() - start, 1)}
    del q, outputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


# ====================================================================================================================
# 5. Determinism and batch invariance
# ====================================================================================================================

def run_determinism(backends=("triton",), *, repeats: int = 100, batch: int = 64, seqlen: int = 256,
                    heads: tuple = (8, 2), head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                    device=None) -> dict:
    """Section 5: bitwise reproducibility and invariance. Each check is a row {check, backend, bitwise_equal}; a
    row that is not equal is a failure (except the informational triton-vs-cuda row)."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    hq, hk = heads
    q = torch.randn(batch, seqlen, hq, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
    k = torch.randn(batch, seqlen, hk, head_dim, generator=gen, device=device, dtype=torch.float32).to(dtype)
    cos, sin = cos_sin_table(4 * seqlen, head_dim, device=device)
    offsets = torch.randint(0, 3 * seqlen, (batch,), generator=gen, device=device)
    grad = torch.randn(q.shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    rows, tally, first_by_backend = [], _Tally(), {}

    def row(check, backend, a, b, *, counted=True, note=""):
        equal = bool(torch.equal(a, b))
        diff = 0.0 if equal else float((a.double() - b.double()).abs().max())
        rows.append({"check": check, "backend": backend, "bitwise_equal": equal, "max_abs_diff": diff, "note": note})
        if counted:
            tally.add(check, backend, [] if equal else [f"not bitwise equal (max |diff| {diff:.3g})"])

    def rope(x, kk=None, **kw):
        return apply_rope(x, kk, cos, sin, **kw)

    def checks(backend):
        bk = dict(backend=backend)
        first_q, first_k = rope(q, k, positions=offsets, **bk)
        first_by_backend[backend] = first_q
        first = torch.cat((first_q.flatten(), first_k.flatten()))
        differing = None  # the first repeat that differs, if any
        for _ in range(repeats - 1):
            again = torch.cat([t.flatten() for t in rope(q, k, positions=offsets, **bk)])
            if differing is None and not torch.equal(again, first):
                differing = again
        row(f"{repeats} repeated forward runs (q and k)", backend, first if differing is None else differing, first)
        x = q.detach().clone().requires_grad_()
        first_grad, differing = None, None
        for _ in range(repeats):
            x.grad = None
            rope(x, None, positions=offsets, **bk)[0].backward(grad)
            if first_grad is None:
                first_grad = x.grad
            elif differing is None and not torch.equal(x.grad, first_grad):
                differing = x.grad
        row(f"{repeats} repeated backward runs", backend, first_grad if differing is None else differing, first_grad)
        # batch of 1 (a contiguous copy) vs the same sequence inside the batch
        for j in sorted({0, batch // 2, batch - 1}):
            alone_q, alone_k = rope(q[j:j + 1].clone(), k[j:j + 1].clone(), positions=offsets[j:j + 1], **bk)
            row(f"batch of 1 vs batch of {batch}: sequence {j}, q and k", backend,
                torch.cat((alone_q[0].flatten(), alone_k[0].flatten())),
                torch.cat((first_q[j].flatten(), first_k[j].flatten())))
        # prefill (positions 0..S-1) vs decoding one token with its position given as an offset
        prefill_q, _ = rope(q, k, **bk)
        for t in sorted({0, 1, seqlen // 2, seqlen - 1}):
            step = q[:, t:t + 1].clone()
            by_tensor, _ = rope(step, None, positions=torch.full((batch,), t, device=device), **bk)
            row(f"prefill vs decode: token {t}, offsets tensor", backend, by_tensor[:, 0], prefill_q[:, t])
            by_int, _ = rope(step, None, positions=t, **bk)
            row(f"prefill vs decode: token {t}, int offset", backend, by_int[:, 0], prefill_q[:, t])
        # KV-cache decode: every sequence at its own position, vs the same token inside a prefill
        lengths = torch.randint(0, seqlen, (batch,), generator=gen, device=device)
        every = torch.arange(batch, device=device)
        decode_q, _ = rope(q[every, lengths][:, None], None, positions=lengths, **bk)
        row("KV-cache decode (per-sequence positions) vs prefill", backend, decode_q[:, 0], prefill_q[every, lengths])
        # layouts: the same values stored as sbhd / bhsd, or packed as thd
        for layout in ("sbhd", "bhsd"):
            out, _ = rope(q.permute(_TO_BSHD[layout]).contiguous(), None, positions=offsets, layout=layout, **bk)
            row(f"bshd vs {layout}", backend, _to_bshd(out, layout), first_q)
        cu = torch.arange(0, batch * seqlen + 1, seqlen, device=device, dtype=torch.int32)
        try:
            out, _ = rope(q.reshape(batch * seqlen, hq, head_dim), None, positions=offsets.reshape(-1, 1), layout="thd",
                          cu_seqlens=cu, max_seqlen=seqlen, **bk)
            row("bshd vs thd (packed)", backend, out.reshape(q.shape), first_q)
        except NotImplementedError as why:
            rows.append({"check": "bshd vs thd (packed)", "backend": backend, "bitwise_equal": None,
                         "max_abs_diff": 0.0, "note": f"unsupported: {why}"})
        # q alone vs q and k in one launch (other head blocks in the grid); in place vs out of place
        alone, _ = rope(q, None, positions=offsets, **bk)
        row("q alone vs q with k in one launch", backend, alone, first_q)
        in_place = q.clone()
        rope(in_place, None, positions=offsets, inplace=True, **bk)
        row("in place vs out of place", backend, in_place, first_q)

    for backend in backends:
        try:
            checks(backend)
        except Exception as error:  # noqa: BLE001 - a crash is one failure; the other backend still runs
            tally.add("determinism", backend, [f"raised {type(error).__name__}: {error}"])
    if len(first_by_backend) == 2:
        row("triton vs cuda, same inputs (informational: two compilers may contract multiply-adds differently)",
            "both", *first_by_backend.values(), counted=False)
    return {"shape_q": [batch, seqlen, hq, head_dim], "heads_k": hk, "dtype": DTYPE_NAMES[dtype],
            "repeats": repeats, "rows": rows, **tally.as_dict(), "seconds": round(time.perf_counter() - start, 1)}


# ====================================================================================================================
# 6. Safe failure
# ====================================================================================================================

def _other_device(device) -> str:
    """A device that is not q's: the CPU next to a GPU; 'meta' next to the CPU (validation needs no data)."""
    return "cpu" if str(device).startswith("cuda") else "meta"


@dataclass(frozen=True)
class Invalid:
    """One invalid call: ``change(valid)`` returns the arguments to override; the call must raise ``error`` whose
    message contains ``words``. ``check_mode``: run with ROPEKIT_CHECK=1 (values inside device tensors)."""

    name: str
    change: Callable[[dict], dict]
    error: type
    words: str
    check_mode: bool = False


def _valid_call(device) -> dict:
    """A valid call (bshd, GQA 4/2 heads, head_dim 32, table of 16 rows) that the table's entries break."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 32, generator=gen).to(device)
    k = torch.randn(2, 3, 2, 32, generator=gen).to(device)
    cos, sin = cos_sin_table(16, 32, device=device)
    return dict(q=q, k=k, cos=cos, sin=sin)


def _thd(v, **extra):
    """The valid call packed as thd (6 tokens in sequences of 2 and 4)."""
    device = v["q"].device
    return dict(q=v["q"].reshape(6, 4, 32), k=v["k"].reshape(6, 2, 32), layout="thd",
                cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32, device=device), max_seqlen=4, **extra)


def _dev(v):
    return v["q"].device


INVALID_INPUTS = [
    # rotary_dim
    Invalid("rotary_dim odd", lambda v: dict(rotary_dim=7), ValueError, "rotary_dim"),
    Invalid("rotary_dim zero", lambda v: dict(rotary_dim=0), ValueError, "rotary_dim"),
    Invalid("rotary_dim negative", lambda v: dict(rotary_dim=-2), ValueError, "rotary_dim"),
    Invalid("rotary_dim > head_dim", lambda v: dict(rotary_dim=64), ValueError, "rotary_dim"),
    Invalid("rotary_dim wider than cos/sin", lambda v: dict(cos=v["cos"][:, :4], sin=v["sin"][:, :4], rotary_dim=16),
            ValueError, "rotary_dim"),
    Invalid("rotary_dim a float", lambda v: dict(rotary_dim=32.0), TypeError, "rotary_dim"),
    Invalid("rotary_dim a bool", lambda v: dict(rotary_dim=True), TypeError, "rotary_dim"),
    # shapes
    Invalid("head_dim of k differs", lambda v: dict(k=v["k"][..., :16]), ValueError, "head_dim"),
    Invalid("q has 3 dims in bshd", lambda v: dict(q=v["q"][0]), ValueError, "q must have 4 dimensions"),
    Invalid("k has 5 dims", lambda v: dict(k=v["k"][None]), ValueError, "k must have 4 dimensions"),
    Invalid("batch of k differs", lambda v: dict(k=v["k"][:1]), ValueError, "k"),
    Invalid("seq of k differs", lambda v: dict(k=v["k"][:, :2]), ValueError, "k"),
    Invalid("seq of k differs (sbhd)", lambda v: dict(layout="sbhd", k=v["k"][:1]), ValueError, "k"),
    Invalid("cos and sin shapes differ", lambda v: dict(sin=v["sin"][:, :8]), ValueError, "cos and sin"),
    Invalid("cos table 1-D", lambda v: dict(cos=v["cos"][:, 0], sin=v["sin"][:, 0]), ValueError, "2-D"),
    Invalid("per-token rows that do not broadcast",
            lambda v: dict(cos=v["cos"][:5].repeat(1, 2), sin=v["sin"][:5].repeat(1, 2), per_token=True),
            ValueError, "broadcast"),
    # dtypes and types
    Invalid("integer q", lambda v: dict(q=v["q"].to(torch.int32)), TypeError, "q must be"),
    Invalid("complex q", lambda v: dict(q=torch.complex(v["q"], v["q"])), TypeError, "q must be"),
    Invalid("bool q", lambda v: dict(q=v["q"] > 0), TypeError, "q must be"),
    Invalid("integer k", lambda v: dict(k=v["k"].to(torch.int64)), TypeError, "k must be"),
    Invalid("q and k dtypes differ", lambda v: dict(k=v["k"].double()), TypeError, "dtype"),
    Invalid("integer cos/sin", lambda v: dict(cos=v["cos"].to(torch.int32), sin=v["sin"].to(torch.int32)),
            TypeError, "cos"),
    Invalid("q is a list", lambda v: dict(q=v["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    Invalid("cos is a list", lambda v: dict(cos=v["cos"].tolist()), TypeError, "cos"),
    Invalid("cos/sin missing", lambda v: dict(cos=None, sin=None), TypeError, "cos"),
    Invalid("both table= and cos/sin", lambda v: dict(table=object()), ValueError, "table"),
    # devices
    Invalid("k on another device", lambda v: dict(k=v["k"].to(_other_device(_dev(v)))), ValueError, "device"),
    Invalid("cos/sin on another device", lambda v: dict(cos=v["cos"].to(_other_device(_dev(v))),
                                                        sin=v["sin"].to(_other_device(_dev(v)))), ValueError, "cos"),
    Invalid("positions on another device",
            lambda v: dict(positions=torch.tensor([1, 2], device=_other_device(_dev(v)))), ValueError, "positions"),
    Invalid("cu_seqlens on another device",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 2, 6], device=_other_device(_dev(v)))),
            ValueError, "cu_seqlens"),
    # positions
    Invalid("int offset beyond the table", lambda v: dict(positions=14), ValueError, "table"),
    Invalid("negative int offset", lambda v: dict(positions=-1), ValueError, "positions"),
    Invalid("positions a bool", lambda v: dict(positions=True), TypeError, "positions"),
    Invalid("positions a float", lambda v: dict(positions=1.5), TypeError, "positions"),
    Invalid("float position tensor", lambda v: dict(positions=torch.zeros(2, device=_dev(v))), TypeError,
            "positions"),
    Invalid("position ids that do not broadcast",
            lambda v: dict(positions=torch.zeros(5, 7, dtype=torch.long, device=_dev(v))), ValueError, "positions"),
    Invalid("3-D position ids", lambda v: dict(positions=torch.zeros(1, 2, 3, dtype=torch.long, device=_dev(v))),
            ValueError, "positions"),
    # layouts, backends, modes
    Invalid("unknown layout", lambda v: dict(layout="bsd"), ValueError, "layout"),
    Invalid("unknown backend", lambda v: dict(backend="rocm"), ValueError, "backend"),
    Invalid("eager_rounding on cuda", lambda v: dict(backend="cuda", eager_rounding=True), ValueError,
            "eager_rounding"),
    Invalid("inplace with requires_grad",
            lambda v: dict(q=v["q"].clone().requires_grad_(), inplace=True), ValueError, "inplace"),
    Invalid("inplace on an expanded (self-overlapping) q",
            lambda v: dict(q=v["q"][:, :, :1].expand(2, 3, 4, 32), inplace=True), RuntimeError, "memory location"),
    Invalid("inplace with k a view of q's heads",
            lambda v: dict(k=v["q"][:, :, 1:3], inplace=True), RuntimeError, "memory location"),
    # varlen
    Invalid("thd without cu_seqlens", lambda v: _thd(v) | dict(cu_seqlens=None), ValueError, "cu_seqlens"),
    Invalid("cu_seqlens with bshd", lambda v: dict(cu_seqlens=torch.tensor([0, 3, 6], device=_dev(v))),
            ValueError, "cu_seqlens"),
    Invalid("float cu_seqlens", lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0., 2., 6.], device=_dev(v))),
            TypeError, "cu_seqlens"),
    Invalid("2-D cu_seqlens",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([[0, 2, 6]], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens"),
    Invalid("negative max_seqlen", lambda v: _thd(v) | dict(max_seqlen=-1), TypeError, "max_seqlen"),
    Invalid("float max_seqlen", lambda v: _thd(v) | dict(max_seqlen=4.0), TypeError, "max_seqlen"),
    Invalid("thd with 4-D q", lambda v: _thd(v) | dict(q=v["q"]), ValueError, "q must have 3 dimensions"),
    Invalid("thd q and k token counts differ", lambda v: _thd(v) | dict(k=v["k"].reshape(6, 2, 32)[:5]),
            ValueError, "tokens"),
    Invalid("thd positions of a wrong length",
            lambda v: _thd(v) | dict(positions=torch.zeros(4, dtype=torch.long, device=_dev(v))), ValueError,
            "positions"),
    Invalid("thd int offset beyond the table", lambda v: _thd(v) | dict(positions=13), ValueError, "table"),
    # values inside device tensors: checked in ROPEKIT_CHECK=1 mode (a host sync, so opt-in)
    Invalid("offsets tensor beyond the table", lambda v: dict(positions=torch.tensor([3, 14], device=_dev(v))),
            ValueError, "table", check_mode=True),
    Invalid("position ids beyond the table",
            lambda v: dict(positions=torch.tensor([[0, 1, 16]] * 2, device=_dev(v))), ValueError, "table",
            check_mode=True),
    Invalid("negative position ids", lambda v: dict(positions=torch.tensor([[0, -1, 2]] * 2, device=_dev(v))),
            ValueError, "positions", check_mode=True),
    Invalid("cu_seqlens decreasing",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 4, 2, 6], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("cu_seqlens not starting at 0",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([1, 2, 6], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("cu_seqlens not ending at the token count",
            lambda v: _thd(v) | dict(cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32, device=_dev(v))),
            ValueError, "cu_seqlens", check_mode=True),
    Invalid("max_seqlen shorter than the longest sequence", lambda v: _thd(v) | dict(max_seqlen=3), ValueError,
            "max_seqlen", check_mode=True),
    Invalid("varlen offsets beyond the table",
            lambda v: _thd(v) | dict(positions=torch.tensor([0, 13], device=_dev(v))), ValueError, "table",
            check_mode=True),
]


@contextlib.contextmanager
def _env(name: str, value: Optional[str]):
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def run_invalid_input(case: Invalid, *, inplace: bool, device=None) -> list[str]:
    """Make the invalid call (in place or not); it must raise ``case.error`` naming ``case.words`` and leave q and k
    bitwise unchanged. Returns what went wrong."""
    device = device or _device.DEVICE
    args = _valid_call(device)
    args["inplace"] = inplace
    args.update(case.change(args))
    tensors = {name: args[name] for name in ("q", "k") if isinstance(args.get(name), torch.Tensor)}
    before = {name: (torch.view_as_real(t) if t.is_complex() else t).detach().clone() for name, t in tensors.items()
              if t.device.type != "meta"}
    problems = []
    with _env("ROPEKIT_CHECK", "1" if case.check_mode else None):
        try:
            apply_rope(**args)
            problems.append(f"no error raised (expected {case.error.__name__} naming {case.words!r})")
        except case.error as error:
            if case.words.lower() not in str(error).lower():
                problems.append(f"{case.error.__name__} raised, but its message does not name {case.words!r}: "
                                f"{error}")
        except Exception as error:  # noqa: BLE001
            problems.append(f"raised {type(error).__name__} instead of {case.error.__name__}: {error}")
    for name, saved in before.items():
        now = tensors[name]
        now = torch.view_as_real(now) if now.is_complex() else now
        if not torch.equal(now.detach(), saved):
            problems.append(f"{name} was modified by the failed call")
    return problems


def nan_propagation(backend: str = "triton", *, dtype: torch.dtype = torch.float32, interleaved: bool = False,
                    rotary_dim: int = 48, head_dim: int = 64, device=None) -> list[str]:
    """One NaN in q and one Inf in k (inside the rotary part), one NaN in q's tail: each reaches exactly the outputs
    of its own rotation pair (or only itself in the tail); every other element equals the clean run bit for bit."""
    device = device or _device.DEVICE
    gen = torch.Generator().manual_seed(1)
    b, s, hq, hk = 2, 5, 3, 2
    q = torch.randn(b, s, hq, head_dim, generator=gen).to(dtype).to(device)
    k = torch.randn(b, s, hk, head_dim, generator=gen).to(dtype).to(device)
    cos, sin = cos_sin_table(16, rotary_dim, device=device)
    kw = dict(positions=torch.tensor([0, 3], device=device), interleaved=interleaved, rotary_dim=rotary_dim,
              backend=backend)
    clean_q, clean_k = _call(lambda: apply_rope(q, k, cos, sin, **kw))
    half = rotary_dim // 2

    def partner(channel):
        if channel >= rotary_dim:
            return channel
        if interleaved:
            return channel ^ 1
        return channel + half if channel < half else channel - half

    spots = {"q": [((1, 0, 2, 5), float("nan")), ((0, 3, 1, rotary_dim + 3), float("nan"))],
             "k": [((0, 0, 1, rotary_dim - 1), float("inf")), ((1, 4, 0, 0), float("-inf"))]}
    dirty = {"q": q.clone(), "k": k.clone()}
    for name, entries in spots.items():
        for index, value in entries:
            dirty[name][index] = value
    out_q, out_k = _call(lambda: apply_rope(dirty["q"], dirty["k"], cos, sin, **kw))
    problems = []
    for name, out, clean in (("q", out_q, clean_q), ("k", out_k, clean_k)):
        expected_bad = torch.zeros(out.shape, dtype=torch.bool)
        for (bi, si, hi, c), _ in spots[name]:
            expected_bad[bi, si, hi, c] = expected_bad[bi, si, hi, partner(c)] = True
        expected_bad = expected_bad.to(device)
        bad = ~torch.isfinite(out)
        if not torch.equal(bad, expected_bad):
            problems.append(f"{name}: non-finite outputs at {torch.nonzero(bad).tolist()}, expected exactly "
                            f"{torch.nonzero(expected_bad).tolist()}")
        if not torch.equal(out[~expected_bad], clean[~expected_bad]):
            problems.append(f"{name}: finite outputs changed by a NaN/Inf elsewhere")
    return problems


def run_safety(backends=("triton",), device=None) -> dict:
    """Section 6: every invalid input (in place and out of place) and NaN/Inf containment per backend."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    invalid, nan = _Tally(), _Tally()
    table = []
    for case in INVALID_INPUTS:
        outcome = {}
        for inplace in (False, True):
            mode = "in-place" if inplace else "out-of-place"
            problems = run_invalid_input(case, inplace=inplace, device=device)
            invalid.record(f"{case.name} ({mode})", "api", lambda: problems)
            outcome[mode] = "ok" if not problems else "; ".join(problems)
        table.append({"input": case.name, "error": case.error.__name__, "names": case.words,
                      "check_mode": case.check_mode, **outcome})
    nan_rows = []
    for backend in backends:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for interleaved in (False, True):
                label = f"{DTYPE_NAMES[dtype]} {'gptj' if interleaved else 'neox'}"
                problems = nan.record(label, backend, lambda: nan_propagation(backend, dtype=dtype,
                                                                              interleaved=interleaved, device=device))
                nan_rows.append({"backend": backend, "case": label, "ok": None if problems is None else not problems})
    return {"invalid_inputs": {"cases": len(INVALID_INPUTS), "calls": 2 * len(INVALID_INPUTS), **invalid.as_dict(),
                               "table": table},
            "nan_inf": {**nan.as_dict(), "rows": nan_rows},
            "checked": invalid.checked + nan.checked, "failed": invalid.failed + nan.failed,
            "seconds": round(time.perf_counter() - start, 1)}


# ====================================================================================================================
# 7. Long context
# ====================================================================================================================

LONG_POSITIONS = (0, 1, 1000, 32_000, 131_072, 500_000, 999_999, 1_000_000)


def run_long_context(backends=("triton",), *, rotary_dim: int = 128, heads: int = 4, bases=(500000.0, 1e6),
                     positions=LONG_POSITIONS, device=None) -> dict:
    """Section 7: rotate tokens at positions up to 1e6 through the float64-angle table (ours) and through a table
    whose angles are formed in float32 (``position.float() * inv_freq.float()``, then cos/sin: the common approach,
    handed to the same kernel as per-token rows); both against the float64 reference. Errors are max |out - ref|
    over inputs with |x| ~ 1, per position."""
    device = device or _device.DEVICE
    start = time.perf_counter()
    rows, tally = [], _Tally()
    gen = torch.Generator().manual_seed(2)
    pos = torch.tensor(positions, dtype=torch.int64)
    x = torch.randn(1, len(positions), heads, rotary_dim, generator=gen).to(device)
    for base in bases:
        inv_freq = inverse_frequencies(rotary_dim, base)
        cos, sin = cos_sin_table(int(pos.max()) + 1, rotary_dim, base=base, device=device)
        # the common approach: float32 angles, float32 cos/sin (what a float32 arange * inv_freq table holds)
        angle32 = pos.to(device, torch.float32)[:, None] * inv_freq.to(device, torch.float32)[None, :]
        cos32, sin32 = _full_width(torch.cos(angle32), False)[None], _full_width(torch.sin(angle32), False)[None]
        expected = ref.rope(x, pos[None], base=base)
        theta64 = ref.angles(pos, inv_freq)
        table_error = {
            "float64 angles (ropekit table)": (cos[pos.to(device)].double().cpu() - torch.cos(theta64)).abs().amax(-1),
            "float32 angles": (cos32[0, :, :rotary_dim // 2].double().cpu() - torch.cos(theta64)).abs().amax(-1),
        }
        for backend in backends:
            outs = {}

            def run(backend=backend):
                outs["ropekit"], _ = _call(lambda: apply_rope(x, None, cos, sin, positions=pos[None].to(device),
                                                              backend=backend))
                outs["fp32"], _ = _call(lambda: apply_rope(x, None, cos32, sin32, per_token=True, backend=backend))
                message = check_close_to_reference(outs["ropekit"], expected)
                return [f"base {base:g}: {message}"] if message else []
            tally.record(f"base {base:g}", backend, run)
            if not outs:
                continue
            err_ours = (outs["ropekit"].double().cpu() - expected).abs().amax(dim=(0, 2, 3))
            err_fp32 = (outs["fp32"].double().cpu() - expected).abs().amax(dim=(0, 2, 3))
            for i, p in enumerate(positions):
                rows.append({"base": base, "backend": backend, "position": int(p),
                             "table_cos_error_float64_angles": float(table_error["float64 angles (ropekit table)"][i]),
                             "table_cos_error_float32_angles": float(table_error["float32 angles"][i]),
                             "output_error_ropekit": float(err_ours[i]), "output_error_float32_angles":
                                 float(err_fp32[i])})
    fp32_eps = torch.finfo(torch.float32).eps
    return {"positions": list(positions), "bases": list(bases), "rotary_dim": rotary_dim, "rows": rows,
            "fp32_eps": fp32_eps, **tally.as_dict(), "seconds": round(time.perf_counter() - start, 1)}


# ====================================================================================================================
# The run, its JSON, and the rendered markdown
# ====================================================================================================================

def _environment(argv) -> dict:
    import triton

    backends, why = available_backends()
    return {"ropekit": __import__("ropekit").__version__, "device": _device.describe(),
            "gpu": torch.cuda.get_device_name() if _device.DEVICE == "cuda" else None,
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "cuda_runtime": torch.version.cuda, "backends": backends, "cuda_backend": why,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m ropekit stress " + " ".join(argv)}


SECTIONS = ("property", "te_matrix", "large", "determinism", "safety", "long_context", "fuzz")


def run_fuzz(cases: int, seed: int, *, workers: int = 1, budget_s: float | None = None) -> dict:
    """Section 8: the fuzzer of hostile-but-plausible calls (``ropekit.reliability.fuzz``; docs/fuzzing.md), as a
    section: ``checked`` cases, ``failed`` oracle violations."""
    from .reliability import fuzz

    counts = fuzz.run(cases, seed, isolate=_device.DEVICE == "cuda", workers=workers, time_budget_s=budget_s)
    return {"fuzz_cases": counts["cases"], "checked": counts["cases"], "failed": counts["violations"],
            "matched": counts["matched"], "documented_errors": counts["documented_errors"],
            "by_target": counts.get("by_target", {}),
            "failures": [{"backend": f.get("target", "apply_rope"), "case": f"seed {seed} case {f.get('case')}",
                          "messages": list(f.get("problems", []))} for f in counts.get("findings", [])[:20]],
            "seconds": counts.get("seconds")}


def run_all(args) -> dict:
    backends, _ = available_backends()
    on_gpu = _device.DEVICE == "cuda"
    quick = args.quick
    workers = args.workers or (min(8, max(1, (os.cpu_count() or 2) // 2)) if on_gpu else 1)
    if "cuda" in backends:
        _warm_cuda_backend()  # build the extension once, before workers would each wait for it
    plans = {
        "property": lambda: run_property(args.configs or ((200 if quick else 2000) if on_gpu else 40),
                                         seed=args.seed, backends=backends, n_families=args.families,
                                         variant_quota=args.variant_quota, workers=workers,
                                         budget_s=args.budget_s),
        "te_matrix": lambda: run_te_matrix(full=on_gpu and not quick, backends=backends,
                                           seq_scale=1 if on_gpu else 32, heads=8 if on_gpu else 2,
                                           workers=workers, budget_s=args.budget_s),
        "large": lambda: (run_large(backends) if on_gpu and not quick else
                          {"skipped": "needs a GPU with ~14 GB of free memory; not part of --quick runs"}),
        "determinism": lambda: run_determinism(backends, **({} if on_gpu else dict(repeats=3, batch=8, seqlen=6,
                                                                                    heads=(2, 1), head_dim=32)),
                                               **({"repeats": 10} if quick and on_gpu else {})),
        "safety": lambda: run_safety(backends),
        "long_context": lambda: run_long_context(backends, **({} if on_gpu else dict(rotary_dim=16, heads=2))),
        "fuzz": lambda: run_fuzz((300 if quick else 3000) if on_gpu else 100, args.seed,
                                 workers=max(workers, 8) if on_gpu else 1, budget_s=args.budget_s),
    }
    chosen = args.sections.split(",") if args.sections else list(SECTIONS)
    result = {"environment": _environment(args.argv), "quick": quick, "seed": args.seed, "sections": {}}
    start = time.perf_counter()
    progress = Progress(len(chosen), "stress", stream=sys.stdout)  # a bar on a terminal; a line per section always
    for name in chosen:
        t0 = time.perf_counter()
        progress.step(f"{name} ...", n=0)
        try:
            section = plans[name]()
        except Exception as error:  # noqa: BLE001 - a crashed section is reported, the others still run
            section = {"checked": 0, "failed": 1, "crashed": f"{type(error).__name__}: {error}",
                       "traceback": traceback.format_exc()[-2000:]}
        section.setdefault("seconds", round(time.perf_counter() - t0, 1))
        result["sections"][name] = section
        progress.step(name)
        progress.stage(f"[stress] {name}: {_section_line(section)}")
    progress.close()
    result["total_failures"] = sum(s.get("failed", 0) for s in result["sections"].values())
    result["total_not_run"] = sum(s.get("not_run", 0) for s in result["sections"].values())
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def _warm_cuda_backend() -> None:
    q = torch.randn(1, 2, 1, 8, device=_device.DEVICE)
    cos, sin = cos_sin_table(4, 8, device=_device.DEVICE)
    try:
        apply_rope(q, None, cos, sin, backend="cuda")
    except Exception as error:  # noqa: BLE001 - the sections report per configuration
        print(f"[stress] cuda backend warm-up failed: {type(error).__name__}: {error}", flush=True)


def _section_line(section: dict) -> str:
    """One line per section: what ran, and how it ended."""
    if "skipped" in section:
        return f"skipped ({section['skipped']})"
    if "crashed" in section:
        return f"CRASHED: {section['crashed']}"
    if "configs" in section:
        what = f"{section['configs']} configurations x {len(section['backends'])} backend(s)"
    elif "te_cases" in section:
        what = f"{section['rows']} rows = {section['te_cases']} TE cases, x {len(section['backends'])} backend(s)"
    elif "invalid_inputs" in section:
        what = (f"{section['invalid_inputs']['calls']} invalid calls + {section['nan_inf']['checked']} NaN/Inf "
                "containment runs")
    elif "numel" in section:
        what = f"q of {section['numel']:,} elements"
    elif "repeats" in section:
        what = f"{section['checked']} bitwise comparisons"
    elif "fuzz_cases" in section:
        what = (f"{section['fuzz_cases']} hostile-but-plausible cases ({section['matched']} matched the reference, "
                f"{section['documented_errors']} documented errors)")
    else:
        what = f"{section.get('checked', 0)} runs"
    text = f"{what}: {section.get('checked', 0) - section.get('failed', 0)} of {section.get('checked', 0)} passed"
    text += f", **{section['failed']} failed**" if section.get("failed") else ", 0 failed"
    unsupported = sum(section.get("unsupported", {}).values())
    if unsupported:
        text += f", {unsupported} unsupported"
    if section.get("not_run"):
        text += f", **{section['not_run']} not run (time budget)**"
    return text + f" ({section.get('seconds', 0)} s)"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if value is True:
        return "yes"
    if value is False:
        return "**no**"
    if value is None:
        return "—"
    return str(value)


def _table(header: list, rows: list) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines + [""]


def render_markdown(result: dict, sanitizer: Optional[dict] = None) -> str:
    """docs/reliability.md from the stress JSON (and the sanitizer JSON of tools/sanitize.sh). Every number comes
    from those files."""
    env, sections = result["environment"], result["sections"]
    out = ["# Reliability", "",
           "<!-- generated by `python -m ropekit.stress --render` from the stress JSON; do not edit by hand -->", "",
           f"Produced by `{env['command']}` on **{env['gpu'] or env['device']}** ({env['date']}): ropekit "
           f"{env['ropekit']}, torch {env['torch']}, triton {env['triton']}, Python {env['python']}, CUDA runtime "
           f"{env['cuda_runtime']}. Backends tested: {', '.join(env['backends'])}"
           + ("" if "cuda" in env["backends"] else f" (cuda: {env['cuda_backend']})") + ".", "",
           "Every output is compared with the float64 reference (`ropekit.reference`) under the bound of "
           "`ropekit.testing`: fp32/fp64 within 1e-5 of max|ref| elementwise and in relative norm; fp16/bf16 within "
           "one ulp of the output dtype at |ref| (plus 1e-6·max|ref|).", ""]
    if result.get("quick"):
        out += ["> This is a `--quick` smoke run, not the full matrix.", ""]
    if env["gpu"] is None:
        out += ["> Produced on the CPU through the Triton interpreter (small sizes). The GPU run replaces it.", ""]
    summary = []
    for name in SECTIONS:
        if name in sections:
            s = sections[name]
            summary.append([name, _section_line(s)])
    if sanitizer:
        for tool, info in sanitizer.get("tools", {}).items():
            summary.append([f"compute-sanitizer {tool}", info.get("summary", "")])
    out += ["## Summary", ""] + _table(["section", "result"], summary)
    out.append(f"Total failures: **{result['total_failures']}**; wall time {result['seconds']} s.")
    out.append("")

    prop = sections.get("property")
    if prop and "configs" in prop:
        gen = prop["generator"]
        out += ["## 1. Property-based configurations", "",
                f"{prop['configs']} seeded random configurations (seed {gen['seed']}"
                + (f"; {prop['not_run']} of the {prop['planned']} planned were not started within the time budget"
                   if prop.get("not_run") else "") + f"), each run on "
                f"{', '.join(prop['backends'])}; {prop['with_backward']} of them also backward through autograd. "
                f"Compile-time values come from {gen['families']} random *families*"
                + (f", each allowed at most {gen['variant_quota']} Triton kernel variants (compiles): "
                   f"{gen['kernel_variants']} distinct variants in all. Configurations: "
                   + ", ".join(f"{n} {kind}" for kind, n in gen["draws"].items())
                   + " (a fresh draw that needed a variant beyond its family's quota was replaced by an earlier "
                   "configuration of the family with jittered sizes, or with new values only)"
                   if gen.get("kernel_variants") is not None else "")
                + f". Result: {prop['passed']} of {prop['checked']} backend runs passed, {prop['failed']} failed"
                + (f", unsupported: {prop['unsupported']}" if prop["unsupported"] else "") + ".", "",
                "What each configuration checks: forward vs the reference; out of place, inputs untouched and a "
                "contiguous output of the input's shape with the partial-rotary tail copied bit for bit; in place, "
                "the result in q/k, nothing written outside the views, the tail untouched; backward, the gradient "
                "of TE's two loss shapes vs the reference's vector-Jacobian product.", "",
                "Coverage (configurations per value):", ""]
        out += _table(["dimension", "values"], [[dim, ", ".join(f"{k}: {v}" for k, v in values.items())]
                                                 for dim, values in prop["coverage"].items()])
        out += _failures(prop)

    te = sections.get("te_matrix")
    if te and "rows" in te:
        dims = te.get("dimensions", {})
        out += ["## 2. Transformer Engine's rope test matrix", "",
                "The parameters of TE's `test_fused_rope` and `test_fused_rope_thd` "
                f"({'the full matrix' if te['full_matrix'] else 'a slice that covers every value'}), against the "
                "float64 reference instead of TE's fp32 unfused path. TE's `emb` (our cos/sin table) has "
                "`seq_length` rows and the input is shorter by the margin; start positions are per sequence in "
                "[0, margin) (TE skips them with margin 0); non-contiguous inputs are TE's "
                "`t.transpose(*p).contiguous().transpose(*p)`; thd uses TE's packed lengths (scaled with the "
                "sequence). Both of TE's loss shapes: `out.sum() * 2` (the gradient arrives as a broadcast scalar) "
                "and `(out * g).sum()` (a full gradient; random g here, TE uses ones). Unlike TE, gradients are "
                "also checked with start positions. A non-contiguous output counts as a failure (`apply_rope` "
                "returns contiguous outputs in the caller's layout, whatever the input strides).", ""]
        out += _table(["dimension", "values run"], [[k, ", ".join(map(str, v))] for k, v in dims.items()])
        out += [f"{te['rows']} rows × 2 loss shapes = {te['te_cases']} TE cases per backend "
                f"({', '.join(te['backends'])}), batch {te['batch']}, {te['heads']} heads (TE: 64)"
                + (f"; {te['not_run']} of {te['planned_rows']} rows not started within the time budget"
                   if te.get("not_run") else "")
                + f". {te['passed']} of {te['checked']} row runs passed (each: forward and both loss shapes' "
                f"gradients), {te['failed']} failed"
                + (f", unsupported: {te['unsupported']}" if te["unsupported"] else "") + ".", ""]
        out += _failures(te)

    if sanitizer:
        out += ["## 3. compute-sanitizer", "", f"`{sanitizer.get('command', 'bash tools/sanitize.sh')}` on "
                f"{sanitizer.get('gpu', '?')}: every kernel (Triton v1–v4, CUDA) once on mask-and-tail shapes "
                "(`python -m ropekit.stress --sanitize-driver`), with `PYTORCH_NO_CUDA_MEMORY_CACHING=1` so that each "
                "tensor is its own allocation.", ""]
        out += _table(["tool", "summary line", "errors"], [[tool, info.get("summary", ""), info.get("errors")]
                                                           for tool, info in sanitizer.get("tools", {}).items()])
        if sanitizer.get("driver"):
            out += ["Kernels run under the sanitizer:", "", "```", *sanitizer["driver"], "```", ""]

    large = sections.get("large")
    if large:
        out += ["## 4. Large tensors", ""]
        if "skipped" in large:
            out += [f"Skipped: {large['skipped']}.", ""]
        elif "shape" in large:
            out += [f"q of shape {tuple(large['shape'])} ({large['numel']:,} {large['dtype']} elements; past 2**31: "
                    f"{_fmt(large['past_2_31'])}), rotated out of place; tokens around the first, middle and last "
                    "token and around element 2**31 checked against the reference; no NaN anywhere in the output. "
                    f"Backends bitwise equal on the whole tensor: {_fmt(large['backends_bitwise_equal'])}.", ""]
            out += _table(["backend", "spot", "batch", "tokens", "matches reference"],
                          [[r["backend"], r["spot"], r["batch"], f"{r['tokens'][0]}..{r['tokens'][1] - 1}", r["ok"]]
                           for r in large["spots"]])
            out += _failures(large)

    det = sections.get("determinism")
    if det and "rows" in det:
        out += ["## 5. Determinism and batch invariance", "",
                f"q {tuple(det['shape_q'])} with {det['heads_k']} k heads, {det['dtype']}. RoPE has no reduction: "
                "every output element is one pair's rotation, computed by the same instructions whatever the tile, "
                "batch, layout or position mode, so it should be bitwise reproducible and invariant.", ""]
        out += _table(["check", "backend", "bitwise equal", "max |diff|", "note"],
                      [[r["check"], r["backend"], r["bitwise_equal"], r["max_abs_diff"], r["note"]]
                       for r in det["rows"]])
        out += _failures(det)

    safety = sections.get("safety")
    if safety and "invalid_inputs" in safety:
        inv, nan = safety["invalid_inputs"], safety["nan_inf"]
        out += ["## 6. Safe failure", "",
                f"{inv['cases']} invalid inputs, each called out of place and in place ({inv['calls']} calls): "
                f"{inv['passed']} raised the documented error naming the argument, before any write (q and k "
                f"compared bit for bit afterwards); {inv['failed']} did not. Values inside device tensors are "
                "checked only with `ROPEKIT_CHECK=1` (a host sync; CUDA graphs forbid it).", ""]
        out += _table(["invalid input", "error", "message names", "ROPEKIT_CHECK", "out of place", "in place"],
                      [[r["input"], r["error"], f"`{r['names']}`", "yes" if r["check_mode"] else "", r["out-of-place"],
                        r["in-place"]] for r in inv["table"]])
        out += ["NaN/Inf containment: a NaN and an Inf (and a NaN in the partial-rotary tail) reach exactly the "
                "two outputs of their rotation pair (the tail NaN only itself); every other element is bitwise "
                "equal to the clean run.", ""]
        out += _table(["backend", "case", "contained"], [[r["backend"], r["case"], r["ok"]] for r in nan["rows"]])
        out += _failures(inv) + _failures(nan)

    lc = sections.get("long_context")
    if lc and "rows" in lc:
        out += ["## 7. Numerics at long context", "",
                f"Tokens at positions {lc['positions']}, rotary_dim {lc['rotary_dim']}, bases {lc['bases']}, "
                "inputs ~N(0, 1) in fp32. ropekit's table forms each angle in float64 and rounds only cos/sin to "
                "float32; the common approach forms the angle in float32 (`positions.float() * inv_freq.float()`) "
                "and takes cos/sin of that. Both tables go through the same kernel; errors are max |out − ref| "
                "against the float64 reference (fp32 eps = "
                f"{lc['fp32_eps']:.3g}).", ""]
        out += _table(["base", "backend", "position", "table |cos err| (float64 angles)",
                       "table |cos err| (float32 angles)", "output err (ropekit)", "output err (float32 angles)"],
                      [[r["base"], r["backend"], r["position"], r["table_cos_error_float64_angles"],
                        r["table_cos_error_float32_angles"], r["output_error_ropekit"],
                        r["output_error_float32_angles"]] for r in lc["rows"]])
        out += _failures(lc)
    fz = sections.get("fuzz")
    if fz and "fuzz_cases" in fz:
        out += ["## 8. Hostile-but-plausible inputs (the fuzzer)", "",
                "Every tensor argument's dtype, view (strided, expanded, a slice of a larger buffer, self-overlapping) "
                "and index values drawn independently, aliasing between q and k, check mode, autograd and meta "
                "tensors; each call must match the float64 reference or raise a documented error, and nothing "
                "outside its outputs may change (guard regions compared bit for bit). Method: docs/fuzzing.md.", ""]
        out += _table(["cases", "matched the reference", "documented errors", "violations", "seconds"],
                      [[fz["fuzz_cases"], fz["matched"], fz["documented_errors"], fz["failed"], fz["seconds"]]])
        out += _failures(fz)
    out += ["## Reproduce", "", "```",
            "python -m ropekit stress --out docs/reliability.json    # sections 1, 2, 4-8",
            "bash tools/sanitize.sh /tmp/sanitize && cp /tmp/sanitize/sanitize.json docs/    # section 3",
            "python -m ropekit.stress --render docs/reliability.json docs/reliability.md \\",
            "    --sanitizer docs/sanitize.json",
            "```", "",
            "A failing configuration is printed with its full description and seed; `ropekit.stress.run_config` "
            "reruns it. On the CPU the same checks run at small sizes in `tests/test_reliability.py`.", ""]
    return "\n".join(out).rstrip() + "\n"


def _failures(section: dict) -> list:
    failures = section.get("failures") or []
    if not failures:
        return []
    lines = [f"Failures (first {len(failures)}):", ""]
    for f in failures:
        lines.append(f"- `{f['backend']}` {f['case']}: " + "; ".join(f["messages"]))
    return lines + [""]


def render(json_path: str, md_path: str, sanitizer_path: Optional[str] = None) -> None:
    with open(json_path) as handle:
        result = json.load(handle)
    sanitizer = None
    if sanitizer_path and os.path.exists(sanitizer_path):
        with open(sanitizer_path) as handle:
            sanitizer = json.load(handle)
    with open(md_path, "w") as handle:
        handle.write(render_markdown(result, sanitizer))


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m ropekit stress", description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m ropekit stress --quick --out /tmp/reliability.json")
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--quick", action="store_true", help="a smoke run (fewer configurations, no large tensor)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", type=int, default=0, help="property configurations (default: 2000 on a GPU)")
    parser.add_argument("--families", type=int, default=48, help="property families (compile-time value sets)")
    parser.add_argument("--variant-quota", type=int, default=4, help="Triton kernel variants allowed per family")
    parser.add_argument("--sections", help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="seconds each of the property and TE sections may take before it stops starting jobs")
    parser.add_argument("--workers", type=int, default=0,
                        help="processes for the property and TE sections (default: CPU cores / 2 on a GPU, max 8)")
    parser.add_argument("--sanitize-driver", action="store_true", help="run every kernel once (for compute-sanitizer)")
    parser.add_argument("--worker", nargs=2, metavar=("JOBS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--render", nargs=2, metavar=("JSON", "MD"), help="render the markdown from a stress JSON")
    parser.add_argument("--sanitizer", help="with --render: the sanitizer JSON of tools/sanitize.sh")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.render:
        render(*args.render, sanitizer_path=args.sanitizer)
        print(f"wrote {args.render[1]}")
        return 0
    if args.sanitize_driver:
        return sanitize_driver()
    if args.worker:
        return _worker(*args.worker)
    result = run_all(args)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1, default=str)
    verdict = "FAIL" if result["total_failures"] else ("INCOMPLETE" if result["total_not_run"] else "PASS")
    print(f"[stress] {verdict}: {result['total_failures']} failures, {result['total_not_run']} jobs not run (time "
          f"budget), {result['seconds']} s" + (f"; JSON: {args.out}" if args.out else ""))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    # Run the imported module's main, so that pickled jobs and this code share one set of classes.
    from ropekit import stress as _stress

    sys.exit(_stress.main())
