"""Context parallel across processes (torch.distributed, gloo on the CPU): every rank runs apply_rope, qk_norm_rope and
rope_and_cache on its two chunks (``context_parallel_positions``), writing its own tokens' cache rows; the gathered
outputs, and the ranks' caches put together, equal the single-process ones bit for bit."""

import socket

import pytest
import torch

from ropekit import distributed

CASES = ["apply_rope bshd", "apply_rope thd", "qk_norm_rope bshd", "rope_and_cache paged bshd",
         "rope_and_cache contiguous bshd", "rope_and_cache float8 paged thd qk-norm"]


@pytest.mark.parametrize("world", [2, 3])  # an odd world too: rank 2 of 3 holds the two middle chunks
def test_every_op_across_ranks_equals_one_process_bit_for_bit(world, monkeypatch):
    # the ranks meet through a file: the launcher binds no port (one found free could be taken before it is used)
    monkeypatch.setattr(socket, "socket", None)
    results = distributed.run(world, "gloo")
    assert [r["rank"] for r in results] == list(range(world))
    assert all(case in r for r in results for case in CASES), results
    assert all(distributed.passed(r) for r in results), results


def test_nccl_without_a_gpu_per_rank_is_refused_before_any_process_starts():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("this machine has a GPU for each of 64 ranks")
    with pytest.raises(ValueError, match="needs a GPU per rank"):
        distributed.run(64, "nccl")


def test_passed_needs_every_case():
    assert distributed.passed({"rank": 1, "device": "cpu", "a": True, "b": True})
    assert not distributed.passed({"rank": 0, "device": "cpu", "a": True, "b": False})


def fake_all_gather(monkeypatch, copies):
    """all_gather without processes: every rank's tensor is the given one."""
    monkeypatch.setattr(distributed.dist, "all_gather", lambda out, local, group=None: [
        o.copy_(c.contiguous().view(torch.uint8).reshape(o.shape) if o.dtype == torch.uint8 else c)
        for o, c in zip(out, copies)])


def test_gather_puts_chunks_back_in_sequence_order(monkeypatch):
    full = torch.arange(8)[None, :, None]
    shards = [distributed.context_parallel_shard(full, 2, r) for r in range(2)]
    fake_all_gather(monkeypatch, shards)
    assert torch.equal(distributed.gather_context_parallel(shards[0], 2), full)


def ranks_write(fill, shards):
    """Each rank's copy of ``fill`` with its own tokens' rows set to those tokens' values (``shards[rank]``: the
    rank's (rows, values))."""
    copies = []
    for own, vals in shards:
        copy = fill.clone()
        flat = copy.view(-1, *copy.shape[2:])
        keep = own >= 0
        flat[own[keep]] = vals[keep]
        copies.append(copy)
    return copies


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "float8"])
@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_gather_cache_puts_each_ranks_own_rows_together(monkeypatch, layout, dtype):
    # 2 ranks, a paged cache of 6 blocks x 2 rows; 8 tokens, one of them padding (-1), scattered over the slots
    fill = torch.randn(6, 2, 1, 4).to(dtype)
    token_rows = torch.tensor([5, 0, 11, -1, 7, 2, 9, 3])
    values = torch.randn(8, 1, 4).to(dtype)
    if layout == "bshd":
        token_rows, values = token_rows.view(2, 4), values.view(2, 4, 1, 4)
        cu, shard = None, lambda x, r: distributed.context_parallel_shard(x, 2, r).reshape(-1, *x.shape[2:])
    else:  # one packed sequence of 8 tokens: rank r holds chunks r and 3 - r, 2 tokens each
        cu, shard = [0, 8], lambda x, r: distributed.context_parallel_shard(x, 2, r, seq_dim=0)
    want = fill.clone()
    want.view(-1, 1, 4)[token_rows.reshape(-1)[token_rows.reshape(-1) >= 0]] = \
        values.reshape(-1, 1, 4)[token_rows.reshape(-1) >= 0]
    copies = ranks_write(fill, [(shard(token_rows, r), shard(values, r)) for r in range(2)])
    fake_all_gather(monkeypatch, copies)
    got = distributed.gather_cache(copies[0], fill, token_rows, 2, cu_seqlens=cu)
    assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_gather_cache_refuses_a_rank_that_wrote_another_ranks_row(monkeypatch):
    fill = torch.zeros(4, 1, 1, 2)
    token_rows = torch.tensor([[0, 1, 2, 3]])  # rank 0 owns rows 0 and 3, rank 1 rows 1 and 2
    copies = [fill.clone(), fill.clone()]
    copies[0].view(4, 1, 2)[[0, 3]] = 1.0
    copies[1].view(4, 1, 2)[[1, 2, 3]] = 2.0  # row 3 is rank 0's
    fake_all_gather(monkeypatch, copies)
    with pytest.raises(ValueError, match="rank 1 changed 1 cache rows"):
        distributed.gather_cache(copies[0], fill, token_rows, 2)


@pytest.mark.parametrize("tokens_per_rank", [3, 1], ids=["3-tokens", "1-token"])
def test_gather_refuses_a_shard_of_odd_length_by_name(monkeypatch, tokens_per_rank):
    # a rank holds two equal chunks: an odd shard is no context_parallel_shard, and splitting it in halves would drop
    # a token of every rank (3 tokens a rank on 2 ranks gave back 4 of the 6)
    shards = [torch.arange(tokens_per_rank)[None, :, None] + 10 * rank for rank in range(2)]
    monkeypatch.setattr(distributed.dist, "all_gather", lambda out, local, group=None: [
        o.copy_(s) for o, s in zip(out, shards)])
    with pytest.raises(ValueError, match="local"):
        distributed.gather_context_parallel(shards[0], 2)
