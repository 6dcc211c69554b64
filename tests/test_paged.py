"""ropekit.paged: the block allocator, slot_mapping, gather and the reference paged attention (against dense attention
in float64)."""

import pytest
import torch

from conftest import DEVICE
from ropekit.paged import BlockAllocator, gather, paged_attention, slot_mapping


def test_allocator_hands_out_distinct_shuffled_blocks_and_tracks_lengths():
    blocks = BlockAllocator(num_blocks=12, block_size=4, n_seqs=2, seed=3)
    assert blocks.append(0, 6) == list(range(6))
    assert blocks.append(1, 9) == list(range(9))
    assert blocks.append(0, 3) == [6, 7, 8]
    tables = blocks.block_tables()
    used = [b for row in blocks.tables for b in row]
    assert len(used) == len(set(used)) == 3 + 3
    assert tables.shape == (2, 3) and blocks.lengths().tolist() == [9, 9]
    assert used != sorted(used), "a shuffled free list: the blocks of a sequence are not simply 0, 1, 2"
    with pytest.raises(RuntimeError, match="out of cache blocks"):
        blocks.append(1, 100)


def test_slot_mapping_is_block_times_size_plus_row_and_minus_one_for_padding():
    tables = torch.tensor([[5, 2, -1], [0, 7, 3]])
    seq_ids = torch.tensor([0, 0, 1, 1, -1, 0])
    positions = torch.tensor([1, 4, 3, 9, 0, 8])
    slots = slot_mapping(tables, seq_ids, positions, block_size=4)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [5 * 4 + 1, 2 * 4 + 0, 0 * 4 + 3, 3 * 4 + 1, -1, -1]  # position 8 has no block: -1


def test_gather_reads_a_sequence_back_and_dequantises_float8():
    cache = torch.randn(6, 4, 2, 8)
    table = torch.tensor([4, 1, 3])
    rows = gather(cache, table, 10)
    assert torch.equal(rows, torch.cat([cache[4], cache[1], cache[3][:2]]))
    scale = torch.tensor([0.5])
    fp8 = (cache / scale).to(torch.float8_e4m3fn)
    assert torch.equal(gather(fp8, table, 10, scale), torch.cat([fp8[4], fp8[1], fp8[3][:2]]).float() * 0.5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_paged_attention_matches_dense_causal_attention(dtype):
    """A prefill chunk of one sequence and a decode token of another, over shuffled blocks, against dense GQA
    attention in float64 on the unpaged tokens."""
    heads_q, heads_kv, dim, block = 4, 2, 8, 4
    lens, q_lens = [7, 10], [3, 1]
    blocks = BlockAllocator(num_blocks=8, block_size=block, n_seqs=2, seed=1)
    keys = [torch.randn(n, heads_kv, dim, dtype=torch.float64) for n in lens]
    values = [torch.randn(n, heads_kv, dim, dtype=torch.float64) for n in lens]
    k_cache = torch.zeros(8, block, heads_kv, dim, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    for seq, n in enumerate(lens):
        positions = torch.tensor(blocks.append(seq, n))
        slots = slot_mapping(blocks.block_tables(), torch.full_like(positions, seq), positions, block)
        k_cache.view(-1, heads_kv, dim)[slots.to(DEVICE)] = keys[seq].to(dtype).to(DEVICE)
        v_cache.view(-1, heads_kv, dim)[slots.to(DEVICE)] = values[seq].to(dtype).to(DEVICE)
    q = torch.randn(sum(q_lens), heads_q, dim, dtype=dtype, device=DEVICE)
    out = paged_attention(q, k_cache, v_cache, blocks.block_tables(DEVICE), lens, q_lens)
    start = 0
    for seq, (n, n_q) in enumerate(zip(lens, q_lens)):
        qs = q[start:start + n_q].cpu().double().transpose(0, 1)
        k = keys[seq].to(dtype).double().repeat_interleave(2, 1).transpose(0, 1)
        v = values[seq].to(dtype).double().repeat_interleave(2, 1).transpose(0, 1)
        mask = torch.arange(n)[None, :] <= torch.arange(n - n_q, n)[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask).transpose(0, 1)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(out[start:start + n_q].cpu().double(), want, rtol=tol, atol=tol)
        start += n_q
