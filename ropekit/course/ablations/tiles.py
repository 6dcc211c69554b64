"""What v3's tiles buy, one cause at a time: cos/sin reuse against program size, and the BLOCK_S sweep.

v3 differs from v2 in two ways at once: a program handles a whole tile of tokens x heads (bigger programs, fewer of
them), and it loads its tokens' cos/sin rows once for every head (reuse). To tell them apart, ``tile_kernel`` is a
**teaching copy** of v3's kernel with one switch, ``RELOAD_COS_SIN``, that loads the cos/sin rows again in every
step of the head loop, as a program of v2 does: same tile, same grid, same q traffic, only the reuse removed.

Both experiments run on Llama-3-8B prefill's q (b4 s4096, 32 heads x 128, bf16; a toy size on a CPU):

* ``tile_reuse``: v2, then the copy at a few tiles with and without reuse;
* ``tile_sweep``: ``BLOCK_S`` = 1 ... 16 at ``BLOCK_H`` = 4, each with what the compiler reports (registers per
  thread, spills) and what the performance model makes of it: programs resident per SM, bytes in flight per SM,
  waves of the grid, and the predicted share of the copy ceiling.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ... import frequencies
from ...triton import v2
from .. import perf_model
from .registry import experiment

__all__ = ["tile_kernel", "launch", "LLAMA3_8B_Q", "REUSE_TILES", "SWEEP_BLOCK_S"]

LLAMA3_8B_Q = (4, 4096, 32, 128)  # batch, seq, heads, head_dim (bf16)
REUSE_TILES = ((1, 1), (1, 4), (4, 4))  # (BLOCK_S, BLOCK_H) timed with and without reuse
SWEEP_BLOCK_S = (1, 2, 4, 8, 16)  # at BLOCK_H = 4


@triton.jit
def tile_kernel(X, COS, SIN, OUT, seqlen, n_heads, stride_xb, stride_xs, stride_xh, stride_ob, stride_os, stride_oh,
                HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, RELOAD_COS_SIN: tl.constexpr):
    """v3's kernel (contiguous channels, HALF a power of two), with cos/sin loaded once or in every head step."""
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    pairs = tl.arange(0, HALF)
    token_mask = tokens < seqlen
    cs_offsets = tokens[:, None] * HALF + pairs[None, :]
    if not RELOAD_COS_SIN:  # v3: once per program, shared by every head step
        cos = tl.load(COS + cs_offsets, mask=token_mask[:, None], other=0.0)[:, None, :]
        sin = tl.load(SIN + cs_offsets, mask=token_mask[:, None], other=0.0)[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        if RELOAD_COS_SIN:  # the ablation: every head step fetches the same rows again (from L2, mostly)
            cos = tl.load(COS + cs_offsets, mask=token_mask[:, None], other=0.0)[:, None, :]
            sin = tl.load(SIN + cs_offsets, mask=token_mask[:, None], other=0.0)[:, None, :]
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = token_mask[:, None, None] & (heads < n_heads)[None, :, None]
        x_a_ptr = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out_a_ptr = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x_a_ptr, mask=mask, other=0.0).to(tl.float32)
        x_b = tl.load(x_a_ptr + HALF, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_a_ptr, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out_a_ptr + HALF, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


def launch(x, cos, sin, out, *, block_s: int, block_h: int, num_warps: int = 4, reload: bool = False):
    """Launch the copy on a contiguous-channel (batch, seq, heads, head_dim) ``x``; return what the launch returned
    (the compiled kernel on a GPU, whose registers the laboratory reads)."""
    batch, seq, heads, head_dim = x.shape
    if x.stride(-1) != 1 or out.stride(-1) != 1 or head_dim // 2 != triton.next_power_of_2(head_dim // 2):
        raise ValueError("x and out need contiguous channels and head_dim / 2 a power of two")
    grid = (triton.cdiv(seq, block_s), batch)
    return tile_kernel[grid](x, cos, sin, out, seq, heads, *x.stride()[:3], *out.stride()[:3],
                             HALF=head_dim // 2, BLOCK_S=block_s, BLOCK_H=block_h, RELOAD_COS_SIN=reload,
                             num_warps=num_warps)


def _inputs(lab):
    batch, seq, heads, head_dim = lab.shape(LLAMA3_8B_Q, (1, 5, 4, 16))
    x = lab.randn((batch, seq, heads, head_dim), torch.bfloat16)
    cos, sin = frequencies.cos_sin_table(seq, head_dim, device=lab.device)
    return x, cos, sin, torch.empty_like(x)


@experiment("tile_reuse", "What do v3's tiles buy: reusing cos/sin across heads, or bigger programs?")
def tile_reuse(lab) -> dict:
    """v2 (a program per token x head), then the tile copy at a few tiles, cos/sin reloaded in every head step or
    loaded once: the pairs differ only in the reuse."""
    x, cos, sin, out = _inputs(lab)
    batch, seq, heads, head_dim = x.shape
    moved, size = 2 * x.nbytes, x.element_size()
    case = f"bf16 {tuple(x.shape)}"
    rows = [lab.time("v2 (a program per token x head)", lambda: v2.rope_v2(x, cos, sin, out), moved,
                     perf_model.row_launch(batch * seq * heads, head_dim, size), case=case)]
    for block_s, block_h in REUSE_TILES:
        for reload in (True, False):
            rows.append(lab.time(
                f"tile {block_s}x{block_h}, cos/sin {'reloaded per head step' if reload else 'once'}",
                lambda bs=block_s, bh=block_h, r=reload: launch(x, cos, sin, out, block_s=bs, block_h=bh, reload=r),
                moved, perf_model.tile_launch(batch, seq, heads, head_dim, size, block_s, block_h), case=case,
                block_s=block_s, block_h=block_h, reload=reload))
    return {"rows": rows}


@experiment("tile_sweep", "Which BLOCK_S is fastest for v3's tile, and why?")
def tile_sweep(lab) -> dict:
    """The tile copy (cos/sin once) at BLOCK_S = 1 ... 16 tokens, BLOCK_H = 4 heads, 4 warps; each row carries the
    grid's waves (programs / (SMs x programs resident per SM)) and how full its last wave is."""
    x, cos, sin, out = _inputs(lab)
    batch, seq, heads, head_dim = x.shape
    moved, size = 2 * x.nbytes, x.element_size()
    rows = []
    for block_s in SWEEP_BLOCK_S:
        row = lab.time(f"BLOCK_S = {block_s}", lambda bs=block_s: launch(x, cos, sin, out, block_s=bs, block_h=4),
                       moved, perf_model.tile_launch(batch, seq, heads, head_dim, size, block_s, 4),
                       case=f"bf16 {tuple(x.shape)}", block_s=block_s, block_h=4,
                       bytes_per_step=block_s * 4 * head_dim * size)
        waves = row["programs"] / (lab.model.n_sms * row["resident_programs"])
        row.update(waves=waves, last_wave_full=waves / math.ceil(waves))
        rows.append(row)
    return {"rows": rows}
