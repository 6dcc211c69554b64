"""v3 — reuse and tiling.

v1 and v2 give every (token, head) row its own program, and every program loads its token's cos and sin rows. All
heads of a token share those rows, so with 32 heads the same 2 x head_dim/2 float32 values are fetched 32 times per
token. For bf16 at head_dim 128 a row is 256 bytes read and 256 written, and its cos/sin are 512 bytes more loads:
half of all the bytes the program requests. Most of them hit in L2, but they still cost load instructions and L2
bandwidth, and each program pays its scheduling overhead to move a few hundred bytes.

v3 gives a program a **tile**: ``BLOCK_S`` consecutive tokens of one sequence. It loads the cos/sin rows of those
tokens once, as a ``[BLOCK_S, BLOCK_HALF]`` block kept in registers, then walks over **all** heads of the tensor in
steps of ``BLOCK_H`` heads, rotating ``[BLOCK_S, BLOCK_H, BLOCK_HALF]`` pairs per step. cos/sin traffic drops by the
number of heads; each program moves ``BLOCK_S * heads * head_dim`` elements instead of ``head_dim``.

Grid: ``(cdiv(seq, BLOCK_S), batch)``. Positions are 0..seq-1 for every sequence, so sequences could share cos/sin
rows too; that would save little more (the rows are already loaded once per tile) and would shrink the grid.

Block sizes and warps come from a small table (``GPU_TABLE``, read by ``launch_config``) that
``tools/time_ladder.py`` measures on the H100 (until that run: the defaults argued in ``launch_config``). Under the
Triton interpreter the config is fixed (large tiles: every program costs Python time there).
Everything else — strides, masks, dtypes, the argument checks — is v2's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from .v2 import check_arguments

__all__ = ["rope_v3_kernel", "rope_v3", "launch_config", "V3Config"]


@triton.jit
def rope_v3_kernel(
    X, COS, SIN, OUT, seqlen, n_heads,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_cs_s, stride_cs_d,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Rotate tokens ``[program_id(0) * BLOCK_S, +BLOCK_S)`` of sequence ``program_id(1)``, every head."""
    first_token = tl.program_id(0) * BLOCK_S
    batch = tl.program_id(1)
    tokens = first_token + tl.arange(0, BLOCK_S)
    pairs = tl.arange(0, BLOCK_HALF)
    token_mask = tokens < seqlen  # the last tile may run past the sequence
    pair_mask = pairs < HALF

    # cos/sin of this tile's tokens: loaded once, [BLOCK_S, 1, BLOCK_HALF] so they broadcast over the heads.
    cs_offsets = tokens[:, None] * stride_cs_s + pairs[None, :] * stride_cs_d
    cs_mask = token_mask[:, None] & pair_mask[None, :]
    cos = tl.load(COS + cs_offsets, mask=cs_mask, other=0.0)[:, None, :]
    sin = tl.load(SIN + cs_offsets, mask=cs_mask, other=0.0)[:, None, :]

    # [BLOCK_S, 1, 1] start of each token and [1, 1, BLOCK_HALF] channel offsets; heads are added per step.
    x_tokens = X + batch * stride_xb + tokens[:, None, None] * stride_xs
    out_tokens = OUT + batch * stride_ob + tokens[:, None, None] * stride_os
    x_pairs = pairs[None, None, :] * stride_xd
    out_pairs = pairs[None, None, :] * stride_od
    tile_mask = cs_mask[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = tile_mask & (heads < n_heads)[None, :, None]
        x_a_ptr = x_tokens + heads[None, :, None] * stride_xh + x_pairs
        x_a = tl.load(x_a_ptr, mask=mask, other=0.0).to(tl.float32)
        x_b = tl.load(x_a_ptr + HALF * stride_xd, mask=mask, other=0.0).to(tl.float32)
        out_a_ptr = out_tokens + heads[None, :, None] * stride_oh + out_pairs
        tl.store(out_a_ptr, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out_a_ptr + HALF * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty), mask=mask)


class V3Config(NamedTuple):
    block_s: int  # tokens per program (upper bound: shrunk for short inputs, see launch_config)
    block_h: int  # heads per step of the program's loop over heads
    num_warps: int


# (BLOCK_HALF, element size in bytes) -> config. Until tools/time_ladder.py has been run on the H100 these are the
# defaults argued in launch_config's docstring; the script prints the measured best per case in this form.
GPU_TABLE: dict[tuple[int, int], V3Config] = {
    (64, 2): V3Config(block_s=4, block_h=4, num_warps=4),  # head_dim 128, fp16/bf16 (Llama prefill, MHA fp16)
    (32, 4): V3Config(block_s=8, block_h=4, num_warps=4),  # head_dim 64, fp32
}
_TILE_ELEMENTS = 2048  # elements rotated per loop step by the fallback rule
_MIN_PROGRAMS_PER_SM = 4


def launch_config(batch: int, seqlen: int, n_heads: int, head_dim: int, element_size: int) -> V3Config:
    """Tile sizes for a ``(batch, seqlen, n_heads, head_dim)`` input.

    GPU: ``GPU_TABLE`` by (padded half head_dim, element size); shapes not in the table take 2048 elements per loop
    step over 4 heads, i.e. 16 elements per thread with 4 warps — enough bytes in flight per program without
    register spills. That is v4's tile (its measurements: docs/tuning.md#launch-table); v3's own table is timed by
    tools/time_ladder.py. ``BLOCK_S`` is then halved while the grid would give fewer than 4 programs per SM, so that
    short inputs still fill the GPU. Interpreter: the largest tiles the shape allows (up to 16 tokens x 8 heads), fixed.
    """
    block_half = triton.next_power_of_2(max(head_dim // 2, 1))
    heads_pow2 = triton.next_power_of_2(max(n_heads, 1))
    tokens_pow2 = triton.next_power_of_2(max(seqlen, 1))
    if _device.INTERPRET:
        return V3Config(min(tokens_pow2, 16), min(heads_pow2, 8), 4)
    config = GPU_TABLE.get((block_half, element_size))
    if config is None:
        block_h = min(heads_pow2, 4)
        config = V3Config(max(1, _TILE_ELEMENTS // (2 * block_half * block_h)), block_h, 4)
    block_s = min(config.block_s, tokens_pow2)
    min_programs = _MIN_PROGRAMS_PER_SM * _sm_count()
    while block_s > 1 and triton.cdiv(seqlen, block_s) * batch < min_programs:
        block_s //= 2
    return V3Config(block_s, min(config.block_h, heads_pow2), config.num_warps)


_SM_COUNT: dict[int, int] = {}


def _sm_count() -> int:
    index = torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def rope_v3(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None, *,
            config: V3Config | None = None) -> torch.Tensor:
    """Rotate ``x`` at positions ``0..seq-1``; return ``out``. Same arguments and checks as ``rope_v2``.

    ``config`` overrides ``launch_config`` (``tools/time_ladder.py`` measures candidates this way).
    """
    check_arguments(x, cos, sin, out, version="v3")
    if out is None:
        out = torch.empty_like(x)
    batch, seqlen, n_heads, head_dim = x.shape
    if x.numel() == 0:
        return out
    if batch >= 65536:
        raise ValueError(f"x's batch ({batch}) must be < 65536 in v3 (it is the grid's second axis)")
    if config is None:
        config = launch_config(batch, seqlen, n_heads, head_dim, x.element_size())
    grid = (triton.cdiv(seqlen, config.block_s), batch)
    rope_v3_kernel[grid](
        x, cos, sin, out, seqlen, n_heads, *x.stride(), *out.stride(), *cos.stride(),
        HALF=head_dim // 2, BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        BLOCK_S=config.block_s, BLOCK_H=config.block_h, num_warps=config.num_warps)
    return out
