"""Spec for ropekit.hf: the transformers drop-in gives transformers' result, the patcher refuses every module it can't
stand in for (verified by probing, against real transformers modules and synthetic ones), and the M-RoPE helper
rejects what it cannot gather."""

import sys
import types

import pytest
import torch

import ropekit
from ropekit import reference as ref
from conftest import DEVICE

try:
    import transformers
except ImportError:  # only the compatibility tests need it
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="transformers is not installed")


def table(rows=64, rotary_dim=32, base=10000.0):
    return ropekit.cos_sin_table(rows, rotary_dim, base=base, device=DEVICE)


# --- the drop-in ---------------------------------------------------------------------------------------------------

@needs_transformers
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_hf_drop_in_matches_transformers(unsqueeze_dim, dtype):
    from transformers.models.llama import modeling_llama

    batch, seqlen, heads, head_dim = 2, 5, 4, 32
    shape = (batch, heads, seqlen, head_dim) if unsqueeze_dim == 1 else (batch, seqlen, heads, head_dim)
    q = torch.randn(shape, device=DEVICE).to(dtype)
    k = torch.randn(shape[:1] + ((2,) + shape[2:] if unsqueeze_dim == 1 else shape[1:2] + (2,) + shape[3:]),
                    device=DEVICE).to(dtype)
    theta = ref.angles(torch.randint(0, 100, (batch, seqlen)), ref.inverse_frequencies(head_dim))
    theta = torch.cat((theta, theta), -1)
    cos, sin = theta.cos().to(DEVICE).to(dtype), theta.sin().to(DEVICE).to(dtype)
    got = ropekit.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        if dtype != torch.float32:  # (fp32: the GPU may contract into FMAs, a last-bit difference)
            # eager_rounding reproduces the eager formula's three roundings: the same bits in half precision
            assert torch.equal(g, w)


@needs_transformers
def test_tiny_llama_logits_unchanged_with_ropekit_patched_in():
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(DEVICE).eval()
    ids = torch.randint(0, 97, (2, 7), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits
        with ropekit.hf.patched("transformers.models.llama.modeling_llama"):
            got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# --- the patcher: verified by probing before anything is patched -----------------------------------------------------

# transformers modules whose apply_rotary_pos_emb computes something the drop-in does not, and why
REFUSED = {
    "nanochat": "sign-flipped rotate_half",
    "gpt_oss": "half-width cos",
    "openai_privacy_filter": "half-width cos",
    "glm4v": "rotate_half_llm pairs GPT-J's way",
    "glm_ocr": "rotate_half_llm pairs GPT-J's way",
    "ernie4_5_vl_moe": "rotate_half_text pairs GPT-J's way",
    "pe_audio": "the complex form",
    "pe_video": "the complex form",
    "pe_audio_video": "the complex form",
    "esm": "float32 math, one rounding: one bf16 ulp off",
    "evolla": "float32 math, one rounding: one bf16 ulp off",
    "hunyuan_vl": "float32 math, one rounding: one bf16 ulp off",
    "modernbert": "float32 math, one rounding: one bf16 ulp off",
    "modernbert_decoder": "float32 math, one rounding: one bf16 ulp off",
    "glm": "rotate_half pairs GPT-J's way",
    "cohere": "rotate_half pairs GPT-J's way",
    "gptj": "another signature",
}
ACCEPTED = ["llama", "phi", "qwen2", "gemma", "mistral", "gpt_neox", "qwen2_vl"]


def _transformers_module(name):
    pytest.importorskip("transformers")
    module_name = f"transformers.models.{name}.modeling_{name}"
    try:
        __import__(module_name)
    except ImportError:
        pytest.skip(f"{module_name} is not in the installed transformers")
    return sys.modules[module_name]


@pytest.mark.parametrize("name", list(REFUSED), ids=[f"{n}:{why}" for n, why in REFUSED.items()])
def test_patching_refuses_a_module_it_cannot_stand_in_for(name):
    module = _transformers_module(name)
    original = module.apply_rotary_pos_emb
    with pytest.raises(ValueError, match=f"cannot stand in for {module.__name__}'s"):
        with ropekit.hf.patched(module.__name__):
            pytest.fail("patched a module the drop-in cannot stand in for")
    assert module.apply_rotary_pos_emb is original  # refused before anything was patched


@pytest.mark.parametrize("name", ACCEPTED)
def test_patching_accepts_a_module_it_matches_and_restores_it(name):
    module = _transformers_module(name)
    original = module.apply_rotary_pos_emb
    with ropekit.hf.patched(module.__name__):
        assert module.apply_rotary_pos_emb is ropekit.hf.apply_rotary_pos_emb
    assert module.apply_rotary_pos_emb is original


def test_a_refusal_names_every_module_and_patches_none():
    pytest.importorskip("transformers")
    good, bad = "transformers.models.llama.modeling_llama", "transformers.models.nanochat.modeling_nanochat"
    _transformers_module("nanochat")
    before = sys.modules[good].apply_rotary_pos_emb
    with pytest.raises(ValueError, match="nanochat"):
        with ropekit.hf.patched(good, bad):
            pass
    assert sys.modules[good].apply_rotary_pos_emb is before


# Synthetic modules: each an apply_rotary_pos_emb a model could plausibly ship.

def _neox_rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _flipped_rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


def _gptj_rotate_half(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _eager(rotate_half, *, float32=False, cast_back=False):
    """transformers' formula (its products promote: float32 cos/sin beside bf16 q give float32 results); ``float32``
    computes in float32, and that or ``cast_back`` rounds the results to q's dtype (OLMo-2's way)."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        dtype = q.dtype
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        if float32:
            q, k, cos, sin = q.float(), k.float(), cos.float(), sin.float()
        rotary_dim = cos.shape[-1]

        def rotate(x):
            x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
            return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)

        if float32 or cast_back:
            return rotate(q).to(dtype), rotate(k).to(dtype)
        return rotate(q), rotate(k)

    return apply_rotary_pos_emb


def _half_width_cos(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    return rotate(q), rotate(k)


def _always_raises(q, k, cos, sin, unsqueeze_dim=1):
    raise RuntimeError("needs a CUDA kernel")


def _position_ids_first(q, k, position_ids, cos, sin):
    return q, k


def _switches_for(tokens, other):
    """transformers' formula, but ``other`` for the calls whose sequence length ``tokens`` accepts: a module that
    differs only on decode steps, or only on long sequences (as a scaled rope type's code path may)."""
    eager = _eager(_neox_rotate_half)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return (other if tokens(q.shape[2]) else eager)(q, k, cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


def _last_positions_scaled(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' formula, with the rows past position 8191 scaled (a longrope-like switch of factors)."""
    cos, sin = cos.clone(), sin.clone()
    cos[:, 8192:] *= 1.5
    sin[:, 8192:] *= 1.5
    return _eager(_neox_rotate_half)(q, k, cos, sin, unsqueeze_dim)


SYNTHETIC = {
    "decode-step-differs": (_switches_for(lambda n: n == 1, _eager(_gptj_rotate_half)), _neox_rotate_half,
                            "1-token"),
    "differs-past-8-tokens": (_switches_for(lambda n: n > 8, _eager(_neox_rotate_half, float32=True)),
                              _neox_rotate_half, "40-token bfloat16 probe"),
    "differs-past-8192-tokens": (_switches_for(lambda n: n > 8192, _eager(_flipped_rotate_half)),
                                 _neox_rotate_half, "8200-token"),
    "differs-at-positions-past-8192": (_last_positions_scaled, _neox_rotate_half, "8200-token"),
    "raises-on-long-sequences": (_switches_for(lambda n: n > 8192, _always_raises), _neox_rotate_half,
                                 "raises (RuntimeError) where it takes 5 tokens"),
    "neox": (_eager(_neox_rotate_half), _neox_rotate_half, None),
    "sign-flipped": (_eager(_flipped_rotate_half), _flipped_rotate_half, "rotate_half is not transformers'"),
    "gptj-pairs": (_eager(_gptj_rotate_half), _gptj_rotate_half, "GPT-J's way"),
    "float32-math": (_eager(_neox_rotate_half, float32=True), _neox_rotate_half, "bfloat16 probe"),
    "rounds-float32-rows-to-q": (_eager(_neox_rotate_half, cast_back=True), _neox_rotate_half,
                                 "cos/sin in float32"),
    "half-width-cos": (_half_width_cos, None, "half-width cos"),
    "always-raises": (_always_raises, None, "raises on every float32 probe"),
    "another-signature": (_position_ids_first, None, "takes"),
}


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_float32_rows_beside_bf16_activations_promote_like_the_formula(unsqueeze_dim):
    """OLMo-style rotary modules return float32 cos/sin: transformers' formula then computes and returns float32."""
    theta = torch.rand(2, 5, 8, dtype=torch.float64) * 40
    cos = torch.cat((theta.cos(), theta.cos()), -1).float().to(DEVICE)
    sin = torch.cat((theta.sin(), theta.sin()), -1).float().to(DEVICE)
    q = torch.randn(2, 2, 5, 16, device=DEVICE).bfloat16()
    k = torch.randn(2, 1, 5, 16, device=DEVICE).bfloat16()
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    want = _eager(_neox_rotate_half)(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    got = ropekit.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1.3e-6, atol=1e-5)


@pytest.fixture
def synthetic_module():
    names = []

    def make(apply, rotate_half):
        name = f"ropekit_test_synthetic_{len(names)}_{id(apply)}"
        module = types.ModuleType(name)
        module.apply_rotary_pos_emb = apply
        if rotate_half is not None:
            module.rotate_half = rotate_half
        sys.modules[name] = module
        names.append(name)
        return module

    yield make
    for name in names:
        del sys.modules[name]


@pytest.mark.parametrize("kind", list(SYNTHETIC))
def test_patching_probes_synthetic_modules(kind, synthetic_module):
    apply, rotate_half, refusal = SYNTHETIC[kind]
    module = synthetic_module(apply, rotate_half)
    if refusal is None:
        with ropekit.hf.patched(module.__name__):
            assert module.apply_rotary_pos_emb is ropekit.hf.apply_rotary_pos_emb
        assert module.apply_rotary_pos_emb is apply
        return
    with pytest.raises(ValueError, match=module.__name__) as raised:
        with ropekit.hf.patched(module.__name__):
            pass
    assert refusal in str(raised.value)
    assert module.apply_rotary_pos_emb is apply


def test_a_custom_fn_is_not_probed(synthetic_module):
    module = synthetic_module(_always_raises, None)
    calls = []

    def counting(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(q.shape)
        return ropekit.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    with ropekit.hf.patched(module.__name__, fn=counting):
        assert module.apply_rotary_pos_emb is counting
    assert calls == []


# --- M-RoPE --------------------------------------------------------------------------------------------------------

@needs_transformers
@pytest.mark.parametrize("model, section, interleaved", [("qwen2_vl", [4, 6, 6], False), ("qwen3_vl", [6, 5, 5], True)])
def test_mrope_matches_qwen_vl(model, section, interleaved):
    """Qwen2-VL's sections of pairs per axis, and Qwen3-VL's interleaved M-RoPE (the axes take turns pair by pair)."""
    import importlib
    modeling = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    prefix = {"qwen2_vl": "Qwen2VL", "qwen3_vl": "Qwen3VL"}[model]
    parameters = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    if interleaved:
        parameters["mrope_interleaved"] = True
    config = getattr(transformers, f"{prefix}TextConfig")(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                                          head_dim=32, rope_parameters=parameters)
    rotary = getattr(modeling, f"{prefix}TextRotaryEmbedding" if interleaved else f"{prefix}RotaryEmbedding")(config)
    rotary = rotary.to(DEVICE)
    batch, seqlen, head_dim = 2, 6, 32
    position_ids = torch.randint(0, 50, (3, batch, seqlen), device=DEVICE)
    q = torch.randn(batch, 2, seqlen, head_dim, device=DEVICE)
    k = torch.randn(batch, 1, seqlen, head_dim, device=DEVICE)
    cos_hf, sin_hf = rotary(q, position_ids)
    want = modeling.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos_t, sin_t = table(64, head_dim)
    cos, sin = ropekit.mrope_cos_sin(cos_t, sin_t, position_ids, section, interleaved=interleaved)
    got = ropekit.apply_rope(q, k, cos, sin, layout="bhsd", per_token=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5)  # transformers forms fp32 angles
    other, _ = ropekit.mrope_cos_sin(cos_t, sin_t, position_ids, section, interleaved=not interleaved)
    assert not torch.allclose(other, cos)  # the two layouts differ: the switch matters
    # the same choice made inside the kernel, from the table and the (3, batch, seq) ids (tests/test_mrope.py)
    in_kernel = ropekit.apply_rope(q, k, cos_t, sin_t, positions=position_ids, layout="bhsd", mrope_section=section,
                                   mrope_interleaved=interleaved)
    for g, w in zip(in_kernel, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-5)

MROPE_ERRORS = {
    "position-minus-one": (lambda ids: ids.index_fill(-1, torch.tensor([0], device=ids.device), -1), [4, 6, 6],
                           ValueError, "position_ids"),
    "position-past-the-table": (lambda ids: ids.index_fill(-1, torch.tensor([2], device=ids.device), 64), [4, 6, 6],
                                ValueError, "position_ids"),
    "float-position-ids": (lambda ids: ids.float(), [4, 6, 6], TypeError, "position_ids"),
    "negative-section": (lambda ids: ids, [-2, 12, 6], ValueError, "mrope_section"),
    "float-section": (lambda ids: ids, [4.0, 6, 6], ValueError, "mrope_section"),
    "section-sum": (lambda ids: ids, [4, 6, 5], ValueError, "mrope_section"),
    "position-ids-shape": (lambda ids: ids[0, 0], [4, 6, 6], ValueError, "position_ids"),
}


@pytest.mark.parametrize("case", list(MROPE_ERRORS))
def test_mrope_rejects_what_it_cannot_gather(case):
    change, section, error, name = MROPE_ERRORS[case]
    cos_t, sin_t = table(64, 32)
    ids = change(torch.randint(0, 64, (3, 2, 5), device=DEVICE))
    with pytest.raises(error, match=name):
        ropekit.mrope_cos_sin(cos_t, sin_t, ids, section)


def test_mrope_rejects_tables_that_are_not_two_matching_2d_tensors():
    cos_t, sin_t = table(64, 32)
    ids = torch.zeros(2, 5, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="cos_table"):
        ropekit.mrope_cos_sin(cos_t[None], sin_t, ids, [4, 6, 6])
    with pytest.raises(ValueError, match="cos_table and sin_table"):
        ropekit.mrope_cos_sin(cos_t, sin_t[:32], ids, [4, 6, 6])


def test_mrope_positions_the_host_cannot_read_give_nan_rows_not_another_row(monkeypatch):
    cos_t, sin_t = table(64, 32)
    ids = torch.randint(0, 64, (3, 1, 4), device=DEVICE)
    ids[0, 0, 1], ids[2, 0, 3] = -1, 64
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # as inside torch.compile: no host read
    cos, sin = ropekit.mrope_cos_sin(cos_t, sin_t, ids, [4, 6, 6])
    temporal, width = torch.zeros(16, dtype=torch.bool), torch.zeros(16, dtype=torch.bool)
    temporal[:4], width[10:] = True, True
    for rows in (cos, sin):
        nan = torch.isnan(rows[0]).cpu()
        assert nan[1].equal(torch.cat((temporal, temporal))) and nan[3].equal(torch.cat((width, width)))
        assert not nan[0].any() and not nan[2].any()
