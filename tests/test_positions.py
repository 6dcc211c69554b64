"""ropekit.positions: the user's positions become one PositionSpec, and context-parallel shards match the full
sequence."""

import pytest
import torch

import ropekit
from conftest import DEVICE
from rope_cases import make, table


@pytest.mark.parametrize("cp_size", [2, 4])
def test_context_parallel_ranks_match_full_sequence(cp_size):
    seqlen = 16
    cos, sin = table()
    q = make("bshd", 2, seqlen, 2, 32, torch.float32)
    full, _ = ropekit.apply_rope(q, None, cos, sin)
    for rank in range(cp_size):
        shard = ropekit.context_parallel_shard(q, cp_size, rank, seq_dim=1)
        positions = ropekit.context_parallel_positions(seqlen, cp_size, rank, device=DEVICE)
        got, _ = ropekit.apply_rope(shard, None, cos, sin, positions=positions)
        torch.testing.assert_close(got, ropekit.context_parallel_shard(full, cp_size, rank, seq_dim=1),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("cp_size", [1, 2])
def test_context_parallel_packed_batch_matches_the_full_sequences(cp_size):
    # Transformer Engine's thd split: every sequence of the packed batch cut into 2 * cp_size chunks, rank r keeping
    # chunks r and 2 cp_size - 1 - r of each; cu_seqlens // cp_size are the rank's own sequence boundaries
    lengths = [8, 4, 12]
    cu = torch.tensor([0, 8, 12, 24], device=DEVICE)
    cos, sin = table()
    q = torch.randn(24, 2, 32, device=DEVICE)
    k = torch.randn(24, 1, 32, device=DEVICE)
    full_q, full_k = ropekit.apply_rope(q, k, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=12)
    for rank in range(cp_size):
        positions = ropekit.context_parallel_varlen_positions(cu, cp_size, rank)
        local_cu = cu // cp_size

        def shard(x):
            return torch.cat([ropekit.context_parallel_shard(x[int(a):int(b)], cp_size, rank, seq_dim=0)
                              for a, b in zip(cu[:-1], cu[1:])])
        got_q, got_k = ropekit.apply_rope(shard(q), shard(k), cos, sin, layout="thd", cu_seqlens=local_cu,
                                          max_seqlen=max(lengths) // cp_size, positions=positions)
        torch.testing.assert_close(got_q, shard(full_q), rtol=0, atol=0)
        torch.testing.assert_close(got_k, shard(full_k), rtol=0, atol=0)


@pytest.mark.parametrize("cu_seqlens,error", [
    ([0, 8, 5, 12], ValueError),          # decreasing: a length of -3
    ([0, 8, 4, 12], ValueError),          # a length of -4, divisible by 2 * cp_size, is no sequence either
    ([0, 8, 14], ValueError),             # 6 tokens do not split into 2 * cp_size = 4 chunks
    ([0.0, 8.0], TypeError),
], ids=["decreasing", "negative-length-divisible", "length-not-divisible", "float"])
def test_context_parallel_varlen_positions_refuses_cu_seqlens_by_name(cu_seqlens, error):
    cu = torch.tensor(cu_seqlens, device=DEVICE)
    with pytest.raises(error, match="cu_seqlens"):
        ropekit.context_parallel_varlen_positions(cu, 2, 0)


def test_each_form_of_positions_becomes_one_spec():
    from ropekit.positions import POSITION_IDS, SCALAR_OFFSET, SEQ_OFFSETS, resolve_positions

    offsets = torch.tensor([3, 9], device=DEVICE)
    assert resolve_positions(batch=2, seqlen=4).mode == SCALAR_OFFSET
    spec = resolve_positions(batch=2, seqlen=4, positions=5)
    assert (spec.mode, spec.offset, spec.tensor, spec.is_varlen) == (SCALAR_OFFSET, 5, None, False)
    assert resolve_positions(batch=2, seqlen=4, positions=offsets).tensor is offsets
    assert resolve_positions(batch=2, seqlen=4, positions=offsets[:, None]).mode == SEQ_OFFSETS
    ids = resolve_positions(batch=2, seqlen=4, positions=torch.arange(4, device=DEVICE))
    assert ids.mode == POSITION_IDS and ids.tensor.shape == (2, 4) and ids.tensor.stride() == (0, 1)  # a view
    cu = torch.tensor([0, 3, 4], device=DEVICE)
    packed = resolve_positions(batch=2, seqlen=4, positions=offsets, cu_seqlens=cu, max_seqlen=3)
    assert packed.mode == SEQ_OFFSETS and packed.is_varlen and packed.max_seqlen == 3
    with pytest.raises(ValueError, match="ambiguous"):
        resolve_positions(batch=3, seqlen=3, positions=torch.arange(3, device=DEVICE), cu_seqlens=cu, max_seqlen=2)
    with pytest.raises(TypeError, match="positions"):
        resolve_positions(batch=2, seqlen=4, positions=1.5)
