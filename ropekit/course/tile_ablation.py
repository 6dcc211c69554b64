"""What v3's tiles buy, one cause at a time: an ablation on the GPU for notebook 04.

v3 differs from v2 in two ways at once: a program handles a whole tile of tokens x heads (bigger programs, fewer of
them), and it loads its tokens' cos/sin rows once for every head (reuse). To tell them apart this module runs a
**teaching copy** of v3's kernel with one switch, ``RELOAD_COS_SIN``, that loads the cos/sin rows again in every
step of the head loop, as a program of v2 does: same tile, same grid, same q traffic, only the reuse removed.

:func:`run` measures on Llama-3-8B prefill's q (b4 s4096, 32 heads x 128, bf16), L2 flushed before every call:

* ``reuse``: v2, then the copy at a few tiles with and without reuse;
* ``sweep``: ``BLOCK_S`` = 1 … 16 at ``BLOCK_H`` = 4, each with what the compiler reports (registers per thread,
  spills) and what follows from it (:func:`occupancy`): programs resident per SM, bytes of q in flight per SM, waves.

``python -m ropekit.course.tile_ablation --out DIR`` writes the result as ``DIR/tile_ablation.json`` (GPU only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import triton
import triton.language as tl

from ..frequencies import cos_sin_table
from ..triton import v2
from . import speed

__all__ = ["rope_v3_ablation_kernel", "launch", "occupancy", "run", "LLAMA3_8B_Q"]

LLAMA3_8B_Q = (4, 4096, 32, 128, torch.bfloat16)  # batch, seq, heads, head_dim, dtype


@triton.jit
def rope_v3_ablation_kernel(X, COS, SIN, OUT, seqlen, n_heads, stride_xb, stride_xs, stride_xh, stride_ob, stride_os,
                            stride_oh, HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
                            RELOAD_COS_SIN: tl.constexpr):
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
    """Launch the copy on a contiguous (batch, seq, heads, head_dim) x; return the compiled kernel (its
    ``n_regs``/``n_spills`` on a GPU)."""
    batch, seq, heads, head_dim = x.shape
    if x.stride(-1) != 1 or out.stride(-1) != 1 or head_dim // 2 != triton.next_power_of_2(head_dim // 2):
        raise ValueError("x and out need contiguous channels and head_dim / 2 a power of two")
    grid = (triton.cdiv(seq, block_s), batch)
    return rope_v3_ablation_kernel[grid](x, cos, sin, out, seq, heads, *x.stride()[:3], *out.stride()[:3],
                                         HALF=head_dim // 2, BLOCK_S=block_s, BLOCK_H=block_h,
                                         RELOAD_COS_SIN=reload, num_warps=num_warps)


def occupancy(n_regs: int, num_warps: int, *, max_threads: int = 2048, registers: int = 65536,
              max_programs: int = 32) -> int:
    """Programs (thread blocks) one SM can hold at once, as limited by warps, registers and its block slots.

    Registers are given to a warp in units of 256 (sm_80/sm_90); the defaults are an H100 SM's limits."""
    per_warp = math.ceil(max(n_regs, 1) * 32 / 256) * 256
    by_registers = registers // (per_warp * num_warps)
    by_threads = max_threads // (32 * num_warps)
    return max(0, min(max_programs, by_threads, by_registers))


def _device_limits() -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"sms": props.multi_processor_count,
            "max_threads": getattr(props, "max_threads_per_multi_processor", 2048),
            "registers": getattr(props, "regs_per_multiprocessor", 65536), "name": props.name}


def run(shape=LLAMA3_8B_Q, *, clock=None, device: str = "cuda") -> dict:
    """Measure the ablation (see the module docstring); every time is a median against one copy ceiling measured
    first in the same run. With a fake ``clock`` (tests) it runs anywhere, small, and reports no registers."""
    batch, seq, heads, head_dim, dtype = shape
    clock = speed.gpu_clock() if clock is None else clock
    ceiling = float(clock.copy_ceiling()["gbps"])
    x = torch.randn(batch, seq, heads, head_dim, device=device).to(dtype)
    out = torch.empty_like(x)
    cos, sin = cos_sin_table(seq, head_dim, device=device)
    moved = 2 * x.numel() * x.element_size()
    limits = _device_limits() if device == "cuda" else None

    def timed(fn) -> dict:
        measured = speed.measure(fn, moved, clock=clock, ceiling_gbps=ceiling)
        return {"time_us": measured.time_us, "gbps": measured.gbps, "share": measured.share}

    reuse = [{"kernel": "v2 (a program per token x head)", **timed(lambda: v2.rope_v2(x, cos, sin, out))}]
    for block_s, block_h in ((1, 1), (1, 4), (4, 4)):
        for reload in (True, False):
            row = timed(lambda: launch(x, cos, sin, out, block_s=block_s, block_h=block_h, reload=reload))
            reuse.append({"kernel": f"tile {block_s}x{block_h}, cos/sin {'reloaded per step' if reload else 'once'}",
                          "block_s": block_s, "block_h": block_h, "reload": reload, **row})
    sweep = []
    for block_s in (1, 2, 4, 8, 16):
        compiled = launch(x, cos, sin, out, block_s=block_s, block_h=4)
        row = {"block_s": block_s, "block_h": 4, "num_warps": 4, "programs": triton.cdiv(seq, block_s) * batch,
               "bytes_per_step": block_s * 4 * head_dim * x.element_size(), **timed(
                   lambda: launch(x, cos, sin, out, block_s=block_s, block_h=4))}
        n_regs = getattr(compiled, "n_regs", None) if limits else None
        if n_regs:
            resident = occupancy(n_regs, 4, max_threads=limits["max_threads"], registers=limits["registers"])
            waves = row["programs"] / (limits["sms"] * resident)
            row.update(n_regs=n_regs, n_spills=getattr(compiled, "n_spills", None), resident_per_sm=resident,
                       bytes_in_flight_per_sm=resident * row["bytes_per_step"], waves=waves,
                       last_wave_full=waves / math.ceil(waves))
        sweep.append(row)
    return {"shape": {"batch": batch, "seq": seq, "heads": heads, "head_dim": head_dim,
                      "dtype": str(dtype).replace("torch.", "")},
            "bytes_moved": moved, "ceiling_gbps": ceiling, "device": limits, "reuse": reuse, "sweep": sweep}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="example: python -m ropekit.course.tile_ablation --out $OUT")
    parser.add_argument("--out", type=Path, required=True, help="folder for tile_ablation.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the ablation times kernels on a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    result = run()
    (args.out / "tile_ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
