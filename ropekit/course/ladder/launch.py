"""The one launcher of the ladder's kernels: validate, plan, launch.

Every step's kernel takes a subset of the same named arguments (a step adds arguments, never renames one), so one
launcher serves them all: it builds every argument the ladder knows and passes those the step's kernel declares. A
call that needs a feature the step does not have yet (GPT-J pairs on step 1, say) raises and names the step that adds
it, instead of silently computing something else.

The grid follows the kernel's shape, read from its arguments too: a tile of ``BLOCK_S`` tokens x ``BLOCK_H`` heads
(steps 1-6), a tile of tokens x every head of q and of k (``BLOCK_HK``: step 7), or blocks of ``BLOCK`` consecutive
elements (step 8, the flat path, which runs contiguous NeoX calls over the whole head only).
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...positions import resolve_positions
from ...triton import v3

__all__ = ["LadderConfig", "FlatBlock", "rope_ladder", "needs_int64", "bytes_moved"]

# kernel argument -> (what it enables, the step that adds it)
_ADDED_BY = {"POS_MODE": ("positions", "step 2"), "INTERLEAVED": ("GPT-J pairing", "step 3"),
             "ROTARY_DIM": ("partial rotary", "step 4"), "CONJUGATE": ("the conjugate rotation", "step 5"),
             "INDEX_DTYPE": ("tensors of 2**31 elements or more", "step 6")}
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class LadderConfig(NamedTuple):
    block_s: int  # tokens per program
    block_h: int  # heads per program (step 7 takes every head: its tiles are sized from the head counts)
    num_warps: int


class FlatBlock(NamedTuple):
    """The flat path's launch (step 8): ``block`` consecutive elements a program."""

    block: int
    num_warps: int


def _span(t: torch.Tensor) -> int:
    """Elements from a view's first to its last element, inclusive."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Does any view span 2**31 elements or more (int32 offsets would wrap)?"""
    return any(_span(t) >= 2**31 for t in tensors)


def bytes_moved(q: torch.Tensor, k: torch.Tensor) -> int:
    """q and k read once and written once: the bytes the copy ceiling is compared with."""
    return 2 * (q.numel() + k.numel()) * q.element_size()


def _check(q, k, cos, sin, out_q, out_k, rotary_dim):
    """Every error names its argument, and comes before anything is written."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a (batch, seq, heads, head_dim) tensor")
        if t.dtype not in _FLOAT_DTYPES or t.stride(-1) != 1:
            raise ValueError(f"{name} must be float16/bfloat16/float32 with contiguous channels, got {t.dtype}, "
                             f"strides {t.stride()}")
    if k.dtype != q.dtype or k.device != q.device:
        raise ValueError(f"k ({k.dtype}, {k.device}) must match q ({q.dtype}, {q.device})")
    if k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k's shape {tuple(k.shape)} must match q's {tuple(q.shape)} except in the heads")
    if rotary_dim % 2 or not 0 < rotary_dim <= q.shape[3]:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be even and in (0, head_dim = {q.shape[3]}]")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or t.ndim != 2 or t.shape[1] != rotary_dim // 2 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 (table_len, rotary_dim/2 = {rotary_dim // 2}) "
                             f"table, got {t.dtype} {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    for name, out, x in (("out_q", out_q, q), ("out_k", out_k, k)):
        if out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1 or out.device != x.device:
            raise ValueError(f"{name} must have {name[-1]}'s shape, dtype and device, with contiguous channels")


def rope_ladder(kernel, q, k, cos, sin, *, positions=None, rotary_dim=None, interleaved=False, conjugate=False,
                inplace=False, out_q=None, out_k=None, config: LadderConfig | FlatBlock | None = None,
                force_int64: bool = False):
    """Rotate q and k with a ladder step's ``kernel`` in one launch; return ``(out_q, out_k)``.

    ``positions``: None (0..seq-1), an int offset, per-sequence offsets ``(batch,)`` or position ids ``(batch, seq)``
    (``ropekit.positions.resolve_positions``). ``inplace``: rotate q and k in their own memory. ``config``: the tile,
    by default v3's ``launch_config`` for the shape (step 7: 2 tokens, 8 warps; step 8: a :class:`FlatBlock`, by
    default one 16-byte vector a thread at 8 warps). ``force_int64``: int64 offsets even for a small tensor (so the
    int64 code path can be checked where a tensor of 2**31 elements does not fit, e.g. under the interpreter).
    """
    head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.ndim == 4 else 0
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if inplace:
        out_q, out_k = q, k
    else:
        out_q = torch.empty_like(q) if out_q is None else out_q
        out_k = torch.empty_like(k) if out_k is None else out_k
    _check(q, k, cos, sin, out_q, out_k, rotary_dim)
    batch, seqlen, heads_q, _ = q.shape
    heads_k = k.shape[2]
    spec = resolve_positions(batch=batch, seqlen=seqlen, positions=positions, device=q.device)
    declared = set(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    flat, fused_qk = "BLOCK" in declared, "BLOCK_HK" in declared
    wanted = {"POS_MODE": positions is not None, "INTERLEAVED": interleaved, "ROTARY_DIM": rotary_dim != head_dim,
              "CONJUGATE": conjugate, "INDEX_DTYPE": force_int64 or needs_int64(q, k, out_q, out_k)}
    for argument, asked in wanted.items():
        if asked and argument not in declared:
            feature, step = _ADDED_BY[argument]
            if flat:
                raise ValueError(f"{feature}: the flat path (step 8) rotates contiguous NeoX pairs over the whole "
                                 "head at positions 0..seq-1 only; use a tile step")
            raise ValueError(f"{feature}: this kernel does not have it yet ({step} adds it)")
    if flat:
        if inplace:
            raise ValueError("inplace: the flat path (step 8) runs out of place only (a program could overwrite a "
                             "partner another program still reads)")
        for name, t in (("q", q), ("k", k), ("out_q", out_q), ("out_k", out_k)):
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous for the flat path (step 8): an element's partner must "
                                 "lie HEAD_DIM/2 elements away")
    if "POS_MODE" not in declared and cos.shape[0] < seqlen:
        raise ValueError(f"cos has {cos.shape[0]} rows; without positions the kernel reads rows 0..{seqlen - 1}")
    if q.numel() == 0 or k.numel() == 0:
        return out_q, out_k
    if flat:
        # default: one 16-byte vector a thread at 8 warps
        config = config or FlatBlock(32 * 8 * max(1, 16 // q.element_size()), 8)
        if not isinstance(config, FlatBlock):
            raise ValueError(f"config must be a FlatBlock for the flat path (step 8), got {config!r}")
    elif config is None:
        if fused_qk:  # 2 tokens x every head
            config = LadderConfig(2, triton.next_power_of_2(heads_q), 8)
        else:
            config = LadderConfig(*v3.launch_config(batch, seqlen, max(heads_q, heads_k), head_dim,
                                                    q.element_size()))
    pos = spec.tensor
    arguments = dict(
        Q=q, K=k, OUT_Q=out_q, OUT_K=out_k, COS=cos, SIN=sin, POSITIONS=pos, seqlen=seqlen, n_heads_q=heads_q,
        n_heads_k=heads_k, table_len=cos.shape[0], position_offset=spec.offset,
        stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2),
        stride_kb=k.stride(0), stride_ks=k.stride(1), stride_kh=k.stride(2),
        stride_oqb=out_q.stride(0), stride_oqs=out_q.stride(1), stride_oqh=out_q.stride(2),
        stride_okb=out_k.stride(0), stride_oks=out_k.stride(1), stride_okh=out_k.stride(2),
        batch=batch, stride_pos_b=pos.stride(0) if pos is not None else 0,
        stride_pos_s=pos.stride(1) if pos is not None and pos.ndim == 2 else 0,
        HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim, BLOCK_HALF=triton.next_power_of_2(rotary_dim // 2),
        BLOCK_TAIL=triton.next_power_of_2(max(head_dim - rotary_dim, 1)), BLOCK=getattr(config, "block", None),
        BLOCK_S=getattr(config, "block_s", None), BLOCK_HK=triton.next_power_of_2(heads_k),
        BLOCK_H=triton.next_power_of_2(heads_q) if fused_qk else getattr(config, "block_h", None),
        POS_MODE=spec.mode, INTERLEAVED=interleaved,
        COPY_TAIL=rotary_dim < head_dim and not inplace, CONJUGATE=conjugate,
        INDEX_DTYPE=tl.int64 if wanted["INDEX_DTYPE"] else tl.int32)
    if flat:
        grid = (triton.cdiv(q.numel(), config.block) + triton.cdiv(k.numel(), config.block),)
    elif fused_qk:
        grid = (triton.cdiv(seqlen, config.block_s), 1, batch)
    else:
        grid = (triton.cdiv(seqlen, config.block_s), triton.cdiv(heads_q, config.block_h)
                + triton.cdiv(heads_k, config.block_h), batch)
    kernel[grid](**{name: value for name, value in arguments.items() if name in declared},
                 num_warps=config.num_warps)
    return out_q, out_k
