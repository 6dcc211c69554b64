"""One property configuration as tensors: q and k views of their storage, cos/sin, the apply_rope keywords, and
the float64 reference the outputs are checked against."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ropekit import reference as ref
from ropekit.frequencies import cos_sin_table, inverse_frequencies

from .common import DTYPES, from_bshd, inverse_permutation, layout_shape, to_bshd
from .configs import Config, Family

__all__ = ["Operand", "BuiltCase", "full_width", "table_rows", "build_case", "expected_output"]


@dataclass
class Operand:
    """A q or k operand: ``storage`` is the allocation, ``view(storage)`` the tensor handed to apply_rope."""

    storage: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor]

    def tensor(self) -> torch.Tensor:
        return self.view(self.storage)


def _operand(gen: torch.Generator, shape: tuple, dtype: torch.dtype, family: Family, pad: int, device,
             values: bool = True) -> Operand:
    def randn(size):
        if not values:
            return torch.empty(size, dtype=dtype, device=device)
        return torch.randn(size, generator=gen, dtype=torch.float32).to(dtype).to(device)

    if family.view == "contiguous":
        return Operand(randn(shape), lambda s: s)
    if family.view == "transposed":
        perm = family.perm
        return Operand(randn(tuple(shape[p] for p in perm)), lambda s: s.permute(inverse_permutation(perm)))
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

        return Operand(randn(tuple(big)), sliced)
    if family.view == "expanded":
        small = list(shape)
        small[family.view_dim] = 1
        return Operand(randn(tuple(small)), lambda s: s.expand(shape))
    if family.view == "misaligned":  # storage offset of one element: not 16-byte aligned (vector-load fallbacks)
        numel = math.prod(shape)
        return Operand(randn((numel + 1,)), lambda s: s[1:].view(shape))
    raise ValueError(family.view)


def full_width(half: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Half-width cos/sin (..., r/2) -> transformers' full-width rows (..., r) in the order the pairing reads them."""
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


@dataclass
class BuiltCase:
    q: Operand
    k: Optional[Operand]
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


def table_rows(cfg: Config, max_seqlen: Optional[int]) -> int:
    """Rows of the cos/sin table: enough for every position the configuration can draw, plus ``table_extra``.

    A function of the sizes only (the table length is a kernel argument that Triton specialises on), so drawing new
    position values never needs another kernel variant."""
    f = cfg.family
    length = (max_seqlen if max_seqlen is not None else max(cfg.lengths, default=0)) if f.varlen else cfg.seqlen
    start = {"none": 0, "int": cfg.offset}.get(f.positions, cfg.span)
    return start + length + cfg.table_extra


def build_case(cfg: Config, device, values: bool = True) -> BuiltCase:
    """Tensors of ``cfg`` on ``device``; ``values=False`` (a dry run) leaves q/k uninitialised."""
    f = cfg.family
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = DTYPES[f.dtype]
    tokens = cfg.tokens
    if f.view == "packed":  # q, k and v heads side by side in one buffer: q and k are views of the same storage
        axis = 1 if f.varlen else f.layout.index("h")
        heads_q, heads_k = cfg.heads_q, cfg.heads_k
        shape = layout_shape(f.layout, cfg.batch, cfg.seqlen, heads_q + 2 * heads_k, f.head_dim, tokens)
        fused = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device) if values else \
            torch.empty(shape, dtype=dtype, device=device)
        q = Operand(fused, lambda st: st.narrow(axis, 0, heads_q))
        k = Operand(fused, lambda st: st.narrow(axis, heads_q, heads_k)) if heads_k else None
    else:
        q = _operand(gen, layout_shape(f.layout, cfg.batch, cfg.seqlen, cfg.heads_q, f.head_dim, tokens), dtype, f,
                     cfg.pad, device, values)
        k = None
        if cfg.heads_k:
            k = _operand(gen, layout_shape(f.layout, cfg.batch, cfg.seqlen, cfg.heads_k, f.head_dim, tokens), dtype,
                         f, cfg.pad, device, values)
    arg, pos = _positions(cfg, gen, device)
    kwargs = dict(positions=arg, layout=f.layout, interleaved=f.interleaved, inplace=f.inplace,
                  conjugate=f.conjugate, rotary_dim=f.rotary_dim if cfg.explicit_rotary_dim else None)
    if f.varlen:
        cu = torch.tensor((0, *itertools.accumulate(cfg.lengths)), dtype=getattr(torch, f.cu_dtype))
        longest = max(cfg.lengths) if cfg.lengths else 0
        kwargs.update(cu_seqlens=cu.to(device),
                      max_seqlen={"exact": longest, "larger": longest + 3, "none": None}[f.max_seqlen])
    case = BuiltCase(q, k, None, None, kwargs)
    inv_freq = inverse_frequencies(f.rotary_dim, cfg.base)
    if f.per_token:
        shared = not f.varlen and f.cos_shape != "full"
        # shared rows: the positions of the first sequence (all sequences have the same ones)
        row_positions = ref.token_positions(1, cfg.seqlen, position_ids=pos[:1]) if shared and cfg.batch else pos
        if shared and not cfg.batch:
            row_positions = torch.zeros(1, cfg.seqlen, dtype=torch.int64)
        half = ref.angles(row_positions, inv_freq)
        cos_rows = full_width(torch.cos(half), f.interleaved).to(DTYPES[f.cos_dtype])
        sin_rows = full_width(torch.sin(half), f.interleaved).to(DTYPES[f.cos_dtype])
        if f.cos_shape == "flat" and shared:
            cos_rows, sin_rows = cos_rows[0], sin_rows[0]  # (s, r)
        case.cos, case.sin = cos_rows.to(device), sin_rows.to(device)
        token_shape = pos.shape
        case.ref_cos = cos_rows.to(torch.float64).expand(*token_shape, f.rotary_dim)[..., None, :]
        case.ref_sin = sin_rows.to(torch.float64).expand(*token_shape, f.rotary_dim)[..., None, :]
        case.kwargs.update(per_token=True, positions=None)
    else:
        rows = table_rows(cfg, kwargs.get("max_seqlen"))
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


def expected_output(cfg: Config, case: BuiltCase, x: torch.Tensor, *, backward: bool = False) -> torch.Tensor:
    """float64 reference of the forward (or, ``backward``, of the vector-Jacobian product) in x's layout."""
    f = cfg.family
    conjugate = f.conjugate != backward  # the backward rotates by the opposite angle
    x_bshd = to_bshd(x.detach(), f.layout)
    if f.per_token:
        out = ref.rope_from_cos_sin(x_bshd, case.ref_cos, case.ref_sin, interleaved=f.interleaved,
                                    conjugate=conjugate)
    else:
        out = ref.rope(x_bshd, case.ref_positions, base=cfg.base, rotary_dim=f.rotary_dim, interleaved=f.interleaved,
                       conjugate=conjugate)
    return from_bshd(out, f.layout)
