"""Context parallelism across processes with ``torch.distributed``.

Transformer Engine's load-balanced split cuts each sequence into ``2 * cp_size`` chunks and gives rank ``r`` chunks
``r`` and ``2 * cp_size - 1 - r`` (``ropekit.context_parallel_shard``); the positions of those tokens are
``ropekit.context_parallel_positions`` (``context_parallel_varlen_positions`` for packed batches). Each rank rotates
its own tokens with ``apply_rope(..., positions=...)``, and the fused ops take the same positions; nothing about
RoPE needs communication. A rank's ``rope_and_cache`` writes its own tokens' cache rows (their slots, or their rows
at the sequence's offset plus the chunk's start) and no other.

:func:`gather_context_parallel` is the inverse of the split (every rank's shard, gathered and put back in sequence
order): what a test, or the end of a training step that needs the whole sequence, uses. ``python -m
ropekit.distributed --world 4`` runs :func:`check_context_parallel` in ``world`` processes (gloo on the CPU, NCCL on
GPUs): on every rank, each op's gathered outputs, and the caches of all ranks put together, must equal the
single-process call bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist

from . import device as _device
from .api import apply_rope
from .frequencies import cos_sin_table
from .fused import qk_norm_rope, rope_and_cache
from .positions import context_parallel_positions, context_parallel_shard, context_parallel_varlen_positions
from .validate import as_integer

__all__ = ["gather_context_parallel", "gather_cache", "check_context_parallel", "run", "passed", "main"]


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


def _shard_varlen(packed: torch.Tensor, cu: list[int], cp_size: int, rank: int) -> torch.Tensor:
    """A rank's share of a packed (thd) batch: its two chunks of every sequence, sequence after sequence."""
    return torch.cat([context_parallel_shard(packed[a:b], cp_size, rank, seq_dim=0) for a, b in zip(cu, cu[1:])])


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


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bytes, one row per cache row (a paged cache's slot, a contiguous cache's (sequence, row))."""
    return x.contiguous().view(torch.uint8).reshape(x.shape[0] * x.shape[1], -1)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def gather_cache(cache: torch.Tensor, fill: torch.Tensor, token_rows: torch.Tensor, cp_size: int, *,
                 cu_seqlens=None, group=None) -> torch.Tensor:
    """Every rank's copy of a KV cache that started as ``fill``, put together: each rank gives the rows of its own
    tokens, and every other row keeps ``fill``.

    ``cache``/``fill``: ``(num_blocks, block_size, ...)`` paged or ``(batch, max_seq, ...)`` contiguous, one row per
    (block, offset) or (sequence, position). ``token_rows``: the flat cache row (slot) of every token of the whole
    batch, -1 for a token that writes nothing; ``(batch, seq)`` split as ``context_parallel_shard``, or packed
    ``(tokens,)`` with ``cu_seqlens`` (a host list or tensor) split per sequence as Transformer Engine's thd. The
    caches travel as bytes, so any dtype (float8 too) crosses any backend and compares bit for bit. Raises
    ``ValueError`` when a rank's copy differs from ``fill`` in a row that is not one of its own tokens'.
    """
    if cu_seqlens is None:
        def shard(rows, rank):
            return context_parallel_shard(rows, cp_size, rank)
    else:
        cu = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)

        def shard(rows, rank):
            return _shard_varlen(rows, cu, cp_size, rank)
    copies = _all_gather(_bits(cache), cp_size, group)
    before, combined = _bits(fill), _bits(fill).clone()
    for rank, copy in enumerate(copies):
        own = shard(token_rows, rank).reshape(-1)
        own = own[own >= 0].to(copy.device)
        others = torch.ones(len(copy), dtype=torch.bool, device=copy.device)
        others[own] = False
        changed = (copy[others] != before[others]).any(dim=1)
        if bool(changed.any()):
            raise ValueError(f"rank {rank} changed {int(changed.sum())} cache rows that none of its tokens own")
        combined[own] = copy[own]
    return combined.reshape(*cache.shape[:2], -1).view(cache.dtype).reshape(cache.shape)


def _caches_add_up(mine, whole, fill, token_rows, cp_size, cu_seqlens=None) -> bool:
    """Whether the ranks' copies of each cache (k's, v's), put together, are the single-process caches."""
    matches = []
    for m, w, f in zip(mine, whole, fill):  # no early exit: every rank joins every gather
        try:
            matches.append(_same_bits(gather_cache(m, f, token_rows, cp_size, cu_seqlens=cu_seqlens), w))
        except ValueError:
            matches.append(False)
    return all(matches)


def check_context_parallel(rank: int, world: int, device: str = "cpu") -> dict:
    """On each rank: run every op on this rank's tokens, gather, compare with the whole batch in one process.

    Returns ``{"rank": rank, case: bool, ...}``: ``apply_rope`` on bshd and on packed thd batches, ``qk_norm_rope``,
    and ``rope_and_cache`` into a paged cache (slot_mapping with padding tokens, rotated k returned), a contiguous
    cache (cache_offsets; a rank writes each of its two chunks at the chunk's own offset) and a float8 paged cache
    of a packed batch with QK-norm. Every rank draws the same full inputs, so each can compute the single-process
    answer itself.
    """
    gen = torch.Generator().manual_seed(0)

    def draw(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    # chunks of 2 tokens on the CPU (the interpreter is slow); on a GPU of 24, so that the whole batch's fused
    # launches take the launch table's prefill configuration and a rank's share (96 tokens) the decode one: no bit
    # may depend on it
    chunk = 2 if torch.device(device).type == "cpu" else 24
    batch, seqlen, heads, kv_heads, head_dim = 2, 2 * world * chunk, 4, 2, 32
    positions = context_parallel_positions(seqlen, world, rank, device=device)[None]  # ids shared by the batch
    lengths = [world * chunk * n for n in (1, 3, 2)]  # packed sequences, each divisible by 2 * world (chunk is even)
    cu = [0] + [sum(lengths[:i + 1]) for i in range(len(lengths))]
    varlen = dict(layout="thd", cu_seqlens=torch.tensor(cu, device=device), max_seqlen=max(lengths))
    local_varlen = dict(layout="thd", cu_seqlens=varlen["cu_seqlens"] // world, max_seqlen=max(lengths) // world,
                        positions=context_parallel_varlen_positions(varlen["cu_seqlens"], world, rank)[None])

    def shard(x):
        return context_parallel_shard(x, world, rank)

    def shard_varlen(x):
        return _shard_varlen(x, cu, world, rank)

    def gathered(*pairs):  # (local, whole) pairs; every pair is gathered, whatever an earlier one showed
        return all([_same_bits(gather_context_parallel(local, world), whole) for local, whole in pairs])

    def gathered_varlen(local, whole):
        return _same_bits(_gather_varlen(local, lengths, world), whole)

    results = {"rank": rank}
    cos, sin = cos_sin_table(2 * seqlen, head_dim, device=device)  # room for the contiguous cache's offsets
    q, k = draw(batch, seqlen, heads, head_dim), draw(batch, seqlen, 1, head_dim)
    want_q, want_k = apply_rope(q, k, cos, sin)
    out_q, out_k = apply_rope(shard(q), shard(k), cos, sin, positions=positions)
    results["apply_rope bshd"] = gathered((out_q, want_q), (out_k, want_k))

    packed = draw(cu[-1], heads, head_dim)
    want, _ = apply_rope(packed, None, cos, sin, **varlen)
    out, _ = apply_rope(shard_varlen(packed), None, cos, sin, **local_varlen)
    results["apply_rope thd"] = gathered_varlen(out, want)

    # the fused ops in bf16, a model's dtype: their one rounding at the end is what must agree
    bf16 = torch.bfloat16
    q, k, v = (draw(batch, seqlen, h, head_dim, dtype=bf16) for h in (heads, kv_heads, kv_heads))
    q_weight, k_weight = draw(head_dim), draw(head_dim)
    want_q, want_k = qk_norm_rope(q, k, cos, sin, q_weight, k_weight)
    out_q, out_k = qk_norm_rope(shard(q), shard(k), cos, sin, q_weight, k_weight, positions=positions)
    results["qk_norm_rope bshd"] = gathered((out_q, want_q), (out_k, want_k))

    # paged: a shuffled slot per token, every 7th token padding (-1), spare rows no token owns
    block_size, num_blocks = 4, batch * seqlen // 4 + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:batch * seqlen].view(batch, seqlen)
    slots.view(-1)[::7] = -1
    slots = slots.to(device)
    fill = draw(num_blocks, block_size, kv_heads, head_dim, dtype=bf16), \
        draw(num_blocks, block_size, kv_heads, head_dim, dtype=bf16)
    whole, mine = [c.clone() for c in fill], [c.clone() for c in fill]
    want_q, want_k = rope_and_cache(q, k, v, cos, sin, k_cache=whole[0], v_cache=whole[1],
                                    slot_mapping=slots.reshape(-1), write_k=True)
    out_q, out_k = rope_and_cache(shard(q), shard(k), shard(v), cos, sin, k_cache=mine[0], v_cache=mine[1],
                                  slot_mapping=shard(slots).reshape(-1), positions=positions, write_k=True)
    results["rope_and_cache paged bshd"] = all([gathered((out_q, want_q), (out_k, want_k)),
                                                _caches_add_up(mine, whole, fill, slots, world)])

    # contiguous: sequence b starts at row (and position) offsets[b]; each chunk of a rank goes at its own start
    # ((batch, 1) offsets: a (batch,) tensor with batch == chunk would read as position ids)
    offsets, max_seq = torch.tensor([3, 0], device=device), seqlen + 3
    fill = draw(batch, max_seq, kv_heads, head_dim, dtype=bf16), draw(batch, max_seq, kv_heads, head_dim, dtype=bf16)
    whole, mine = [c.clone() for c in fill], [c.clone() for c in fill]
    want_q, _ = rope_and_cache(q, k, v, cos, sin, k_cache=whole[0], v_cache=whole[1], cache_offsets=offsets,
                               positions=offsets[:, None])
    q_mine, k_mine, v_mine = shard(q), shard(k), shard(v)
    out_q = []
    for half, index in enumerate((rank, 2 * world - 1 - rank)):
        part, start = slice(half * chunk, (half + 1) * chunk), offsets + index * chunk
        out_q.append(rope_and_cache(q_mine[:, part], k_mine[:, part], v_mine[:, part], cos, sin, k_cache=mine[0],
                                    v_cache=mine[1], cache_offsets=start, positions=start[:, None])[0])
    rows = (torch.arange(batch, device=device)[:, None] * max_seq + offsets[:, None]
            + torch.arange(seqlen, device=device))
    results["rope_and_cache contiguous bshd"] = all([gathered((torch.cat(out_q, dim=1), want_q)),
                                                     _caches_add_up(mine, whole, fill, rows, world)])

    # float8 paged cache of a packed batch, QK-norm in the same launch
    fp8 = torch.float8_e4m3fn
    q, k, v = (draw(cu[-1], h, head_dim, dtype=bf16) for h in (heads, kv_heads, kv_heads))
    num_blocks = cu[-1] // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:cu[-1]]
    slots[::5] = -1
    slots = slots.to(device)
    fill = draw(num_blocks, block_size, kv_heads, head_dim).to(fp8), draw(num_blocks, block_size, kv_heads,
                                                                          head_dim).to(fp8)
    scales = dict(k_scale=torch.tensor([0.02], device=device), v_scale=torch.tensor([0.01], device=device))
    whole, mine = [c.clone() for c in fill], [c.clone() for c in fill]
    want_q, _ = rope_and_cache(q, k, v, cos, sin, k_cache=whole[0], v_cache=whole[1], slot_mapping=slots,
                               q_weight=q_weight, k_weight=k_weight, **scales, **varlen)
    out_q, _ = rope_and_cache(shard_varlen(q), shard_varlen(k), shard_varlen(v), cos, sin, k_cache=mine[0],
                              v_cache=mine[1], slot_mapping=shard_varlen(slots), q_weight=q_weight,
                              k_weight=k_weight, **scales, **local_varlen)
    results["rope_and_cache float8 paged thd qk-norm"] = all([gathered_varlen(out_q, want_q),
                                                              _caches_add_up(mine, whole, fill, slots, world, cu)])
    return results


def _worker(rank: int, world: int, folder: str, backend: str) -> None:
    device = _device.DEVICE  # where ropekit's kernels run: the interpreter on a CPU, else a GPU
    if device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"  # gloo may put several ranks on one GPU
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        result = check_context_parallel(rank, world, device)
    finally:
        dist.destroy_process_group()
    result["device"] = f"{device} ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else device
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def run(world: int, backend: str | None = None) -> list[dict]:
    """Spawn ``world`` processes; each returns whether its gathered results equal the single-process ones.

    The ranks meet through a file in a fresh temporary folder (``init_method="file://..."``, torch's FileStore)
    rather than a TCP port: a port found free here could be taken by another process before rank 0 binds it, a
    file no other process knows of cannot. Each rank leaves its result as JSON in the same folder.
    """
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = backend or ("nccl" if gpus >= world else "gloo")
    if backend == "nccl" and gpus < world:
        raise ValueError(f"world={world} with backend='nccl' needs a GPU per rank; this machine has {gpus}")
    with tempfile.TemporaryDirectory(prefix="ropekit-distributed-") as folder:
        mp.spawn(_worker, args=(world, folder, backend), nprocs=world, join=True)
        results = []
        for rank in range(world):
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                results.append(dict(json.load(f), backend=backend))
    return results


def passed(result: dict) -> bool:
    """Whether every case of one rank's result matched the single process."""
    return all(value for value in result.values() if isinstance(value, bool))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropekit.distributed", description="Context-parallel apply_rope, qk_norm_rope and "
        "rope_and_cache across processes, checked bit for bit against one process.",
        epilog="example: python -m ropekit.distributed --world 4 --backend gloo")
    parser.add_argument("--world", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: nccl with a GPU per rank, else gloo")
    args = parser.parse_args(argv)
    results = run(args.world, args.backend)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if results[0]["backend"] == "nccl" else None
    print(f"torch {torch.__version__}, backend {results[0]['backend']}" + (f" (NCCL {nccl})" if nccl else "")
          + f", world {args.world}; kernels: {_device.describe()}")
    for r in results:
        cases = " ".join(f"[{case}: {'bit for bit' if ok else 'DIFFERS'}]" for case, ok in r.items()
                         if isinstance(ok, bool))
        print(f"rank {r['rank']} on {r['device']}: {cases}")
    ok = all(passed(r) for r in results)
    print("every rank matched one process bit for bit" if ok else "MISMATCH: some rank differs from one process")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
