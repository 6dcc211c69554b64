"""ropekit.RotaryEmbedding: its table grows from host-known lengths, and scaling rules follow transformers'."""

import math

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE
from rope_cases import make


def test_rotary_embedding_module_grows_its_table():
    rope = ropekit.RotaryEmbedding(32, base=500000.0, max_positions=8, device=DEVICE)
    q, k = make("bshd", 1, 6, 2, 32, torch.float32), make("bshd", 1, 6, 1, 32, torch.float32)
    out_q, out_k = rope(q, k, positions=20)  # needs rows up to 25: the table grows (host-known)
    assert len(rope.table) >= 26
    pos = ref.token_positions(1, 6, offsets=20)
    assert_close_to_reference(out_q, ref.rope(q, pos, base=500000.0))
    assert_close_to_reference(out_k, ref.rope(k, pos, base=500000.0))


def test_rotary_embedding_grows_for_a_long_sequence_given_position_ids():
    # Position ids live on the device and are never read by the host, but the sequence length is host-known: a
    # prefill of n tokens with ids 0..n-1 (transformers' call) reaches row n - 1, so the table grows to n rows first
    rope = ropekit.RotaryEmbedding(32, base=1e6, max_positions=8, device=DEVICE)
    q = make("bshd", 1, 40, 2, 32, torch.float32)
    ids = torch.arange(40, device=DEVICE)[None]
    out_q, _ = rope(q, positions=ids)
    assert len(rope.table) >= 40
    assert_close_to_reference(out_q, ref.rope(q, ids.cpu(), base=1e6))
    packed = torch.randn(12, 2, 32, device=DEVICE)  # varlen: the longest sequence counts
    cu = torch.tensor([0, 3, 12], device=DEVICE)
    out, _ = ropekit.RotaryEmbedding(32, max_positions=4, device=DEVICE)(
        packed, positions=torch.tensor([0, 0], device=DEVICE), layout="thd", cu_seqlens=cu, max_seqlen=9)
    assert_close_to_reference(out, ref.rope(packed, ref.varlen_positions(cu.cpu())))


def test_rotary_embedding_with_llama3_scaling_matches_reference():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    rope = ropekit.RotaryEmbedding(32, base=500000.0, scaling=scaling, max_positions=128, device=DEVICE)
    inv_freq, attention = ropekit.rope_init(dict(scaling, rope_theta=500000.0), 32)
    q = make("bshd", 1, 5, 2, 32, torch.float32)
    out_q, _ = rope(q, positions=100)
    pos = ref.token_positions(1, 5, offsets=100)
    assert_close_to_reference(out_q, ref.rope(q, pos, inv_freq=inv_freq, attention_scaling=attention))


def test_rotary_embedding_takes_rotary_dim_and_pairing_from_the_config_dict():
    params = ropekit.rope_parameters_from_config({"model_type": "glm", "head_dim": 32, "partial_rotary_factor": 0.5,
                                                  "rope_theta": 500000.0})
    rope = ropekit.RotaryEmbedding(params["head_dim"], scaling=params, max_positions=16, device=DEVICE)
    assert rope.rotary_dim == 16 and rope.interleaved
    q = make("bshd", 1, 5, 2, 32, torch.float32)
    out_q, _ = rope(q, positions=3)
    want = ref.rope(q, ref.token_positions(1, 5, offsets=3), base=500000.0, rotary_dim=16, interleaved=True)
    assert_close_to_reference(out_q, want)
    # explicit arguments still win over the dict
    assert not ropekit.RotaryEmbedding(32, scaling=params, interleaved=False, rotary_dim=32).interleaved


def test_rotary_embedding_context_length_comes_from_the_config_not_the_table():
    # Phi-3 style longrope without a factor: the attention factor follows max_position_embeddings / original
    half = 8
    scaling = {"rope_type": "longrope", "short_factor": [1.0] * half, "long_factor": [4.0] * half,
               "original_max_position_embeddings": 64, "max_position_embeddings": 1024}
    rope = ropekit.RotaryEmbedding(16, scaling=scaling, max_positions=32, device=DEVICE)
    _, attention = ropekit.rope_init(scaling, 16)
    assert rope.table.attention_scaling == pytest.approx(attention) and attention == pytest.approx(
        math.sqrt(1 + math.log(1024 / 64) / math.log(64)))


@pytest.mark.parametrize("how", ["host-offset", "tensor-offsets", "seq_len-hint"])
def test_rotary_embedding_dynamic_and_longrope_follow_the_sequence_length(how):
    # transformers recomputes these frequencies from max(position_ids) + 1 every forward; so does the module
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
                "original_max_position_embeddings": 16, "max_position_embeddings": 64}
    for scaling in (dynamic, longrope):
        rope = ropekit.RotaryEmbedding(16, scaling=scaling, max_positions=8, device=DEVICE)
        q = make("bshd", 2, 1, 2, 16, torch.float32)
        # within, past, and back within the trained length: original, stretched (for 41 positions), original
        for last, stretched_for in ((5, None), (40, 41), (9, None)):
            if how == "host-offset":
                out_q, _ = rope(q, positions=last)
            elif how == "tensor-offsets":
                out_q, _ = rope(q, positions=torch.tensor([last - 3, last], device=DEVICE))
            else:
                out_q, _ = rope(q, positions=torch.tensor([last - 3, last], device=DEVICE), seq_len=last + 1)
            inv_freq, attention = ropekit.rope_init(scaling, 16, seq_len=stretched_for)
            offsets = last if how == "host-offset" else torch.tensor([last - 3, last])
            want = ref.rope(q, ref.token_positions(2, 1, offsets=offsets), inv_freq=inv_freq,
                            attention_scaling=attention)
            assert_close_to_reference(out_q, want)
            assert len(rope.table) > last  # grown from the length it read (or was told)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_packed_sequences_reach_their_own_offset_plus_their_own_length(rope_type):
    """thd with per-sequence offsets: the call's longest reach is each sequence's offset plus its own length (20 + 2
    here, within the trained 25), not the largest offset plus the longest sequence (20 + 10): the frequencies stay
    the original ones, as transformers' module keeps them for these positions."""
    scaling = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 25} if rope_type == "dynamic" else \
        {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
         "original_max_position_embeddings": 25, "max_position_embeddings": 100}
    rope = ropekit.RotaryEmbedding(16, scaling=scaling, max_positions=64, device=DEVICE)
    cu = torch.tensor([0, 2, 12], device=DEVICE)  # two sequences: 2 tokens at 20, 21 and 10 tokens at 0..9
    q = torch.randn(12, 2, 16, device=DEVICE)
    out_q, _ = rope(q, positions=torch.tensor([20, 0], device=DEVICE), layout="thd", cu_seqlens=cu, max_seqlen=10)
    positions = torch.cat((torch.arange(20, 22), torch.arange(10)))
    inv_freq, attention = ropekit.rope_init(scaling, 16)
    want = ref.rope(q[None], positions[None], inv_freq=inv_freq, attention_scaling=attention)[0]
    assert_close_to_reference(out_q, want)


def _tiny_model():
    """A transformers-style block: a weight that FSDP2 shards, and the rotary module beside it."""
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(32, 32, bias=False)
    model.rope = ropekit.RotaryEmbedding(32, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                                         base=500000.0, max_positions=64)
    return model


@pytest.fixture
def one_rank_group():
    import socket

    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "cpu:gloo,cuda:nccl" if DEVICE == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("how", ["built-under-meta", "moved-to-meta"])
def test_rotary_embedding_survives_deferred_init_bit_for_bit(how):
    # transformers' and torchtitan's deferred init: build on meta, then to_empty() onto the real device. The table
    # is no buffer (it holds no state of its own): it is built from the frequencies when the module leaves meta.
    if how == "built-under-meta":
        with torch.device("meta"):
            model = _tiny_model()
    else:
        model = _tiny_model().to("meta")
    assert model.rope.table.cos.is_meta
    model.to_empty(device=DEVICE)
    want = _tiny_model().to(DEVICE)
    assert torch.equal(model.rope.table.cos, want.rope.table.cos)
    assert torch.equal(model.rope.table.sin, want.rope.table.sin)
    q = make("bshd", 1, 5, 2, 32, torch.float32)
    assert torch.equal(model.rope(q, positions=40)[0], want.rope(q, positions=40)[0])


def test_rotary_embedding_survives_fsdp2_deferred_init(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = _tiny_model()
    fully_shard(model, mesh=init_device_mesh(DEVICE, (1,)))
    model.to_empty(device=DEVICE)
    model.proj.reset_parameters()
    want = _tiny_model().to(DEVICE)
    q = make("bshd", 2, 6, 2, 32, torch.float32)
    ids = torch.arange(6, device=DEVICE)[None] + 30
    assert torch.equal(model.rope(q, positions=ids)[0], want.rope(q, positions=ids)[0])
    assert len(model.rope.table) == len(want.rope.table)
