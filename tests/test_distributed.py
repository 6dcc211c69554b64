"""Context parallel across processes (torch.distributed, gloo on the CPU): every rank rotates its two chunks with
``context_parallel_positions``, and the gathered result equals the single-process one bit for bit (bshd and thd)."""

import pytest
import torch

from ropekit import distributed


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_gathered_equal_one_process_bit_for_bit(world):
    results = distributed.run(world, "gloo")
    assert len(results) == world
    assert all(r["bshd"] and r["thd"] for r in results), results


def test_gather_puts_chunks_back_in_sequence_order(monkeypatch):
    # a fake all_gather (two ranks' shards of arange) checks the reordering without processes
    full = torch.arange(8)[None, :, None]
    shards = [distributed.context_parallel_shard(full, 2, r) for r in range(2)]
    monkeypatch.setattr(distributed.dist, "all_gather", lambda out, local, group=None: [
        o.copy_(s) for o, s in zip(out, shards)])
    assert torch.equal(distributed.gather_context_parallel(shards[0], 2), full)


@pytest.mark.parametrize("tokens_per_rank", [3, 1], ids=["3-tokens", "1-token"])
def test_gather_refuses_a_shard_of_odd_length_by_name(monkeypatch, tokens_per_rank):
    # a rank holds two equal chunks: an odd shard is no context_parallel_shard, and splitting it in halves would drop
    # a token of every rank (3 tokens a rank on 2 ranks gave back 4 of the 6)
    shards = [torch.arange(tokens_per_rank)[None, :, None] + 10 * rank for rank in range(2)]
    monkeypatch.setattr(distributed.dist, "all_gather", lambda out, local, group=None: [
        o.copy_(s) for o, s in zip(out, shards)])
    with pytest.raises(ValueError, match="local"):
        distributed.gather_context_parallel(shards[0], 2)
