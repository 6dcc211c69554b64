"""ropekit.examples.RopeAttention as a specification: prefill, cached decode, packed varlen, gradients, compile and
CUDA-graph capture — RoPE outputs against ropekit.reference, the layer against its float64 twin."""

import pytest
import torch

from ropekit import reference as ref
from ropekit.examples import KVCache, RopeAttention, reference_forward, varlen_attention_mask
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE, gpu_only

# A float32 layer (matmuls, softmax) vs its float64 twin: relative norm error. RoPE itself meets the tighter
# bound of ropekit.testing.
LAYER_RTOL = 1e-4


def relative_error(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm())


def make_block(**kwargs):
    return RopeAttention(64, 4, 2, max_positions=32, device=DEVICE, **kwargs)


BLOCKS = {
    "neox": {},
    "gptj-partial": dict(interleaved=True, rotary_dim=8),
    "llama3-scaling": dict(base=500000.0, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
}


@pytest.mark.parametrize("variant", list(BLOCKS))
def test_forward_matches_float64_layer(variant):
    block = make_block(**BLOCKS[variant])
    x = torch.randn(2, 6, 64, device=DEVICE)
    with torch.no_grad():
        out = block(x)
    assert relative_error(out, reference_forward(block, x, ref.token_positions(2, 6))) <= LAYER_RTOL


@pytest.mark.parametrize("variant", ["neox", "gptj-partial"])
def test_token_by_token_decode_equals_one_prefill(variant):
    """Right-padded prompts of different lengths, then decode: each sequence continues at its own length."""
    block = make_block(**BLOCKS[variant])
    prompts, steps = torch.tensor([4, 2, 5], device=DEVICE), 3
    longest = int(prompts.max()) + steps
    x = torch.randn(3, longest, 64, device=DEVICE)
    cache = KVCache(3, 16, 2, 16, device=DEVICE)
    rows = torch.arange(3, device=DEVICE)
    with torch.no_grad():
        full = block(x)
        block.forward_cached(x[:, :int(prompts.max())], cache, n_new=prompts)
        decoded = torch.stack([block.forward_cached(x[rows, cache.lengths][:, None], cache)[:, 0]
                               for _ in range(steps)], dim=1)
        k_projected = block.project(x)[1]
    assert torch.equal(cache.lengths, prompts + steps)
    tokens = prompts[:, None] + torch.arange(steps, device=DEVICE)
    assert relative_error(decoded, full[rows[:, None], tokens]) <= LAYER_RTOL
    rope = dict(rotary_dim=block.rotary.rotary_dim, interleaved=block.rotary.interleaved)
    want_keys = ref.rope(k_projected, ref.token_positions(3, longest), **rope)
    for b, n in enumerate((prompts + steps).tolist()):
        assert_close_to_reference(cache.k[b, :n], want_keys[b, :n])


def test_prefill_chunk_with_batch_equal_to_chunk_length_uses_offsets():
    """batch == chunk length: the cache lengths must still act as per-sequence offsets, not position ids."""
    block = make_block()
    cache = KVCache(3, 16, 2, 16, device=DEVICE)
    cache.lengths.copy_(torch.tensor([0, 5, 9], device=DEVICE))
    x = torch.randn(3, 3, 64, device=DEVICE)
    with torch.no_grad():
        block.forward_cached(x, cache)
        k_projected = block.project(x)[1]
    want = ref.rope(k_projected, ref.token_positions(3, 3, offsets=torch.tensor([0, 5, 9])))
    for b, start in enumerate((0, 5, 9)):
        assert_close_to_reference(cache.k[b, start:start + 3], want[b])


def test_varlen_matches_each_sequence_alone():
    block = make_block()
    cu_seqlens = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    x = torch.randn(9, 64, device=DEVICE)
    with torch.no_grad():
        packed = block.forward_varlen(x, cu_seqlens, max_seqlen=5)
        alone = torch.cat([block(x[s:e][None])[0] for s, e in ((0, 3), (3, 4), (4, 9))])
    assert relative_error(packed, alone) <= LAYER_RTOL


def test_varlen_mask_is_block_diagonal_causal():
    mask = varlen_attention_mask(torch.tensor([0, 2, 5], device=DEVICE), 5).cpu()
    want = torch.zeros(5, 5, dtype=torch.bool)
    want[:2, :2] = torch.ones(2, 2, dtype=torch.bool).tril()
    want[2:, 2:] = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(mask, want)


def test_gradients_match_float64_layer():
    block = make_block(**BLOCKS["gptj-partial"])
    x, target = torch.randn(2, 5, 64, device=DEVICE), torch.randn(2, 5, 64, device=DEVICE)
    (block(x) - target).square().mean().backward()
    weights = {n: p.detach().double().cpu().requires_grad_() for n, p in block.named_parameters()}
    out64 = reference_forward(block, x, ref.token_positions(2, 5), weights=weights)
    (out64 - target.double().cpu()).square().mean().backward()
    for name, p in block.named_parameters():
        assert relative_error(p.grad, weights[name].grad) <= LAYER_RTOL, name


def test_backward_through_a_cached_prefill():
    """Training through the cache: the positions RoPE saved for backward are not the ones `lengths +=` changes."""
    block = make_block()
    cache = KVCache(2, 16, 2, 16, device=DEVICE)
    x = torch.randn(2, 4, 64, device=DEVICE)
    block.forward_cached(x, cache).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad()
    block(x).square().sum().backward()
    for name, p in block.named_parameters():
        assert relative_error(grads[name], p.grad) <= 1e-5, name


def test_compiled_decode_has_no_graph_break_and_matches_eager():
    block = make_block()
    cache = KVCache(2, 16, 2, 16, device=DEVICE)
    cache.lengths.copy_(torch.tensor([3, 7], device=DEVICE))
    x = torch.randn(2, 1, 64, device=DEVICE)
    with torch.no_grad():
        explanation = torch._dynamo.explain(block.forward_cached)(x, cache.clone())
        assert explanation.graph_break_count == 0
        compiled = torch.compile(block.forward_cached, fullgraph=True,
                                 backend="aot_eager" if DEVICE == "cpu" else "inductor")
        eager_cache, compiled_cache = cache.clone(), cache.clone()
        for call in range(2):  # the second call, at new positions, must reuse the graph
            want = block.forward_cached(x, eager_cache)
            with torch._dynamo.config.patch(error_on_recompile=call > 0):
                got = compiled(x, compiled_cache)
            assert torch.equal(compiled_cache.lengths, eager_cache.lengths)
            assert relative_error(got, want) <= 1e-5


@gpu_only
def test_decode_step_replays_in_a_cuda_graph_with_new_positions():
    block = RopeAttention(512, 8, 2, max_positions=256, device="cuda")
    cache = KVCache(16, 256, 2, 64, device="cuda")
    cache.k.normal_()
    cache.v.normal_()
    x = torch.randn(16, 1, 512, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                block.forward_cached(x, cache.clone())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = block.forward_cached(x, cache)
        for _ in range(3):
            lengths = torch.randint(0, 250, (16,), device="cuda")
            cache.lengths.copy_(lengths)
            x.normal_()
            before = cache.clone()
            graph.replay()
            want = block.forward_cached(x, before)
            torch.cuda.synchronize()
            assert torch.equal(cache.lengths, lengths + 1)
            assert relative_error(out, want) <= 1e-5
            new_keys = cache.k[torch.arange(16, device="cuda"), lengths][:, None]
            assert_close_to_reference(new_keys, ref.rope(block.project(x)[1],
                                                         ref.token_positions(16, 1, offsets=lengths.cpu())))
