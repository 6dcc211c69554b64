"""Context parallelism across processes with ``torch.distributed``.

Transformer Engine's load-balanced split cuts each sequence into ``2 * cp_size`` chunks and gives rank ``r`` chunks
``r`` and ``2 * cp_size - 1 - r`` (``ropekit.context_parallel_shard``); the positions of those tokens are
``ropekit.context_parallel_positions`` (``context_parallel_varlen_positions`` for packed batches). Each rank rotates
its own tokens with ``apply_rope(..., positions=...)``; nothing about RoPE needs communication.

:func:`gather_context_parallel` is the inverse of the split (every rank's shard, gathered and put back in sequence
order): what a test, or the end of a training step that needs the whole sequence, uses. ``python -m
ropekit.distributed --world 4`` runs the check below in ``world`` processes (gloo on the CPU, NCCL on GPUs): the
gathered result of every rank must equal the single-process ``apply_rope`` bit for bit, for ``bshd`` and for packed
``thd`` batches.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist

from . import device as _device
from .api import apply_rope
from .frequencies import cos_sin_table
from .positions import context_parallel_positions, context_parallel_shard, context_parallel_varlen_positions
from .validate import as_integer

__all__ = ["gather_context_parallel", "check_context_parallel", "main"]


def gather_context_parallel(local: torch.Tensor, cp_size: int, *, seq_dim: int = 1, group=None) -> torch.Tensor:
    """All ranks' ``local`` shards (each ``context_parallel_shard`` of one sequence axis) back in sequence order.

    Every rank holds two equal chunks of the sequence, so ``local``'s length along ``seq_dim`` must be even; the
    checks run before the collective, the same on every rank (their shards have one shape).
    """
    size = as_integer(cp_size)
    if size is None or size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
    cp_size = size
    if not isinstance(local, torch.Tensor) or not -local.ndim <= seq_dim < local.ndim:
        raise ValueError(f"local must be a tensor with a dimension seq_dim={seq_dim}, got "
                         f"{getattr(local, 'shape', type(local).__name__)}")
    if local.shape[seq_dim] % 2:
        raise ValueError(f"local must hold an even number of tokens along seq_dim={seq_dim} (two equal chunks of "
                         f"the sequence, as context_parallel_shard gives each rank), got {local.shape[seq_dim]}")
    shards = _all_gather(local, cp_size, group)
    half = local.shape[seq_dim] // 2
    chunks = [None] * (2 * cp_size)
    for rank, shard in enumerate(shards):
        chunks[rank] = shard.narrow(seq_dim, 0, half)
        chunks[2 * cp_size - 1 - rank] = shard.narrow(seq_dim, half, half)
    return torch.cat(chunks, dim=seq_dim)


def _all_gather(local: torch.Tensor, cp_size: int, group) -> list[torch.Tensor]:
    """Every rank's ``local``; through host memory where the backend (gloo) takes CPU tensors only."""
    via_host = local.is_cuda and dist.get_backend(group) == "gloo"
    sent = (local.cpu() if via_host else local).contiguous()
    shards = [torch.empty_like(sent) for _ in range(cp_size)]
    dist.all_gather(shards, sent, group=group)
    return [shard.to(local.device) for shard in shards] if via_host else shards


def _gather_varlen(local: torch.Tensor, lengths: list[int], cp_size: int) -> torch.Tensor:
    """Packed (thd) shards back in order: each sequence's share on every rank is its two chunks."""
    shards = _all_gather(local, cp_size, None)
    pieces, starts = [], [0] * cp_size
    for n in lengths:
        share = n // cp_size
        chunk = share // 2
        chunks = [None] * (2 * cp_size)
        for rank, shard in enumerate(shards):
            mine = shard[starts[rank]:starts[rank] + share]
            chunks[rank], chunks[2 * cp_size - 1 - rank] = mine[:chunk], mine[chunk:]
            starts[rank] += share
        pieces += chunks
    return torch.cat(pieces)


def check_context_parallel(rank: int, world: int, device: str = "cpu") -> dict:
    """On each rank: rotate this rank's tokens, gather, compare with the whole sequence rotated in one process."""
    gen = torch.Generator().manual_seed(0)  # every rank draws the same full inputs
    batch, seqlen, heads, head_dim = 2, 8 * world, 3, 32
    q = torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(device)
    k = torch.randn(batch, seqlen, 1, head_dim, generator=gen).to(device)
    cos, sin = cos_sin_table(seqlen, head_dim, device=device)
    want_q, want_k = apply_rope(q, k, cos, sin)
    positions = context_parallel_positions(seqlen, world, rank, device=device)
    out_q, out_k = apply_rope(context_parallel_shard(q, world, rank), context_parallel_shard(k, world, rank), cos, sin,
                              positions=positions[None])  # (1, local seq): position ids shared by the batch
    bshd = torch.equal(gather_context_parallel(out_q, world), want_q) and \
        torch.equal(gather_context_parallel(out_k, world), want_k)

    lengths = [2 * world * n for n in (1, 3, 2)]  # each sequence divisible by 2 * world
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], device=device)
    packed = torch.randn(sum(lengths), heads, head_dim, generator=gen).to(device)
    want, _ = apply_rope(packed, None, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=max(lengths))
    local_cu = cu // world
    mine = torch.cat([context_parallel_shard(packed[a:b], world, rank, seq_dim=0)
                      for a, b in zip(cu.tolist(), cu.tolist()[1:])])
    local_positions = context_parallel_varlen_positions(cu, world, rank)
    out, _ = apply_rope(mine, None, cos, sin, positions=local_positions[None], layout="thd", cu_seqlens=local_cu,
                        max_seqlen=max(lengths) // world)
    thd = torch.equal(_gather_varlen(out, lengths, world), want)
    return {"rank": rank, "bshd": bshd, "thd": thd}


def _worker(rank: int, world: int, port: int, backend: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = _device.DEVICE  # where ropekit's kernels run: the interpreter on a CPU, else a GPU
    if device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"  # gloo may put several ranks on one GPU
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        results[rank] = check_context_parallel(rank, world, device)
    finally:
        dist.destroy_process_group()


def run(world: int, backend: str | None = None) -> list[dict]:
    """Spawn ``world`` processes; each returns whether its gathered results equal the single-process ones."""
    import torch.multiprocessing as mp

    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(world, port, backend, results), nprocs=world, join=True)
    return [dict(results[r], backend=backend) for r in range(world)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropekit.distributed", description="Context-parallel RoPE across processes, checked bit for "
        "bit against one process.", epilog="example: python -m ropekit.distributed --world 4 --backend gloo")
    parser.add_argument("--world", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl with a GPU per rank, else gloo")
    args = parser.parse_args(argv)
    results = run(args.world, args.backend)
    for r in results:
        print(r)
    return 0 if all(r["bshd"] and r["thd"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
