"""Spec for ropekit.frequencies: table accuracy, the Hugging Face rope types, reading model configs.

Every expected value here is derived in this file, independently of the module under test: the tables from mpmath
at 40 digits, the rope types from their published formulas (hand-worked small cases), and then, as a second
opinion, transformers' own ROPE_INIT_FUNCTIONS. Pure CPU, no Triton.
"""

import math
import re
from functools import lru_cache

import pytest
import torch

from ropekit.frequencies import (
    ROPE_TYPES,
    cos_sin_at,
    cos_sin_table,
    inverse_frequencies,
    rope_init,
    rope_parameters_from_config,
)

mpmath = pytest.importorskip("mpmath", reason="mpmath (a sympy dependency) gives the high-precision reference")

BASES = [pytest.param(10000.0, id="base1e4"), pytest.param(500000.0, id="base5e5"),
         pytest.param(1e6, id="base1e6")]
ROTARY_DIMS = [pytest.param(64, id="dim64"), pytest.param(128, id="dim128")]
POSITIONS = [pytest.param(p, id=f"pos{p}") for p in (0, 1, 100, 1000, 32000, 1_000_000)]
TABLE_TOLERANCE = 2e-7  # the bound; one float32 rounding of a value in [-1, 1] is <= 6e-8


@lru_cache(maxsize=None)
def exact_cos_sin(position: int, rotary_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of position * base**(-2i/d) at 40 significant digits, rounded once to float64."""
    with mpmath.workdps(40):
        angles = [position * mpmath.power(mpmath.mpf(base), -mpmath.mpf(2 * i) / rotary_dim)
                  for i in range(rotary_dim // 2)]
        cos = [float(mpmath.cos(a)) for a in angles]
        sin = [float(mpmath.sin(a)) for a in angles]
    return torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)


def max_error(values: torch.Tensor, exact: torch.Tensor) -> float:
    return (values.double() - exact).abs().max().item()


# ------------------------------------------------------------------------------------------------------------------
# (a) tables from float64 angles are accurate at every position
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("rotary_dim", ROTARY_DIMS)
@pytest.mark.parametrize("base", BASES)
def test_table_entry_is_within_2e7_of_exact(base, rotary_dim, position):
    cos, sin = cos_sin_at(torch.tensor([position]), inverse_frequencies(rotary_dim, base))
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (1, rotary_dim // 2)
    exact_cos, exact_sin = exact_cos_sin(position, rotary_dim, base)
    assert max_error(cos[0], exact_cos) <= TABLE_TOLERANCE
    assert max_error(sin[0], exact_sin) <= TABLE_TOLERANCE


@pytest.mark.parametrize("base", BASES)
def test_full_table_of_a_million_positions_is_accurate_at_its_last_row(base):
    # rotary_dim 2 keeps only the fastest pair (inv_freq = 1): the one whose angle is largest at every position,
    # so it is where a rounded angle hurts most; a 1e6-row table of one pair is cheap (8 MB).
    cos, sin = cos_sin_table(1_000_001, 2, base=base)
    assert cos.shape == sin.shape == (1_000_001, 1)
    for position in (0, 1, 100, 1000, 32000, 1_000_000):
        exact_cos, exact_sin = exact_cos_sin(position, 2, base)
        assert max_error(cos[position], exact_cos) <= TABLE_TOLERANCE
        assert max_error(sin[position], exact_sin) <= TABLE_TOLERANCE


@pytest.mark.parametrize("rotary_dim", ROTARY_DIMS)
def test_table_rows_equal_cos_sin_at_bit_for_bit(rotary_dim):
    inv_freq = inverse_frequencies(rotary_dim, 500000.0)
    table_cos, table_sin = cos_sin_table(1001, inv_freq=inv_freq, attention_scaling=1.25)
    positions = torch.tensor([[0, 7], [999, 1000]])
    cos, sin = cos_sin_at(positions, inv_freq, attention_scaling=1.25)
    assert cos.shape == (2, 2, rotary_dim // 2)
    assert torch.equal(cos, table_cos[positions]) and torch.equal(sin, table_sin[positions])


def test_table_applies_attention_scaling_and_dtype():
    cos, sin = cos_sin_table(50, 8, base=10000.0)
    scaled_cos, scaled_sin = cos_sin_table(50, 8, base=10000.0, attention_scaling=0.5, dtype=torch.float64)
    assert scaled_cos.dtype == torch.float64 and scaled_cos.shape == (50, 4)
    torch.testing.assert_close(scaled_cos, 0.5 * cos.double(), atol=1e-7, rtol=0)
    torch.testing.assert_close(scaled_sin, 0.5 * sin.double(), atol=1e-7, rtol=0)


# ------------------------------------------------------------------------------------------------------------------
# (b) the contrast: angles formed in float32 drift with the position
# ------------------------------------------------------------------------------------------------------------------

def float32_angle_cos_sin(position: int, rotary_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What a float32 pipeline does (e.g. transformers' rotary forward): float32 position times float32 inv_freq.

    cos/sin of that float32 angle are then taken in float64, so any error measured comes from the angle alone.
    """
    angle = torch.tensor(float(position), dtype=torch.float32) * inverse_frequencies(rotary_dim, base).float()
    return torch.cos(angle.double()), torch.sin(angle.double())


@pytest.mark.parametrize("rotary_dim", ROTARY_DIMS)
@pytest.mark.parametrize("base", BASES)
def test_float32_angles_drift_far_past_the_tolerance_at_position_1e6(base, rotary_dim):
    exact_cos, exact_sin = exact_cos_sin(1_000_000, rotary_dim, base)
    cos, sin = float32_angle_cos_sin(1_000_000, rotary_dim, base)
    # Measured on this setup: 6e-3 .. 4e-2, i.e. 30,000x to 180,000x the table tolerance.
    assert max(max_error(cos, exact_cos), max_error(sin, exact_sin)) > 1e-3
    # ... while at position 1 the same float32 pipeline is as good as the float64 table.
    exact_cos, exact_sin = exact_cos_sin(1, rotary_dim, base)
    cos, sin = float32_angle_cos_sin(1, rotary_dim, base)
    assert max(max_error(cos, exact_cos), max_error(sin, exact_sin)) <= TABLE_TOLERANCE


# ------------------------------------------------------------------------------------------------------------------
# (c) each rope type against hand-worked values from its published formula
# ------------------------------------------------------------------------------------------------------------------

def assert_rope(parameters, rotary_dim, expected_inv_freq, expected_attention_factor, **kwargs):
    inv_freq, attention_factor = rope_init(parameters, rotary_dim, **kwargs)
    assert inv_freq.dtype == torch.float64 and inv_freq.shape == (rotary_dim // 2,)
    torch.testing.assert_close(inv_freq, torch.tensor(expected_inv_freq, dtype=torch.float64), rtol=1e-12, atol=0)
    assert attention_factor == pytest.approx(expected_attention_factor, rel=1e-12)


@pytest.mark.parametrize("parameters, kwargs, expected", [
    # theta_i = base ** (-2i/d): d = 4, base 1e4 -> 1e4 ** 0, 1e4 ** -0.5
    pytest.param({}, {}, [1.0, 0.01], id="empty-dict-is-default-base1e4"),
    pytest.param({"rope_type": "default", "rope_theta": 1e6}, {}, [1.0, 1e-3], id="rope_theta-1e6"),
    pytest.param({"rope_type": "default"}, {"base": 100.0}, [1.0, 0.1], id="base-argument"),
    pytest.param({"rope_theta": 1e6}, {"base": 100.0}, [1.0, 1e-3], id="rope_theta-wins-over-base"),
])
def test_default(parameters, kwargs, expected):
    assert_rope(parameters, 4, expected, 1.0, **kwargs)


@pytest.mark.parametrize("parameters", [
    pytest.param({"rope_type": "linear", "factor": 4.0}, id="rope_type-key"),
    pytest.param({"type": "linear", "factor": 4}, id="legacy-type-key"),
])
def test_linear_divides_every_frequency_by_factor(parameters):
    # Position interpolation: p -> p / 4 for every pair.
    assert_rope(parameters, 4, [0.25, 0.0025], 1.0)


@pytest.mark.parametrize("rotary_dim, base, seq_len, expected", [
    # NTK-aware: base' = base * (factor * seq_len / trained - (factor - 1)) ** (d / (d - 2)).
    # d=4, factor 2, trained 1000, seq 3000: scale = 6 - 1 = 5, base' = 1e4 * 5**2 = 2.5e5 -> [1, 1/500].
    pytest.param(4, 10000.0, 3000, [1.0, 1 / 500], id="d4-seq3x-base-times-25"),
    # d=6, base 1000, seq 2500: scale = 5 - 1 = 4, 4 ** (6/4) = 8, base' = 8000 -> [1, 1/20, 1/400].
    pytest.param(6, 1000.0, 2500, [1.0, 1 / 20, 1 / 400], id="d6-seq2.5x-base-times-8"),
    # Within the trained length nothing changes (scale = 1): the sequence length is clamped up to it.
    pytest.param(4, 10000.0, 500, [1.0, 0.01], id="d4-short-seq-unchanged"),
    pytest.param(4, 10000.0, None, [1.0, 0.01], id="d4-no-seq-len-unchanged"),
])
def test_dynamic_ntk(rotary_dim, base, seq_len, expected):
    parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": base}
    assert_rope(parameters, rotary_dim, expected, 1.0, max_position_embeddings=1000, seq_len=seq_len)


def test_dynamic_reads_max_position_embeddings_from_the_dict():
    parameters = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 1000}
    assert_rope(parameters, 4, [1.0, 1 / 500], 1.0, seq_len=3000)


def yarn_turns(pair: int, rotary_dim: int, base: float, trained: int) -> float:
    """How many full turns pair `pair` makes over the trained length: trained / wavelength."""
    return trained / (2 * math.pi * base ** (2 * pair / rotary_dim))


def yarn_expected(rotary_dim, base, trained, factor, beta_fast, beta_slow, truncate):
    """YaRN "NTK-by-parts", as its reference code defines the ramp: linear in the pair index between the
    (fractional) pair indices that make beta_fast and beta_slow turns, snapped outward to whole pairs if truncate."""
    def pair_making(turns):  # solve yarn_turns(i) == turns for i
        return math.log(trained / (2 * math.pi * turns), base) * rotary_dim / 2
    first, last = pair_making(beta_fast), pair_making(beta_slow)
    if truncate:
        first, last = math.floor(first), math.ceil(last)
    first, last = max(first, 0), min(last, rotary_dim - 1)
    out = []
    for i in range(rotary_dim // 2):
        share = min(max((i - first) / (last - first), 0.0), 1.0)  # share of the interpolated frequency
        theta = base ** (-2 * i / rotary_dim)
        out.append(theta * (1 - share) + theta / factor * share)
    return out


def test_yarn_hand_worked_d16():
    # d=16, base 1e4, trained 4096, factor 4, beta_fast 32, beta_slow 1. Turns over 4096 positions per pair:
    turns = [yarn_turns(i, 16, 1e4, 4096) for i in range(8)]
    assert turns[2] > 32 > turns[3] and turns[5] > 1 > turns[6]  # so the ramp snaps to pairs 2 .. 6
    # Share of the interpolated (divide-by-4) frequency: (i - 2) / 4 clamped -> 0, 0, 0, .25, .5, .75, 1, 1,
    # so each pair's frequency is multiplied by 1 - share + share / 4:
    multipliers = [1, 1, 1, 0.8125, 0.625, 0.4375, 0.25, 0.25]
    expected = [m * 1e4 ** (-i / 8) for i, m in enumerate(multipliers)]
    parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    # cos/sin scale sqrt(1/t) = 0.1 ln(s) + 1
    assert_rope(parameters, 16, expected, 0.1 * math.log(4) + 1)


@pytest.mark.parametrize("rotary_dim, base, trained, factor, beta_fast, beta_slow, truncate", [
    pytest.param(64, 10000.0, 4096, 8.0, 32, 1, True, id="d64-factor8-truncated"),
    pytest.param(64, 10000.0, 4096, 8.0, 32, 1, False, id="d64-factor8-not-truncated"),
    pytest.param(128, 1e6, 32768, 4.0, 16, 2, True, id="d128-base1e6-betas16-2"),
    pytest.param(128, 5e5, 8192, 16.0, 64, 0.5, False, id="d128-base5e5-betas64-0.5-not-truncated"),
])
def test_yarn_ramp(rotary_dim, base, trained, factor, beta_fast, beta_slow, truncate):
    parameters = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained,
                  "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate, "rope_theta": base}
    expected = yarn_expected(rotary_dim, base, trained, factor, beta_fast, beta_slow, truncate)
    assert_rope(parameters, rotary_dim, expected, 0.1 * math.log(factor) + 1)


@pytest.mark.parametrize("extra, kwargs, expected_attention_factor", [
    pytest.param({"attention_factor": 0.5}, {}, 0.5, id="explicit-attention-factor"),
    # DeepSeek: ratio of two temperatures, (0.1 * mscale * ln s + 1) / (0.1 * mscale_all_dim * ln s + 1)
    pytest.param({"mscale": 0.707, "mscale_all_dim": 1.0}, {}, (0.0707 * math.log(4) + 1) / (0.1 * math.log(4) + 1),
                 id="mscale-ratio"),
    pytest.param({"mscale": 1.0, "mscale_all_dim": 1.0}, {}, 1.0, id="equal-mscales-cancel"),
    pytest.param({"mscale": 1.0}, {}, 0.1 * math.log(4) + 1, id="mscale-alone-ignored"),
    # No factor: it is max_position_embeddings / original_max_position_embeddings = 16384 / 4096 = 4.
    pytest.param({"factor": None}, {"max_position_embeddings": 16384}, 0.1 * math.log(4) + 1,
                 id="factor-from-lengths"),
])
def test_yarn_attention_factor(extra, kwargs, expected_attention_factor):
    parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, **extra}
    expected = yarn_expected(16, 10000.0, 4096, 4.0, 32, 1, True)
    assert_rope(parameters, 16, expected, expected_attention_factor, **kwargs)


def test_yarn_without_original_length_uses_max_position_embeddings():
    # transformers fills original_max_position_embeddings from max_position_embeddings when a config omits it.
    parameters = {"rope_type": "yarn", "factor": 4.0}
    expected = yarn_expected(16, 10000.0, 4096, 4.0, 32, 1, True)
    assert_rope(parameters, 16, expected, 0.1 * math.log(4) + 1, max_position_embeddings=4096)


def test_llama3_hand_worked_three_bands():
    # d=8, base 1e4: theta = 1, .1, .01, .001; wavelengths 2*pi*(1, 10, 100, 1000) = 6.3, 62.8, 628, 6283.
    # trained 100, low_freq_factor 1, high_freq_factor 4: long-wave edge 100/1 = 100, short-wave edge 100/4 = 25.
    #   6.3 < 25          -> kept
    #   25 <= 62.8 <= 100 -> smooth = (100 / 62.83 - 1) / (4 - 1), blend (1 - smooth) * theta / 8 + smooth * theta
    #   628, 6283 > 100   -> theta / 8
    smooth = (100 / (2 * math.pi * 10) - 1) / 3
    expected = [1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8]
    parameters = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 100, "rope_theta": 10000.0}
    assert_rope(parameters, 8, expected, 1.0)


def test_llama31_8b_parameters_by_band():
    # The Llama 3.1 release: base 5e5, d 128, factor 8, bands 1/4, trained 8192 -> wavelength edges 8192 and 2048.
    parameters = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    inv_freq, attention_factor = rope_init(parameters, 128)
    expected = []
    for i in range(64):
        theta = 500000.0 ** (-2 * i / 128)
        wavelength = 2 * math.pi / theta
        if wavelength < 2048:
            expected.append(theta)
        elif wavelength > 8192:
            expected.append(theta / 8)
        else:
            smooth = (8192 / wavelength - 1) / 3
            expected.append((1 - smooth) * theta / 8 + smooth * theta)
    torch.testing.assert_close(inv_freq, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert attention_factor == 1.0
    unscaled = inverse_frequencies(128, 500000.0)
    kept = torch.isclose(inv_freq, unscaled, rtol=1e-15, atol=0).sum().item()
    divided = torch.isclose(inv_freq, unscaled / 8, rtol=1e-15, atol=0).sum().item()
    assert kept > 0 and divided > 0 and kept + divided < 64  # all three bands are populated


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0],
            "original_max_position_embeddings": 1000}


@pytest.mark.parametrize("extra, kwargs, expected_inv_freq, expected_attention_factor", [
    # inv_freq_i = theta_i / rescale_i with theta = (1, 0.01); scale sqrt(1 + ln(factor) / ln(trained)).
    pytest.param({"factor": 4.0}, {}, [1.0, 0.005], math.sqrt(1 + math.log(4) / math.log(1000)),
                 id="no-seq-len-uses-short"),
    pytest.param({"factor": 4.0}, {"seq_len": 1000}, [1.0, 0.005], math.sqrt(1 + math.log(4) / math.log(1000)),
                 id="seq-at-trained-length-uses-short"),
    pytest.param({"factor": 4.0}, {"seq_len": 1001}, [0.25, 0.00125], math.sqrt(1 + math.log(4) / math.log(1000)),
                 id="seq-past-trained-length-uses-long"),
    pytest.param({}, {"max_position_embeddings": 8000}, [1.0, 0.005], math.sqrt(1 + math.log(8) / math.log(1000)),
                 id="factor-from-lengths-phi3"),
    pytest.param({"factor": 1.0}, {}, [1.0, 0.005], 1.0, id="factor1-no-attention-scale"),
    pytest.param({"factor": 4.0, "attention_factor": 1.5}, {}, [1.0, 0.005], 1.5, id="explicit-attention-factor"),
])
def test_longrope(extra, kwargs, expected_inv_freq, expected_attention_factor):
    assert_rope({**LONGROPE, **extra}, 4, expected_inv_freq, expected_attention_factor, **kwargs)


def test_every_rope_type_is_covered():
    assert set(ROPE_TYPES) == {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}


# ------------------------------------------------------------------------------------------------------------------
# rope_parameters_from_config
# ------------------------------------------------------------------------------------------------------------------

def test_config_legacy_dict_with_partial_rotary():
    config = {"hidden_size": 2048, "num_attention_heads": 32, "partial_rotary_factor": 0.5, "rope_theta": 5e5,
              "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    params = rope_parameters_from_config(config)
    assert params["rope_type"] == "linear" and "type" not in params
    assert params["rope_theta"] == 5e5 and params["factor"] == 2.0
    assert params["head_dim"] == 64 and params["rotary_dim"] == 32 and params["max_position_embeddings"] == 4096
    inv_freq, _ = rope_init(params, params["rotary_dim"])
    torch.testing.assert_close(inv_freq, inverse_frequencies(32, 5e5) / 2, rtol=1e-15, atol=0)


def test_config_without_scaling_is_default():
    params = rope_parameters_from_config({"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 64})
    assert params["rope_type"] == "default" and params["rope_theta"] == 10000.0 and params["rotary_dim"] == 128


@pytest.mark.parametrize("config, expected", [
    # raw config.json files use older or model-specific keys for the same things
    pytest.param({"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8, "rotary_pct": 0.25,
                  "rotary_emb_base": 1e6, "max_position_embeddings": 2048},
                 dict(head_dim=64, rotary_dim=16, rope_theta=1e6, interleaved=False), id="gpt-neox-rotary_pct"),
    pytest.param({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048},
                 dict(head_dim=256, rotary_dim=64, rope_theta=10000.0, interleaved=True,
                      max_position_embeddings=2048), id="gpt-j-rotary_dim"),
    pytest.param({"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
                  "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "rope_theta": 10000,
                  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                   "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}},
                 dict(head_dim=64, rotary_dim=64, rope_type="yarn", interleaved=True), id="deepseek-v3-rope-head"),
    pytest.param({"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 2, "qk_rope_head_dim": 16,
                  "rope_interleave": False},
                 dict(rotary_dim=16, interleaved=False), id="deepseek-v3-not-interleaved"),
    pytest.param({"model_type": "qwen2_vl", "hidden_size": 1536, "num_attention_heads": 12, "rope_theta": 1e6,
                  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
                 dict(rope_type="default", mrope_section=[16, 24, 24], rotary_dim=128), id="qwen2-vl-legacy-mrope"),
    pytest.param({"model_type": "chatglm", "hidden_size": 4096, "num_attention_heads": 32, "kv_channels": 128,
                  "rope_ratio": 500, "seq_length": 131072},
                 dict(head_dim=128, rotary_dim=64, rope_theta=5e6, interleaved=True, max_position_embeddings=131072),
                 id="chatglm"),
    pytest.param({"model_type": "glm", "head_dim": 128, "partial_rotary_factor": 0.5},
                 dict(rotary_dim=64, interleaved=True), id="glm-interleaved-partial"),
    pytest.param({"model_type": "llama", "head_dim": 128}, dict(rotary_dim=128, interleaved=False), id="llama"),
])
def test_config_reads_model_specific_keys(config, expected):
    params = rope_parameters_from_config(config)
    assert {key: params[key] for key in expected} == expected
    rope_init(params, params["rotary_dim"])  # and they are usable as they are


def test_config_top_level_original_length_wins_like_phi3():
    config = {"head_dim": 4, "max_position_embeddings": 8000, "original_max_position_embeddings": 1000,
              "rope_scaling": {"type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0],
                               "original_max_position_embeddings": 2000}}
    params = rope_parameters_from_config(config)
    assert params["original_max_position_embeddings"] == 1000
    _, attention_factor = rope_init(params, params["rotary_dim"])
    assert attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(1000)), rel=1e-12)


# ------------------------------------------------------------------------------------------------------------------
# (d) each rope type against transformers' ROPE_INIT_FUNCTIONS
# ------------------------------------------------------------------------------------------------------------------

def _longrope_lists(pairs):
    return {"short_factor": [1.0 + i / (4 * pairs) for i in range(pairs)],
            "long_factor": [1.0 + i / 2 for i in range(pairs)]}


HF_CASES = [
    # (rope_parameters, head_dim, max_position_embeddings, seq_len)
    pytest.param({"rope_type": "default", "rope_theta": 10000.0}, 128, 4096, None, id="default-base1e4"),
    pytest.param({"rope_type": "default", "rope_theta": 1e6}, 64, 4096, None, id="default-base1e6"),
    pytest.param({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, 128, 4096, None, id="linear-x4"),
    pytest.param({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5}, 128, 4096,
                 None, id="linear-x2-partial-half"),
    pytest.param({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}, 128, 4096, None,
                 id="dynamic-at-init"),
    pytest.param({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}, 128, 4096, 10000,
                 id="dynamic-seq10000"),
    pytest.param({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}, 64, 2048, 16384, id="dynamic-seq8x"),
    pytest.param({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                  "rope_theta": 10000.0}, 128, 4096, None, id="yarn-x4"),
    pytest.param({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "truncate": False,
                  "rope_theta": 1e6}, 128, 4096, None, id="yarn-x4-not-truncated"),
    pytest.param({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
                  "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}, 64, 163840, None,
                 id="yarn-deepseek-mscale"),
    pytest.param({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                  "attention_factor": 0.8, "beta_fast": 16.0, "beta_slow": 2.0, "rope_theta": 5e5}, 128, 32768, None,
                 id="yarn-explicit-attention-betas"),
    pytest.param({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 128, 131072, None,
                 id="llama3.1-8b"),
    pytest.param({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 64, 131072, None,
                 id="llama3.2-1b"),
    pytest.param({"rope_type": "longrope", "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                  **_longrope_lists(48)}, 96, 131072, None, id="longrope-phi3-short"),
    pytest.param({"rope_type": "longrope", "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                  **_longrope_lists(48)}, 96, 131072, 8192, id="longrope-phi3-long"),
    pytest.param({"rope_type": "longrope", "original_max_position_embeddings": 4096, "factor": 4.0,
                  "attention_factor": 1.2, "rope_theta": 10000.0, **_longrope_lists(64)}, 128, 16384, 4097,
                 id="longrope-explicit-factors-long"),
]


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    transformers.logging.set_verbosity_error()  # its config checks warn about the made-up lengths used here

    def config(rope_parameters, head_dim, max_position_embeddings):
        return transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                        num_hidden_layers=1, vocab_size=16,
                                        max_position_embeddings=max_position_embeddings,
                                        rope_parameters=dict(rope_parameters))

    def init(config, seq_len):
        rope_type = config.rope_parameters["rope_type"]
        if rope_type == "default":  # transformers 5 keeps "default" on each model's rotary class
            return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)

    return config, init


@pytest.mark.parametrize("rope_parameters, head_dim, max_position_embeddings, seq_len", HF_CASES)
def test_matches_transformers(hf, rope_parameters, head_dim, max_position_embeddings, seq_len):
    make_config, hf_init = hf
    config = make_config(rope_parameters, head_dim, max_position_embeddings)
    hf_inv_freq, hf_attention_factor = hf_init(config, seq_len)

    params = rope_parameters_from_config(config)
    assert params["rope_type"] == rope_parameters["rope_type"]
    inv_freq, attention_factor = rope_init(params, params["rotary_dim"], seq_len=seq_len)
    # transformers computes in float32: compare at float32-level tolerance.
    torch.testing.assert_close(inv_freq, hf_inv_freq.double(), rtol=1e-6, atol=0)
    assert attention_factor == pytest.approx(hf_attention_factor, rel=1e-6)

    # The raw dict with the model's length gives the same as the config path.
    raw_inv_freq, raw_attention_factor = rope_init(
        rope_parameters, params["rotary_dim"], max_position_embeddings=max_position_embeddings, seq_len=seq_len)
    assert torch.equal(raw_inv_freq, inv_freq) and raw_attention_factor == attention_factor


def test_matches_transformers_for_a_legacy_rope_scaling_config(hf):
    import transformers
    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=2, num_hidden_layers=1, vocab_size=16,
                                      rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0})
    _, hf_init = hf
    hf_inv_freq, _ = hf_init(config, None)
    params = rope_parameters_from_config(config)
    inv_freq, _ = rope_init(params, params["rotary_dim"])
    torch.testing.assert_close(inv_freq, hf_inv_freq.double(), rtol=1e-6, atol=0)


def test_phi3_legacy_su_and_yarn_with_per_pair_factors_mean_longrope(hf):
    """transformers maps Phi-3's legacy ``su`` and ``yarn`` (with short/long factors) to ``longrope``."""
    import transformers
    factors = dict(short_factor=[1.0 + i / 16 for i in range(16)], long_factor=[2.0 + i / 8 for i in range(16)])
    raw = {"model_type": "phi3", "hidden_size": 96, "num_attention_heads": 3, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0}
    config = transformers.Phi3Config(hidden_size=96, num_attention_heads=3, num_hidden_layers=1, vocab_size=16,
                                     max_position_embeddings=131072, original_max_position_embeddings=4096,
                                     rope_scaling={"type": "longrope", **factors})
    _, hf_init = hf
    hf_inv_freq, hf_factor = hf_init(config, None)
    for legacy in ("su", "yarn"):
        params = rope_parameters_from_config({**raw, "rope_scaling": {"type": legacy, **factors}})
        assert params["rope_type"] == "longrope"
        inv_freq, factor = rope_init(params, params["rotary_dim"])
        torch.testing.assert_close(inv_freq, hf_inv_freq.double(), rtol=1e-6, atol=0)
        assert factor == pytest.approx(hf_factor, rel=1e-6)


def test_a_vision_language_config_is_read_through_its_text_config():
    import transformers
    for composite in (transformers.Qwen2VLConfig(), transformers.Llama4Config()):
        assert rope_parameters_from_config(composite) == rope_parameters_from_config(composite.text_config)
    assert rope_parameters_from_config(transformers.Llama4Config())["interleaved"]  # complex pairs (2i, 2i + 1)


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "legacy-rope_local_base_freq"])
def test_gemma3_layer_types_read_like_transformers(legacy):
    """Gemma 3 rotates sliding layers with base 1e4 unscaled and full attention with base 1e6 and its scaling; the
    legacy config.json keys (rope_local_base_freq beside rope_scaling) mean the same."""
    import transformers
    from transformers.models.gemma3 import modeling_gemma3
    keys = dict(head_dim=32, hidden_size=64, num_attention_heads=2, num_hidden_layers=6, vocab_size=16)  # 5 + 1
    legacy_keys = dict(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    config = transformers.Gemma3TextConfig(**keys, **legacy_keys)
    rotary = modeling_gemma3.Gemma3RotaryEmbedding(config)
    source = {"model_type": "gemma3_text", **keys, **legacy_keys} if legacy else config
    for layer_type in ("sliding_attention", "full_attention"):
        params = rope_parameters_from_config(source, layer_type=layer_type)
        inv_freq, factor = rope_init(params, params["rotary_dim"])
        want = getattr(rotary, f"{layer_type}_inv_freq")
        torch.testing.assert_close(inv_freq, want.double(), rtol=1e-6, atol=0)
    assert rope_parameters_from_config(source, layer_type="full_attention")["rope_type"] == "linear"
    with pytest.raises(ValueError, match="pass layer_type="):
        rope_parameters_from_config(source)


@pytest.mark.parametrize("model_type", ["llama4_text", "cohere2_moe", "moonshine", "glm4v_text", "blt_local_encoder"])
def test_models_rotating_neighbouring_channels_read_as_interleaved(model_type):
    params = rope_parameters_from_config({"model_type": model_type, "hidden_size": 64, "num_attention_heads": 2})
    assert params["interleaved"] is True


# ------------------------------------------------------------------------------------------------------------------
# (e) bad inputs name what is wrong
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("parameters, rotary_dim, kwargs, message", [
    pytest.param({"rope_type": "proportional"}, 8, {}, "rope_type 'proportional' is not supported",
                 id="unknown-rope_type"),
    pytest.param({"type": "su"}, 8, {}, "rope_type 'su'", id="unknown-legacy-type"),
    pytest.param({"rope_type": "linear"}, 8, {}, "'factor'", id="linear-missing-factor"),
    pytest.param({"rope_type": "linear", "factor": -2.0}, 8, {}, "'factor' must be a positive number",
                 id="linear-negative-factor"),
    pytest.param({"rope_type": "linear", "factor": "2"}, 8, {}, "'factor' must be a positive number",
                 id="linear-string-factor"),
    pytest.param({"rope_type": "dynamic", "factor": 2.0}, 8, {}, "max_position_embeddings",
                 id="dynamic-missing-max_position_embeddings"),
    pytest.param({"rope_type": "yarn", "factor": 2.0}, 8, {}, "'original_max_position_embeddings'",
                 id="yarn-missing-original-length"),
    pytest.param({"rope_type": "yarn", "original_max_position_embeddings": 1024}, 8, {}, "'factor'",
                 id="yarn-missing-factor-and-lengths"),
    pytest.param({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192}, 8, {}, "'high_freq_factor'",
                 id="llama3-missing-high_freq_factor"),
    pytest.param({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
                  "original_max_position_embeddings": 8192}, 8, {}, "high_freq_factor != low_freq_factor",
                 id="llama3-equal-band-factors"),
    pytest.param({**LONGROPE, "factor": 2.0, "long_factor": None}, 4, {}, "'long_factor'", id="longrope-missing-long_factor"),
    pytest.param({**LONGROPE, "factor": 2.0}, 8, {}, "'short_factor' must hold rotary_dim/2 = 4 numbers",
                 id="longrope-short_factor-wrong-length"),
    pytest.param({**LONGROPE, "factor": 2.0, "long_factor": [1.0, 0.0]}, 4, {}, "'long_factor' must hold positive",
                 id="longrope-zero-in-long_factor"),
    pytest.param({}, 7, {}, "rotary_dim must be a positive even integer", id="odd-rotary_dim"),
    pytest.param({}, 0, {}, "rotary_dim must be a positive even integer", id="zero-rotary_dim"),
    pytest.param({}, 8, {"base": 1.0}, "base", id="base-not-above-1"),
    pytest.param({"rope_type": "dynamic", "factor": 2.0}, 8, {"max_position_embeddings": 100, "seq_len": -1},
                 "seq_len", id="negative-seq_len"),
])
def test_rope_init_rejects(parameters, rotary_dim, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rope_init(parameters, rotary_dim, **kwargs)


def test_rope_init_rejects_a_non_dict():
    with pytest.raises(TypeError, match="parameters must be a dict"):
        rope_init([("rope_type", "linear")], 8)


@pytest.mark.parametrize("config, message", [
    pytest.param({"rope_theta": 1e4}, "head_dim, or hidden_size and num_attention_heads", id="no-head-size"),
    pytest.param({"head_dim": 64, "partial_rotary_factor": 0.3}, "partial_rotary_factor", id="odd-partial-rotary"),
    pytest.param({"head_dim": 64, "rope_parameters": {"full_attention": {"rope_type": "default"},
                                                      "sliding_attention": {"rope_type": "default"}}},
                 "differ by layer type (full_attention, sliding_attention): pass layer_type=", id="nested-per-layer"),
    pytest.param({"head_dim": 64, "rope_scaling": "linear"}, "must be a dict", id="scaling-not-a-dict"),
])
def test_rope_parameters_from_config_rejects(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rope_parameters_from_config(config)


@pytest.mark.parametrize("inv_freq", [torch.ones(2, 4, dtype=torch.float64), torch.ones((), dtype=torch.float64),
                                      torch.arange(4)], ids=["2-D", "0-D", "integer"])
def test_cos_sin_table_rejects_an_inv_freq_that_is_not_1d_floating(inv_freq):
    with pytest.raises(ValueError, match="inv_freq"):
        cos_sin_table(8, inv_freq=inv_freq)


def test_tables_near_the_int32_limit_stay_within_the_documented_float64_angle_bound():
    """Every entry within one float32 rounding plus the float64 angle's own rounding, p * 1.1e-16 rad (design.md)."""
    from fractions import Fraction
    inv_freq = inverse_frequencies(128, 1e4)
    for position in (10**8, 2108457613, 2**31 - 1):
        cos, sin = cos_sin_at(torch.tensor([position]), inv_freq)
        two_pi = 2 * Fraction("3.14159265358979323846264338327950288419716939937510582097494459")
        angle = [Fraction(position) * Fraction(float(f)) for f in inv_freq.tolist()]  # exact in rationals
        bound = 6e-8 + position * 1.1e-16 + 1e-15
        for table, fn in ((cos, math.cos), (sin, math.sin)):
            exact = torch.tensor([fn(float(a % two_pi)) for a in angle], dtype=torch.float64)
            assert float((table[0].double() - exact).abs().max()) <= bound
