"""The serving engines' in-place signature (vLLM ``rotary_embedding``, FlashInfer
``apply_rope_with_cos_sin_cache_inplace``), checked against a reference written from those projects' documented
semantics: ``cos_sin_cache[pos]`` is ``[cos | sin]`` over ``rotary_dim``; NeoX pairs ``(i, i + rotary_dim/2)``,
GPT-J pairs ``(2i, 2i + 1)``; the channels past ``rotary_dim`` are untouched; query/key rotated in place."""

import pytest
import torch

import ropekit
from ropekit.testing import assert_close_to_reference
from capture import cuda_graph_of, decode_page_table
from conftest import DEVICE, gpu_only


def engine_reference(positions, x, head_size, cos_sin_cache, is_neox):
    """float64, token by token: what the engines' documentation says the op computes."""
    x = x.detach().to(torch.float64).cpu().reshape(positions.numel(), -1, head_size)
    cache = cos_sin_cache.detach().to(torch.float64).cpu()
    rotary_dim = cache.shape[1]
    half = rotary_dim // 2
    cos = cache[positions.flatten().cpu(), :half][:, None, :]
    sin = cache[positions.flatten().cpu(), half:][:, None, :]
    rot = x[..., :rotary_dim]
    if is_neox:
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def cache_like_vllm(max_position, rotary_dim, dtype, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype).to(DEVICE)


@pytest.mark.parametrize("fn", [ropekit.rotary_embedding, ropekit.apply_rope_with_cos_sin_cache_inplace],
                         ids=["vllm", "flashinfer"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("form", ["flat", "heads", "packed-qkv"])
@pytest.mark.parametrize("rotary_dim,cache_dtype", [(32, torch.float32), (16, torch.bfloat16)],
                         ids=["full-fp32cache", "partial-bf16cache"])
def test_matches_the_engines_contract(fn, is_neox, form, rotary_dim, cache_dtype):
    tokens, hq, hk, head_size = 7, 4, 2, 32
    cache = cache_like_vllm(64, rotary_dim, cache_dtype)
    positions = torch.randint(0, 64, (tokens,), device=DEVICE)
    dtype = torch.bfloat16
    if form == "packed-qkv":
        qkv = torch.randn(tokens, (hq + 2 * hk) * head_size, device=DEVICE).to(dtype)
        query, key = qkv[:, :hq * head_size], qkv[:, hq * head_size:(hq + hk) * head_size]
        v_before = qkv[:, (hq + hk) * head_size:].clone()
    else:
        query = torch.randn(tokens, hq * head_size, device=DEVICE).to(dtype)
        key = torch.randn(tokens, hk * head_size, device=DEVICE).to(dtype)
        if form == "heads":
            query, key = query.view(tokens, hq, head_size), key.view(tokens, hk, head_size)
    want_q = engine_reference(positions, query, head_size, cache, is_neox)
    want_k = engine_reference(positions, key, head_size, cache, is_neox)
    assert fn(positions, query, key, head_size, cache, is_neox) is None
    assert_close_to_reference(query.reshape(tokens, hq, head_size), want_q)
    assert_close_to_reference(key.reshape(tokens, hk, head_size), want_k)
    if form == "packed-qkv":
        assert torch.equal(qkv[:, (hq + hk) * head_size:], v_before)


def test_key_may_be_none_and_positions_may_be_int32():
    cache = cache_like_vllm(32, 16, torch.float32)
    positions = torch.tensor([3, 0, 31], dtype=torch.int32, device=DEVICE)
    query = torch.randn(3, 2 * 16, device=DEVICE)
    want = engine_reference(positions, query, 16, cache, True)
    ropekit.rotary_embedding(positions, query, None, 16, cache, True)
    assert_close_to_reference(query.view(3, 2, 16), want)


def test_batch_seq_positions():
    cache = cache_like_vllm(32, 16, torch.float32)
    positions = torch.randint(0, 32, (2, 3), device=DEVICE)
    query = torch.randn(2, 3, 2 * 16, device=DEVICE)
    want = engine_reference(positions, query, 16, cache, False)
    ropekit.rotary_embedding(positions, query, None, 16, cache, False)
    assert_close_to_reference(query.reshape(6, 2, 16), want)


@pytest.mark.parametrize("bad, words", [
    (dict(head_size=0), "head_size"),
    (dict(positions="float"), "positions"),
    (dict(query_cols=30), "query"),
    (dict(cache_cols=48), "rotary_dim"),
    (dict(cache_cols=15), "cos_sin_cache"),
])
def test_errors_name_the_argument_and_write_nothing(bad, words):
    head_size = bad.get("head_size", 16)
    cache = cache_like_vllm(32, bad.get("cache_cols", 16) + (bad.get("cache_cols", 16) % 2), torch.float32)
    if bad.get("cache_cols") == 15:
        cache = cache[:, :15]
    positions = torch.arange(3, device=DEVICE)
    if bad.get("positions") == "float":
        positions = positions.float()
    query = torch.randn(3, bad.get("query_cols", 32), device=DEVICE)
    before = query.clone()
    with pytest.raises((TypeError, ValueError), match=words):
        ropekit.rotary_embedding(positions, query, None, head_size, cache, True)
    assert torch.equal(query, before)


def test_errors_raised_by_the_rotation_say_which_engine_argument_they_mean():
    cache = cache_like_vllm(8, 16, torch.float32)
    query = torch.randn(3, 16, device=DEVICE).as_strided((3, 16), (0, 1))  # every token the same memory
    with pytest.raises(RuntimeError, match="q is query"):
        ropekit.rotary_embedding(torch.arange(3, device=DEVICE), query, None, 16, cache, True)


@pytest.mark.parametrize("fn", [ropekit.rotary_embedding, ropekit.apply_rope_with_cos_sin_cache_inplace])
def test_the_engine_call_compiles_without_a_graph_break(fn):
    """Engines compile their models with fullgraph=True: the in-place call with a key must trace."""
    torch._dynamo.reset()
    cache = cache_like_vllm(64, 32, torch.float32).to(DEVICE)
    qkv = torch.randn(5, (4 + 2 * 2) * 32, device=DEVICE)
    positions = torch.tensor([3, 0, 17, 63, 9], device=DEVICE)

    def step(positions, qkv):
        query, key = qkv[:, :4 * 32], qkv[:, 4 * 32:6 * 32]
        fn(positions, query, key, 32, cache, True)
        return qkv

    want = qkv.clone()
    fn(positions, want[:, :4 * 32], want[:, 4 * 32:6 * 32], 32, cache, True)
    got = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")(positions,
                                                                                                     qkv.clone())
    torch.testing.assert_close(got, want)


def test_head_size_may_be_a_numpy_integer():
    np = pytest.importorskip("numpy")
    cache = cache_like_vllm(16, 8, torch.float32).to(DEVICE)
    positions = torch.tensor([3, 0], device=DEVICE)
    query = torch.randn(2, 2 * 8, device=DEVICE)
    want = query.clone()
    ropekit.rotary_embedding(positions, want, None, 8, cache, True)
    ropekit.rotary_embedding(positions, query, None, np.int64(8), cache, True)
    assert torch.equal(query, want)
    with pytest.raises(TypeError, match="head_size"):
        ropekit.rotary_embedding(positions, query, None, 8.0, cache, True)


# --- SGLang's fused KV-buffer write ------------------------------------------------------------------------------

def _sglang_call(pool_dims=2, hq=4, hk=2, d=16, tokens=6, slots=24):
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=DEVICE)
    query, key, value = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d], qkv[:, (hq + hk) * d:]
    shape = (slots, hk * d) if pool_dims == 2 else (slots, hk, d)
    k_buffer, v_buffer = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
    cache_loc = torch.tensor([5, 0, -1, 23, 11, 7], device=DEVICE)[:tokens]
    positions = torch.tensor([3, 0, 17, 63, 9, 40], device=DEVICE)[:tokens]
    return positions, query, key, value, k_buffer, v_buffer, cache_loc, cache_like_vllm(64, d, torch.float32).to(DEVICE)


@pytest.mark.parametrize("pool_dims", [2, 3])
@pytest.mark.parametrize("is_neox", [True, False])
def test_sglang_fused_kv_buffer_write_rotates_and_caches_in_one_call(pool_dims, is_neox):
    """query and key rotated in place as without the argument (the fused kernel's float32 results may differ from the
    single op's in the last place: the GPU compiler contracts a multiply-add differently in the two kernels);
    k_buffer[cache_loc] the key this call rotated and v_buffer[cache_loc] the value, bit for bit; -1 writes nothing;
    every other slot unchanged."""
    positions, query, key, value, k_buffer, v_buffer, cache_loc, cache = _sglang_call(pool_dims)
    want_q, want_k = query.clone(), key.clone()
    ropekit.rotary_embedding(positions, want_q, want_k, 16, cache, is_neox)
    k_before, v_before = k_buffer.clone(), v_buffer.clone()
    arg = ropekit.engines.FusedSetKVBufferArg(value=value, k_buffer=k_buffer, v_buffer=v_buffer, cache_loc=cache_loc)
    ropekit.apply_rope_with_cos_sin_cache_inplace(positions, query, key, 16, cache, is_neox,
                                                  fused_set_kv_buffer_arg=arg, enable_pdl=True)
    torch.testing.assert_close(query, want_q, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(key, want_k, rtol=2e-6, atol=2e-6)
    written = cache_loc.cpu() >= 0
    rows = cache_loc[cache_loc >= 0]
    assert torch.equal(k_buffer.reshape(24, -1)[rows], key[written.to(DEVICE)])
    assert torch.equal(v_buffer.reshape(24, -1)[rows], value[written.to(DEVICE)])
    others = torch.ones(24, dtype=torch.bool)
    others[rows.cpu()] = False
    assert torch.equal(k_buffer.reshape(24, -1).cpu()[others], k_before.reshape(24, -1).cpu()[others])
    assert torch.equal(v_buffer.reshape(24, -1).cpu()[others], v_before.reshape(24, -1).cpu()[others])


@pytest.mark.parametrize("change, error, words", [
    (dict(k_scale=0.5), ValueError, "k_scale"),
    (dict(k_scale=torch.ones(1)), ValueError, "k_scale"),
    (dict(cache_loc="int32"), TypeError, "cache_loc"),
    (dict(k_buffer="ragged"), ValueError, "k_buffer"),
    (dict(key=None), ValueError, "key"),
])
def test_sglang_argument_errors_name_the_field_and_write_nothing(change, error, words):
    positions, query, key, value, k_buffer, v_buffer, cache_loc, cache = _sglang_call()
    fields = dict(value=value, k_buffer=k_buffer, v_buffer=v_buffer, cache_loc=cache_loc)
    if "cache_loc" in change:
        fields["cache_loc"] = cache_loc.int()
    if "k_buffer" in change:
        fields["k_buffer"] = torch.randn(24, 2 * 16 + 3, device=DEVICE)
    if "key" in change:
        key = None
    scale = change.get("k_scale")
    arg = ropekit.engines.FusedSetKVBufferArg(**fields, k_scale=scale.to(DEVICE) if torch.is_tensor(scale) else scale)
    before = [t.clone() for t in (query, value, fields["k_buffer"], v_buffer)]
    with pytest.raises(error, match=words):
        ropekit.apply_rope_with_cos_sin_cache_inplace(positions, query, key, 16, cache, True,
                                                      fused_set_kv_buffer_arg=arg)
    for t, b in zip((query, value, fields["k_buffer"], v_buffer), before):
        assert torch.equal(t, b)


# --- vLLM's rope_dim_offset and inverse ----------------------------------------------------------------------------

@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_dim_offset_rotates_a_window_of_each_head_and_inverse_undoes_it(is_neox):
    """vLLM rotates channels [rope_dim_offset, rope_dim_offset + rotary_dim) (head_size - rotary_dim: the last ones);
    inverse=True turns by -θ."""
    head_size, rotary_dim, offset = 32, 16, 12
    cache = cache_like_vllm(64, rotary_dim, torch.float32).to(DEVICE)
    positions = torch.tensor([3, 0, 40, 63], device=DEVICE)
    query, key = torch.randn(4, 2 * head_size, device=DEVICE), torch.randn(4, head_size, device=DEVICE)
    q0, k0 = query.clone(), key.clone()
    ropekit.rotary_embedding(positions, query, key, head_size, cache, is_neox, rope_dim_offset=offset)
    for got, before, heads in ((query, q0, 2), (key, k0, 1)):
        window = before.view(4, heads, head_size)[..., offset:offset + rotary_dim].reshape(4, -1)
        want = engine_reference(positions, window, rotary_dim, cache, is_neox).view(4, heads, rotary_dim)
        got3, before3 = got.view(4, heads, head_size), before.view(4, heads, head_size)
        assert_close_to_reference(got3[..., offset:offset + rotary_dim], want)
        assert torch.equal(got3[..., :offset], before3[..., :offset])
        assert torch.equal(got3[..., offset + rotary_dim:], before3[..., offset + rotary_dim:])
    ropekit.rotary_embedding(positions, query, key, head_size, cache, is_neox, rope_dim_offset=offset, inverse=True)
    torch.testing.assert_close(query, q0, rtol=0, atol=1e-5)
    torch.testing.assert_close(key, k0, rtol=0, atol=1e-5)


@pytest.mark.parametrize("offset, error", [(17, ValueError), (-1, ValueError), (1.0, TypeError)])
def test_a_rope_dim_offset_past_the_head_is_refused_before_any_write(offset, error):
    cache = cache_like_vllm(64, 16, torch.float32).to(DEVICE)
    query = torch.randn(2, 32, device=DEVICE)
    before = query.clone()
    with pytest.raises(error, match="rope_dim_offset"):
        ropekit.rotary_embedding(torch.tensor([1, 2], device=DEVICE), query, None, 32, cache, True,
                                 rope_dim_offset=offset)
    assert torch.equal(query, before)


def test_fused_set_kv_buffer_arg_is_keyword_only():
    """SGLang's classes order the fields differently (cache_loc before or after the scales): positions are refused."""
    with pytest.raises(TypeError):
        ropekit.engines.FusedSetKVBufferArg(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1))


# --- FlashInfer's rope_quantize_fp8 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("quantize_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rope_quantize_fp8_reads_back_within_half_a_spacing(quantize_dtype, mla, is_neox, backend):
    """The rotary parts rotated then times their scale as float8 (read back as stored / scale, within half a spacing
    of the float64 truth), the non-rotary parts the float32 product cast, saturating."""
    from ropekit.testing import ulp

    tokens, hq, hk, rope_dim, nope_dim = 5, 4, 1 if mla else 2, 16, 24
    q_rope = torch.randn(tokens, hq, rope_dim, device=DEVICE, dtype=torch.bfloat16)
    k_rope = torch.randn(*((tokens, rope_dim) if mla else (tokens, hk, rope_dim)), device=DEVICE,
                         dtype=torch.bfloat16)
    q_nope = torch.randn(tokens, hq, nope_dim, device=DEVICE, dtype=torch.bfloat16) * 40
    k_nope = None
    cache = cache_like_vllm(32, rope_dim, torch.float32)
    pos_ids = torch.tensor([0, 7, 3, 31, 12], device=DEVICE)
    k_out = torch.zeros(k_rope.shape, device=DEVICE, dtype=quantize_dtype)
    q_out, k_out2, q_nope_out, k_nope_out = ropekit.rope_quantize_fp8(
        q_rope, k_rope, q_nope, k_nope, cache, pos_ids, is_neox, quant_scale_q=4.0, quant_scale_kv=8.0,
        k_rope_out=k_out)
    assert k_out2 is k_out and q_out.dtype == quantize_dtype and k_nope_out.shape == (*k_rope.shape[:-1], 0)
    for got, x, scale in ((q_out, q_rope, 4.0), (k_out, k_rope, 8.0)):
        truth = engine_reference(pos_ids, x, rope_dim, cache, is_neox).reshape(got.shape) * scale
        error = (got.double().cpu() - truth).abs()
        assert bool((error <= ulp(truth, quantize_dtype) / 2 + 1e-5 * truth.abs().max()).all())
    largest = torch.finfo(quantize_dtype).max
    want = (q_nope.float() * 4.0).clamp(-largest, largest).to(quantize_dtype)
    assert torch.equal(q_nope_out.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("change,error,name", [
    (dict(quantize_dtype=torch.int8), TypeError, "quantize_dtype"),
    (dict(quant_scale_q=0.0), ValueError, "quant_scale_q"),
    (dict(cos_sin_cache="wide"), ValueError, "cos_sin_cache"),
    (dict(pos_ids="short"), ValueError, "pos_ids"),
    (dict(k_rope_out="bf16", quantize_dtype=torch.float8_e4m3fn), ValueError, "k_rope_out"),
], ids=["int8", "zero-scale", "wide-table", "short-positions", "bf16-out"])
def test_rope_quantize_fp8_errors_name_the_argument(change, error, name):
    q_rope = torch.randn(3, 2, 16, device=DEVICE)
    call = dict(q_rope=q_rope, k_rope=torch.randn(3, 1, 16, device=DEVICE), q_nope=None, k_nope=None,
                cos_sin_cache=cache_like_vllm(8, 16, torch.float32), pos_ids=torch.tensor([0, 1, 2], device=DEVICE))
    swaps = {"wide": lambda: cache_like_vllm(8, 32, torch.float32), "short": lambda: call["pos_ids"][:2],
             "bf16": lambda: torch.zeros(3, 1, 16, device=DEVICE, dtype=torch.bfloat16)}
    call.update({key: swaps[value]() if isinstance(value, str) else value for key, value in change.items()})
    with pytest.raises(error, match=name):
        ropekit.rope_quantize_fp8(**call)


@pytest.mark.parametrize("change,error,name", [
    (dict(q_nope=[[0.0]]), TypeError, "q_nope"),
    (dict(k_nope=3.0), TypeError, "k_nope"),
    (dict(q_nope="long"), ValueError, "q_nope"),
    (dict(k_nope="heads"), ValueError, "k_nope"),
    (dict(q_nope="bf16"), ValueError, "q_nope"),
    (dict(k_rope_out="q_rope_out"), ValueError, "k_rope_out"),
    (dict(q_nope_out="inside-k"), ValueError, "q_nope_out"),
    (dict(q_rope_out="fp32", quantize_dtype=None), TypeError, "q_rope_out"),
], ids=["q-nope-list", "k-nope-float", "q-nope-tokens", "k-nope-heads", "q-nope-dtype", "outs-shared", "out-in-input",
        "fp32-out"])
def test_rope_quantize_fp8_checks_every_part_and_output_before_writing(change, error, name):
    """The non-rotary parts and the given outputs are written after the launch: each is checked before it (type,
    tokens and heads, dtype, overlaps), and a refused call leaves every given output as it was."""
    q_rope, k_rope = torch.randn(3, 2, 16, device=DEVICE), torch.randn(3, 1, 16, device=DEVICE)
    outs = dict(q_rope_out=torch.zeros(3, 2, 16, device=DEVICE, dtype=torch.float8_e4m3fn),
                k_rope_out=torch.zeros(3, 1, 16, device=DEVICE, dtype=torch.float8_e4m3fn),
                q_nope_out=torch.zeros(3, 2, 8, device=DEVICE, dtype=torch.float8_e4m3fn))
    call = dict(q_rope=q_rope, k_rope=k_rope, q_nope=torch.randn(3, 2, 8, device=DEVICE), k_nope=None,
                cos_sin_cache=cache_like_vllm(8, 16, torch.float32), pos_ids=torch.tensor([0, 1, 2], device=DEVICE),
                quantize_dtype=torch.float8_e4m3fn, **outs)
    swaps = {"long": lambda: torch.randn(5, 2, 8, device=DEVICE), "heads": lambda: torch.randn(3, 2, 8, device=DEVICE),
             "bf16": lambda: torch.randn(3, 2, 8, device=DEVICE, dtype=torch.bfloat16),
             "q_rope_out": lambda: outs["q_rope_out"][:, :1],
             "inside-k": lambda: k_rope.view(-1).view(torch.float8_e4m3fn)[:48].view(3, 2, 8),
             "fp32": lambda: torch.zeros(3, 2, 16, device=DEVICE)}
    call.update({key: swaps[value]() if isinstance(value, str) else value for key, value in change.items()})
    before = {key: out.clone() for key, out in (*outs.items(), ("k_rope", k_rope))}
    with pytest.raises(error, match=name):
        ropekit.rope_quantize_fp8(**call)
    for key, out in (*outs.items(), ("k_rope", k_rope)):
        assert torch.equal(out.view(torch.uint8), before[key].view(torch.uint8)), key


# --- FlashInfer's rope_quantize_fp8_append_paged_kv_cache -------------------------------------------------------------

def flashinfer_reader(cache, kv_indices, kv_indptr, batch_indices, positions, page_size, kv_layout="NHD"):
    """FlashInfer's paged-cache read of each token's row, as its page table describes it: request ``b``'s pages
    ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, position ``p`` on page ``p // page_size``, row ``p % page_size``
    (``(tokens, ...)`` float64; a 3-D MLA cache ``(pages, page_size, dim)``)."""
    rows = []
    for b, p in zip(batch_indices.tolist(), positions.tolist()):
        page = int(kv_indices[int(kv_indptr[b]) + p // page_size])
        rows.append(cache[page, :, p % page_size] if kv_layout == "HND" and cache.ndim == 4
                    else cache[page, p % page_size])
    return torch.stack(rows).double().cpu()


def append_case(mla, kv_layout, no_rope_dim, quantize_dtype, page_size=4):
    """Two requests appending 3 and 2 tokens after 2 and 5 cached ones, on scattered pages of a sentinel-filled
    pool: bf16 q/k/v parts and the float8 caches FlashInfer allocates."""
    tokens, hq, hk, rope_dim = 5, 4, 1 if mla else 2, 16
    parts = dict(q_rope=torch.randn(tokens, hq, rope_dim, device=DEVICE, dtype=torch.bfloat16),
                 k_rope=torch.randn(*((tokens,) if mla else (tokens, hk)), rope_dim, device=DEVICE,
                                    dtype=torch.bfloat16),
                 q_nope=torch.randn(tokens, hq, no_rope_dim, device=DEVICE, dtype=torch.bfloat16) if no_rope_dim
                 else None,
                 k_nope=torch.randn(*((tokens,) if mla else (tokens, hk)), no_rope_dim, device=DEVICE,
                                    dtype=torch.bfloat16) if no_rope_dim else None)
    head_dim = rope_dim + no_rope_dim
    parts["v"] = None if mla else torch.randn(tokens, hk, head_dim, device=DEVICE, dtype=torch.bfloat16)
    pages = 6

    def pool(*shape):
        return torch.randint(0, 100, shape, device=DEVICE, dtype=torch.uint8).view(quantize_dtype)

    if mla:
        caches = (pool(pages, page_size, no_rope_dim), pool(pages, page_size, rope_dim))
    else:
        shape = (pages, hk, page_size, head_dim) if kv_layout == "HND" else (pages, page_size, hk, head_dim)
        caches = (pool(*shape), pool(*shape))
    table = dict(kv_indices=torch.tensor([4, 1, 0, 5, 2], dtype=torch.int32, device=DEVICE),
                 kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE),
                 batch_indices=torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32, device=DEVICE),
                 positions=torch.tensor([2, 3, 4, 5, 6], dtype=torch.int32, device=DEVICE))
    return parts, caches, table


@pytest.mark.parametrize("quantize_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("form", ["gqa-NHD", "gqa-HND", "gqa-HND-full-rotary", "mla"])
def test_rope_quantize_fp8_append_paged_kv_cache_reads_back_through_the_page_table(form, quantize_dtype, backend):
    """FlashInfer's fused call: q returned as float8 (rotary part rotated) and k, v appended to the float8 paged
    cache; FlashInfer's reader (the page table's row of each token, stored / quant_scale_kv) gives the rotated k_rope,
    k_nope and v within half a spacing of the float64 truth; every row no token names keeps its bytes."""
    from ropekit.testing import ulp

    mla, kv_layout = form == "mla", "HND" if "HND" in form else "NHD"
    no_rope_dim = 0 if form.endswith("full-rotary") else 32
    parts, caches, table = append_case(mla, kv_layout, no_rope_dim, quantize_dtype)
    before = [c.clone() for c in caches]
    cos_sin_cache = cache_like_vllm(32, 16, torch.float32)
    pos_ids = torch.tensor([2, 3, 4, 5, 6], device=DEVICE)
    q_rope_out, q_nope_out = ropekit.rope_quantize_fp8_append_paged_kv_cache(
        parts["q_rope"], parts["k_rope"], parts["q_nope"], parts["k_nope"], parts["v"], cos_sin_cache, pos_ids,
        caches, table["kv_indices"], table["kv_indptr"], table["batch_indices"], table["positions"],
        is_neox=form != "mla", quantize_dtype=quantize_dtype, quant_scale_q=2.0, quant_scale_kv=4.0, page_size=4,
        kv_layout=kv_layout)

    def close(got, truth):
        error = (got - truth).abs()
        assert bool((error <= ulp(truth, quantize_dtype) / 2 + 1e-5 * truth.abs().max()).all()), \
            float((error - ulp(truth, quantize_dtype) / 2).max())

    is_neox = form != "mla"
    k_rot = engine_reference(pos_ids, parts["k_rope"], 16, cos_sin_cache, is_neox).reshape(parts["k_rope"].shape)
    close(q_rope_out.double().cpu(), engine_reference(pos_ids, parts["q_rope"], 16, cos_sin_cache, is_neox).reshape(
        parts["q_rope"].shape) * 2.0)
    read = [flashinfer_reader(c, page_size=4, kv_layout=kv_layout, **table) / 4.0 for c in caches]
    if mla:
        close(read[1], k_rot)
        close(read[0], parts["k_nope"].double().cpu())
    else:
        close(read[0][..., :16], k_rot)
        if no_rope_dim:
            close(read[0][..., 16:], parts["k_nope"].double().cpu())
        close(read[1], parts["v"].double().cpu())
    if parts["q_nope"] is not None:
        largest = torch.finfo(quantize_dtype).max
        want = (parts["q_nope"].float() * 2.0).clamp(-largest, largest).to(quantize_dtype)
        assert torch.equal(q_nope_out.view(torch.uint8), want.view(torch.uint8))
    else:
        assert q_nope_out.shape == (5, 4, 0)
    named = {(4, 2), (4, 3), (1, 0), (5, 1), (5, 2)}  # (page, row) of each token
    for b, c in zip(before, caches):
        for page in range(c.shape[0]):
            for row in range(4):
                if (page, row) not in named:
                    at = (page, slice(None), row) if kv_layout == "HND" and c.ndim == 4 else (page, row)
                    assert torch.equal(c[at].view(torch.uint8), b[at].view(torch.uint8))


@pytest.mark.parametrize("change,error,name", [
    (dict(quantize_dtype=torch.float8_e5m2), ValueError, "paged_kv_cache"),  # the caches hold e4m3
    (dict(page_size=8), ValueError, "page_size"),
    (dict(v=None), ValueError, "v"),
    (dict(quant_scale_kv=-1.0), ValueError, "quant_scale_kv"),
    (dict(paged_kv_cache="one"), ValueError, "paged_kv_cache"),
    (dict(cos_sin_cache="wide"), ValueError, "cos_sin_cache"),
    (dict(batch_indices="int16"), TypeError, "batch_indices"),
    (dict(q_nope=[[0.0]]), TypeError, "q_nope"),
    (dict(q_nope="long"), ValueError, "q_nope"),
    (dict(q_rope_out="in-cache"), ValueError, "q_rope_out"),
], ids=["dtype", "page-size", "no-v", "negative-scale", "one-cache", "wide-table", "int16-batch", "q-nope-list",
        "q-nope-tokens", "out-in-cache"])
def test_rope_quantize_fp8_append_paged_kv_cache_errors_name_the_argument_and_write_nothing(change, error, name):
    parts, caches, table = append_case(False, "NHD", 32, torch.float8_e4m3fn)
    call = dict(parts, cos_sin_cache=cache_like_vllm(32, 16, torch.float32),
                pos_ids=torch.tensor([2, 3, 4, 5, 6], device=DEVICE), paged_kv_cache=caches, page_size=4,
                kv_indices=table["kv_indices"], kv_indptr=table["kv_indptr"], batch_indices=table["batch_indices"],
                positions=table["positions"])
    swaps = {"one": lambda: caches[:1], "wide": lambda: cache_like_vllm(32, 32, torch.float32),
             "int16": lambda: table["batch_indices"].to(torch.int16),
             "long": lambda: torch.randn(7, 4, 32, device=DEVICE, dtype=torch.bfloat16),
             "in-cache": lambda: caches[0].view(-1)[:320].view(5, 4, 16)}
    call.update({key: swaps[value]() if isinstance(value, str) else value for key, value in change.items()})
    before = [c.clone() for c in caches]
    with pytest.raises(error, match=name):
        ropekit.rope_quantize_fp8_append_paged_kv_cache(**call)
    for b, c in zip(before, caches):
        assert torch.equal(b.view(torch.uint8), c.view(torch.uint8))


# --- the float8 calls under torch.compile and in CUDA graphs ----------------------------------------------------------

def assert_within_half_a_spacing(got, truth, quantize_dtype):
    """float8 ``got`` (any device) against float64 ``truth`` (already times its scale): within half a spacing of the
    format, plus the float32 math's error."""
    from ropekit.testing import ulp

    error = (got.double().cpu() - truth).abs()
    bound = ulp(truth, quantize_dtype) / 2 + 1e-5 * truth.abs().max()
    assert bool((error <= bound).all()), float((error - bound).max())


def assert_saturating_cast(got, x, scale, quantize_dtype):
    """A non-rotary part: the float32 product with its scale, saturating, cast (bit for bit)."""
    largest = torch.finfo(quantize_dtype).max
    want = (x.float() * scale).clamp(-largest, largest).to(quantize_dtype)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def assert_quantised_rope(outputs, parts, cos_sin_cache, pos_ids, is_neox, quantize_dtype, scales=(4.0, 8.0)):
    """rope_quantize_fp8's four outputs against the float64 reference: the rotary parts rotated times their scale
    (within half a spacing), the non-rotary ones the saturating cast."""
    q_out, k_out, q_nope_out, k_nope_out = outputs
    rope_dim = parts["q_rope"].shape[-1]
    for got, x, scale in ((q_out, parts["q_rope"], scales[0]), (k_out, parts["k_rope"], scales[1])):
        truth = engine_reference(pos_ids, x, rope_dim, cos_sin_cache, is_neox).reshape(got.shape) * scale
        assert_within_half_a_spacing(got, truth, quantize_dtype)
    assert_saturating_cast(q_nope_out, parts["q_nope"], scales[0], quantize_dtype)
    assert_saturating_cast(k_nope_out, parts["k_nope"], scales[1], quantize_dtype)


def quantise_parts(tokens, hq, hk, rope_dim, nope_dim, mla):
    """bf16 rotary and non-rotary parts of q and k (MLA: k 2-D, one shared head)."""
    k_heads = (tokens,) if mla else (tokens, hk)
    return dict(q_rope=torch.randn(tokens, hq, rope_dim, device=DEVICE, dtype=torch.bfloat16),
                k_rope=torch.randn(*k_heads, rope_dim, device=DEVICE, dtype=torch.bfloat16),
                q_nope=torch.randn(tokens, hq, nope_dim, device=DEVICE, dtype=torch.bfloat16) * 40,
                k_nope=torch.randn(*k_heads, nope_dim, device=DEVICE, dtype=torch.bfloat16) * 40)


@pytest.mark.parametrize("quantize_dtype,mla", [(torch.float8_e4m3fn, False), (torch.float8_e5m2, True)],
                         ids=["e4m3-gqa", "e5m2-mla"])
def test_rope_quantize_fp8_compiles_without_a_graph_break(quantize_dtype, mla):
    """FlashInfer's rope_quantize_fp8 under torch.compile(fullgraph=True), pos_ids a graph input and k_rope_out a given
    output the graph writes: its four outputs are the eager call's bytes and the float64 reference's values."""
    parts = quantise_parts(5, 4, 2, 16, 24, mla)
    cos_sin_cache = cache_like_vllm(32, 16, torch.float32)
    pos_ids = torch.tensor([0, 7, 3, 31, 12], device=DEVICE)
    k_outs = [torch.zeros(parts["k_rope"].shape, device=DEVICE, dtype=quantize_dtype) for _ in range(2)]

    def step(q_rope, k_rope, q_nope, k_nope, pos_ids, k_rope_out):
        return ropekit.rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, not mla,
                                         quantize_dtype, quant_scale_q=4.0, quant_scale_kv=8.0, k_rope_out=k_rope_out)

    want = step(*parts.values(), pos_ids, k_outs[0])
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(*parts.values(), pos_ids, k_outs[1])
    for a, b in zip(got, want):
        assert a.dtype == quantize_dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(k_outs[1].view(torch.uint8), want[1].view(torch.uint8))  # written where it was given
    assert_quantised_rope(got, parts, cos_sin_cache, pos_ids, not mla, quantize_dtype)


def appended_rows(table, page_size) -> list:
    """The (page, row) each token's page-table entry names (FlashInfer's ``kv_indices[kv_indptr[b] + p // page_size]``,
    ``p % page_size``), None for a padding token (-1)."""
    indices, indptr = table["kv_indices"].tolist(), table["kv_indptr"].tolist()
    return [None if b < 0 else (indices[indptr[b] + p // page_size], p % page_size)
            for b, p in zip(table["batch_indices"].tolist(), table["positions"].tolist())]


def assert_appended(q_outputs, parts, caches, before, table, cos_sin_cache, pos_ids, *, mla, kv_layout, page_size,
                    quantize_dtype, scales=(2.0, 4.0)):
    """rope_quantize_fp8_append_paged_kv_cache's results against the float64 reference: q's rotary part (times its
    scale) within half a spacing and its non-rotary part the saturating cast; FlashInfer's reader (each token's row
    through the page table, stored / quant_scale_kv) gives the rotated k_rope, k_nope and v within half a spacing;
    every row no token names keeps its bytes."""
    is_neox = not mla
    rope_dim = parts["q_rope"].shape[-1]
    truth_q = engine_reference(pos_ids, parts["q_rope"], rope_dim, cos_sin_cache, is_neox)
    assert_within_half_a_spacing(q_outputs[0], truth_q.reshape(q_outputs[0].shape) * scales[0], quantize_dtype)
    assert_saturating_cast(q_outputs[1], parts["q_nope"], scales[0], quantize_dtype)
    rows = appended_rows(table, page_size)
    named = [r for r in rows if r is not None]
    keep = torch.tensor([r is not None for r in rows])
    table = dict(table, batch_indices=table["batch_indices"][keep.to(DEVICE)],
                 positions=table["positions"][keep.to(DEVICE)])
    read = [flashinfer_reader(c, page_size=page_size, kv_layout=kv_layout, **table) for c in caches]
    k_rot = engine_reference(pos_ids, parts["k_rope"], rope_dim, cos_sin_cache, is_neox).reshape(
        parts["k_rope"].shape)[keep]
    k_nope = parts["k_nope"].double().cpu()[keep]
    k_part, nope_part = (read[1], read[0]) if mla else (read[0][..., :rope_dim], read[0][..., rope_dim:])
    assert_within_half_a_spacing(k_part, k_rot * scales[1], quantize_dtype)
    assert_within_half_a_spacing(nope_part, k_nope * scales[1], quantize_dtype)
    if not mla:
        assert_within_half_a_spacing(read[1], parts["v"].double().cpu()[keep] * scales[1], quantize_dtype)
    for b, c in zip(before, caches):
        heads_second = kv_layout == "HND" and c.ndim == 4
        untouched = torch.ones(c.shape[0], c.shape[2 if heads_second else 1], dtype=torch.bool)
        for page, row in named:
            untouched[page, row] = False
        after_rows, before_rows = ((t.transpose(1, 2) if heads_second else t).cpu() for t in (c, b))
        assert torch.equal(after_rows[untouched].view(torch.uint8), before_rows[untouched].view(torch.uint8))


@pytest.mark.parametrize("form", ["gqa-HND", "mla"])
def test_rope_quantize_fp8_append_paged_kv_cache_compiles_without_a_graph_break(form):
    """FlashInfer's fused float8 append under torch.compile(fullgraph=True), the page table and pos_ids graph inputs
    and the float8 paged cache (an HND pair, or MLA's (ckv_cache, kpe_cache)) written by the graph: q's outputs and
    the caches are the eager call's bytes, and FlashInfer's reader gives the float64 reference's values."""
    mla, kv_layout = form == "mla", "HND" if "HND" in form else "NHD"
    parts, caches, table = append_case(mla, kv_layout, 32, torch.float8_e4m3fn)
    before, eager = [c.clone() for c in caches], tuple(c.clone() for c in caches)
    cos_sin_cache = cache_like_vllm(32, 16, torch.float32)
    pos_ids = torch.tensor([2, 3, 4, 5, 6], device=DEVICE)

    def step(q_rope, k_rope, q_nope, k_nope, v, pos_ids, caches, kv_indices, kv_indptr, batch_indices, positions):
        return ropekit.rope_quantize_fp8_append_paged_kv_cache(
            q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, caches, kv_indices, kv_indptr, batch_indices,
            positions, is_neox=not mla, quantize_dtype=torch.float8_e4m3fn, quant_scale_q=2.0, quant_scale_kv=4.0,
            page_size=4, kv_layout=kv_layout)

    want = step(*parts.values(), pos_ids, eager, *table.values())
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")
    got = compiled(*parts.values(), pos_ids, caches, *table.values())
    for a, b in zip(got + caches, want + eager):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert_appended(got, parts, caches, before, table, cos_sin_cache, pos_ids, mla=mla, kv_layout=kv_layout,
                    page_size=4, quantize_dtype=torch.float8_e4m3fn)


@gpu_only
@pytest.mark.parametrize("quantize_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_rope_quantize_fp8_replays_in_a_cuda_graph_with_new_positions(mla, quantize_dtype):
    """rope_quantize_fp8 at decode (Llama-3-8B's heads, or DeepSeek's 128 heads of 64 rope + 512 non-rotary
    channels) captured once into preallocated outputs, as an engine's graph holds them: between replays pos_ids and
    the inputs change in place (device-resident); each replay writes the eager call's bytes and the float64
    reference's values."""
    tokens = 64
    hq, hk, rope_dim, nope_dim = (128, 1, 64, 512) if mla else (32, 8, 64, 64)
    parts = quantise_parts(tokens, hq, hk, rope_dim, nope_dim, mla)
    cos_sin_cache = cache_like_vllm(8192, rope_dim, torch.float32)
    pos_ids = torch.randint(0, 8192, (tokens,), device=DEVICE)

    def outputs():
        return [torch.empty(x.shape, device=DEVICE, dtype=quantize_dtype) for x in parts.values()]

    graphed = outputs()

    def step(outs=graphed):
        return ropekit.rope_quantize_fp8(*parts.values(), cos_sin_cache, pos_ids, not mla, quantize_dtype,
                                         quant_scale_q=4.0, quant_scale_kv=8.0, q_rope_out=outs[0],
                                         k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])

    graph = cuda_graph_of(step)
    for _ in range(3):
        pos_ids.copy_(torch.randint(0, 8192, (tokens,), device=DEVICE))
        for x in parts.values():
            x.copy_(torch.randn_like(x) * 4)
        eager = step(outputs())
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(graphed, eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert_quantised_rope(graphed, parts, cos_sin_cache, pos_ids, not mla, quantize_dtype)


@gpu_only
@pytest.mark.parametrize("form", ["gqa-NHD", "gqa-HND", "mla"])
def test_rope_quantize_fp8_append_paged_kv_cache_replays_in_a_cuda_graph_with_new_page_tables(form):
    """FlashInfer's fused float8 append at decode (Llama-3-8B's heads with 64 rotary + 64 other channels, or
    DeepSeek's MLA: 128 heads, 64 rope + 512 latent), page size 16, captured once: between replays pos_ids, the page
    table and the inputs change in place (device-resident); each replay writes the eager call's bytes (q's outputs,
    the caches) and FlashInfer's reader gives the float64 reference's values."""
    mla, kv_layout = form == "mla", "HND" if "HND" in form else "NHD"
    tokens, page_size, num_pages, quantize_dtype = 64, 16, 256, torch.float8_e4m3fn
    hq, hk, rope_dim, nope_dim = (128, 1, 64, 512) if mla else (32, 8, 64, 64)
    parts = dict(quantise_parts(tokens, hq, hk, rope_dim, nope_dim, mla),
                 v=None if mla else torch.randn(tokens, hk, rope_dim + nope_dim, device=DEVICE, dtype=torch.bfloat16))

    def pool(*shape):
        return torch.randint(0, 100, shape, device=DEVICE, dtype=torch.uint8).view(quantize_dtype)

    if mla:
        caches = (pool(num_pages, page_size, nope_dim), pool(num_pages, page_size, rope_dim))
    else:
        shape = (num_pages, hk, page_size, rope_dim + nope_dim) if kv_layout == "HND" else \
            (num_pages, page_size, hk, rope_dim + nope_dim)
        caches = (pool(*shape), pool(*shape))
    cos_sin_cache = cache_like_vllm(8192, rope_dim, torch.float32)
    pos_ids = torch.randint(0, 8192, (tokens,), device=DEVICE)
    table = decode_page_table(tokens, 2, page_size, num_pages, DEVICE, "positions")
    q_outs = [torch.empty(x.shape, device=DEVICE, dtype=quantize_dtype) for x in (parts["q_rope"], parts["q_nope"])]

    def step(caches=caches, q_outs=q_outs):
        return ropekit.rope_quantize_fp8_append_paged_kv_cache(
            *parts.values(), cos_sin_cache, pos_ids, caches, *table.values(), is_neox=not mla,
            quantize_dtype=quantize_dtype, quant_scale_q=2.0, quant_scale_kv=4.0, page_size=page_size,
            kv_layout=kv_layout, q_rope_out=q_outs[0], q_nope_out=q_outs[1])

    graph = cuda_graph_of(step)
    for _ in range(3):
        pos_ids.copy_(torch.randint(0, 8192, (tokens,), device=DEVICE))
        for name, t in decode_page_table(tokens, 2, page_size, num_pages, DEVICE, "positions").items():
            table[name].copy_(t)
        for x in parts.values():
            if x is not None:
                x.copy_(torch.randn_like(x) * 4)
        before, eager = [c.clone() for c in caches], tuple(c.clone() for c in caches)
        eager_q = step(eager, [torch.empty_like(t) for t in q_outs])
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(tuple(q_outs) + caches, eager_q + eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert_appended(q_outs, parts, caches, before, table, cos_sin_cache, pos_ids, mla=mla, kv_layout=kv_layout,
                        page_size=page_size, quantize_dtype=quantize_dtype)


def test_a_key_that_overlaps_itself_is_refused_whatever_the_rotated_channels():
    """With ``rope_dim_offset`` the rotation reads and writes only the channels from the offset, but the heads are
    the caller's: a key whose rotated channels of one token are another token's untouched ones is refused by name,
    as at offset 0, with nothing written."""
    key = torch.randn(64, device=DEVICE).as_strided((3, 1, 16), (15, 16, 1))  # key[t, 0, 15] is key[t + 1, 0, 0]
    query = torch.randn(3, 1, 16, device=DEVICE)
    cache = torch.cat(ropekit.cos_sin_table(8, 8, device=DEVICE), -1)
    before = (query.clone(), key.clone())
    for offset in (0, 8):
        with pytest.raises(ValueError, match="key"):
            ropekit.rotary_embedding(torch.tensor([1, 2, 3], device=DEVICE), query, key, 16, cache, True,
                                     rope_dim_offset=offset)
        assert torch.equal(query, before[0]) and torch.equal(key, before[1])


def test_errors_name_the_engine_call_that_was_made():
    """A refusal of FlashInfer's entry point names it, not vLLM's, which shares its checks."""
    query = torch.randn(3, 1, 16, device=DEVICE)
    cache = torch.cat(ropekit.cos_sin_table(8, 8, device=DEVICE), -1)
    with pytest.raises(TypeError, match="apply_rope_with_cos_sin_cache_inplace"):
        ropekit.apply_rope_with_cos_sin_cache_inplace(torch.tensor([1, 2, 3], device=DEVICE), query,
                                                      query.double(), 16, cache)  # (key: another dtype)
