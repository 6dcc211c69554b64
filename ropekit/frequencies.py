"""Inverse frequencies, Hugging Face rope scaling types, and cos/sin tables built from float64 angles.

Why float64 angles
------------------
Pair ``i`` at position ``p`` turns by ``theta = p * inv_freq[i]``. Formed in float32, that product is rounded to
the float32 grid, whose spacing near 1e6 is 0.0625: the angle, and therefore cos/sin, can be off by up to 0.03 at
position 1,000,000 whatever sin/cos routine runs after it. Forming the angle in float64 (spacing 1.2e-10 near
1e6) and rounding only the finished cos/sin to float32 keeps every table entry within one float32 rounding
(<= 6e-8) of the exact value, at position 1e6 as at position 1. The float64 angle's own rounding (and that of
inv_freq) grows with the position, at most about p * 1.1e-16 rad: negligible up to ~1e8, up to ~2.4e-7 near 2**31.
Tables are built once, so float64 costs nothing that matters; kernels then read float32 tables.

Rope types
----------
``rope_init(parameters, rotary_dim, ...)`` turns a Hugging Face ``rope_parameters`` / ``rope_scaling`` dict into
``(inv_freq, attention_factor)`` with the same parameters and results as transformers' ``ROPE_INIT_FUNCTIONS``
(computed here in float64). ``attention_factor`` multiplies cos and sin (``cos_sin_table(attention_scaling=...)``):

* ``default``  ``inv_freq[i] = base ** (-2i / d)``.
* ``linear``   position interpolation: every frequency divided by ``factor``.
* ``dynamic``  NTK-aware: a larger base once the sequence outgrows ``max_position_embeddings``.
* ``yarn``     NTK-by-parts: fast channels keep their frequency, slow channels are interpolated by ``factor``, a
  linear ramp over channel index in between; cos/sin are scaled by ``0.1 ln(factor) + 1`` (YaRN, Peng et al. 2023).
* ``llama3``   Llama 3.1: by wavelength; short wavelengths kept, long ones divided by ``factor``, smooth in between.
* ``longrope`` LongRoPE / Phi-3: one rescale factor per channel, the short or long list by sequence length;
  cos/sin scaled by ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "ROPE_TYPES",
    "inverse_frequencies",
    "rope_init",
    "rope_parameters_from_config",
    "cos_sin_at",
    "cos_sin_from_freqs",
    "cos_sin_table",
]

DEFAULT_BASE = 10000.0


def inverse_frequencies(rotary_dim: int, base: float = DEFAULT_BASE) -> torch.Tensor:
    """``base ** (-2i / rotary_dim)`` for ``i = 0 .. rotary_dim/2 - 1``, as float64 (CPU)."""
    _check_rotary_dim(rotary_dim)
    if not base > 1.0:
        raise ValueError(f"base (rope_theta) must be a number > 1, got {base!r}")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim
    return float(base) ** (-exponents)


# ----------------------------------------------------------------------------------------------------------------
# Rope types
# ----------------------------------------------------------------------------------------------------------------

def _default(p: _Params) -> tuple[torch.Tensor, float]:
    return inverse_frequencies(p.rotary_dim, p.base), 1.0


def _linear(p: _Params) -> tuple[torch.Tensor, float]:
    # Dividing positions by `factor` (position interpolation) is the same as dividing every frequency by it.
    return inverse_frequencies(p.rotary_dim, p.base) / p.number("factor"), 1.0


def _dynamic(p: _Params) -> tuple[torch.Tensor, float]:
    # NTK-aware: raise the base so the slowest pair stretches by `scale` while the fastest stays put;
    # base' = base * scale ** (d / (d - 2)). Until the sequence outgrows the trained length, scale == 1.
    factor = p.number("factor")
    trained = p.max_position_embeddings("max_position_embeddings")
    seq_len = trained if p.seq_len is None else max(p.seq_len, trained)
    scale = factor * seq_len / trained - (factor - 1.0)
    d = p.rotary_dim
    if d == 2:
        raise ValueError("rope_type 'dynamic' needs rotary_dim > 2 (its base exponent is d / (d - 2))")
    return inverse_frequencies(d, p.base * scale ** (d / (d - 2))), 1.0


def _yarn(p: _Params) -> tuple[torch.Tensor, float]:
    d = p.rotary_dim
    trained = p.original_max_position_embeddings()
    factor = p.optional_number("factor")
    if factor is None:  # DeepSeek-V3 style configs give the two lengths instead of the factor
        factor = p.max_position_embeddings("factor") / trained

    attention_factor = p.optional_number("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:  # DeepSeek: ratio of two temperatures (truthiness, as transformers reads it)
            attention_factor = _yarn_temperature(factor, mscale) / _yarn_temperature(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_temperature(factor, 1.0)

    # A pair that completes `r` full turns over the trained length has wavelength trained / r. Pair i has
    # wavelength 2*pi * base**(2i/d), so the (fractional) pair index at which that happens is
    #   i(r) = d * ln(trained / (2*pi*r)) / (2 * ln(base)).
    # Pairs turning more than beta_fast times keep their frequency; fewer than beta_slow times are interpolated.
    beta_fast = p.get("beta_fast") or 32.0
    beta_slow = p.get("beta_slow") or 1.0

    def pair_index(turns: float) -> float:
        return d * math.log(trained / (2.0 * math.pi * turns)) / (2.0 * math.log(p.base))

    first, last = pair_index(beta_fast), pair_index(beta_slow)
    if p.get("truncate", True):  # the reference implementation snaps the ramp to whole pairs
        first, last = math.floor(first), math.ceil(last)
    first, last = max(first, 0), min(last, d - 1)
    if first == last:
        last += 0.001  # a one-point ramp would divide by zero; the reference implementation widens it like this
    pairs = torch.arange(d // 2, dtype=torch.float64, device="cpu")
    interpolated_share = ((pairs - first) / (last - first)).clamp(0.0, 1.0)  # 0: keep, 1: divide by factor

    inv_freq = inverse_frequencies(d, p.base)
    inv_freq = inv_freq * (1.0 - interpolated_share) + (inv_freq / factor) * interpolated_share
    return inv_freq, float(attention_factor)


def _yarn_temperature(factor: float, mscale: float) -> float:
    # YaRN's recommended cos/sin scale sqrt(1/t) = 0.1 ln(s) + 1 (no change when not extending).
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _llama3(p: _Params) -> tuple[torch.Tensor, float]:
    factor = p.number("factor")
    low_freq_factor = p.number("low_freq_factor")
    high_freq_factor = p.number("high_freq_factor")
    trained = p.original_max_position_embeddings()
    if high_freq_factor == low_freq_factor:
        raise ValueError("rope_type 'llama3' needs high_freq_factor != low_freq_factor (they bound the smooth band)")

    inv_freq = inverse_frequencies(p.rotary_dim, p.base)
    wavelength = 2.0 * math.pi / inv_freq
    # Position of each pair between the bands: turns over the trained length, shifted so 0 = long edge, 1 = short.
    smooth = (trained / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    long_wave = wavelength > trained / low_freq_factor      # hardly turns during training: interpolate
    short_wave = wavelength < trained / high_freq_factor    # turns many times: keep as trained
    inv_freq = torch.where(long_wave, inv_freq / factor, torch.where(short_wave, inv_freq, blended))
    return inv_freq, 1.0


def _longrope(p: _Params) -> tuple[torch.Tensor, float]:
    trained = p.original_max_position_embeddings()
    factor = p.optional_number("factor")
    if factor is None:  # Phi-3 configs give max_position_embeddings / original_max_position_embeddings instead
        factor = p.max_position_embeddings("factor") / trained

    attention_factor = p.optional_number("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1.0 + math.log(factor) / math.log(trained))

    # Past the trained length use the long list, otherwise the short one (no sequence length means "short").
    key = "long_factor" if p.seq_len is not None and p.seq_len > trained else "short_factor"
    rescale = p.per_pair_list(key)
    for other in ("short_factor", "long_factor"):  # both must be valid whichever is used now
        p.per_pair_list(other)
    return inverse_frequencies(p.rotary_dim, p.base) / rescale, float(attention_factor)


_INIT = {
    "default": _default,
    "linear": _linear,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}
ROPE_TYPES = tuple(_INIT)


def rope_init(parameters: Mapping[str, Any] | None, rotary_dim: int, *, base: float | None = None,
              max_position_embeddings: int | None = None, seq_len: int | None = None,
              ) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_factor)`` for a Hugging Face ``rope_parameters`` / ``rope_scaling`` dict.

    ``inv_freq`` is float64 of shape ``(rotary_dim/2,)``; ``attention_factor`` scales cos and sin.
    The rope type comes from ``"rope_type"`` (or the legacy ``"type"``), default ``"default"``; the base from
    ``"rope_theta"``, else ``base``, else 10000. ``max_position_embeddings`` (else the dict's own key of that name,
    as ``rope_parameters_from_config`` provides) is the model's context length: ``dynamic`` needs it, and ``yarn``,
    ``llama3``, ``longrope`` use it where transformers does (missing factor or original length).
    ``seq_len`` is the current sequence length (``dynamic``, ``longrope``). Other keys are ignored.
    Raises ``ValueError`` naming the key for an unknown rope type or a missing/invalid parameter.
    """
    params = _Params(parameters, rotary_dim, base, max_position_embeddings, seq_len)
    return _INIT[params.rope_type](params)


def _rope_type(parameters: Mapping[str, Any]) -> str:
    """The rope type a parameters dict names: ``"rope_type"``, else the legacy ``"type"``, else ``"default"``."""
    return parameters.get("rope_type") or parameters.get("type") or "default"


class _Params:
    """A rope-parameters dict plus the call's arguments, with readers that fail with the key's name."""

    def __init__(self, parameters, rotary_dim, base, max_position_embeddings, seq_len):
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, Mapping):
            raise TypeError(f"parameters must be a dict (a rope_parameters / rope_scaling dict), got "
                            f"{type(parameters).__name__}")
        self.parameters = parameters
        _check_rotary_dim(rotary_dim)
        self.rotary_dim = rotary_dim
        rope_type = _rope_type(parameters)
        if rope_type not in _INIT:
            raise ValueError(f"rope_type {rope_type!r} is not supported; expected one of {', '.join(ROPE_TYPES)}")
        self.rope_type = rope_type
        theta = parameters.get("rope_theta")
        self.base = float(theta if theta is not None else base if base is not None else DEFAULT_BASE)
        if max_position_embeddings is None:
            max_position_embeddings = parameters.get("max_position_embeddings")
        self._max_position_embeddings = max_position_embeddings
        if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0):
            raise ValueError(f"seq_len must be a non-negative int or None, got {seq_len!r}")
        self.seq_len = seq_len

    def get(self, key, default=None):
        return self.parameters.get(key, default)

    def optional_number(self, key: str) -> float | None:
        value = self.parameters.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"rope_type {self.rope_type!r}: {key!r} must be a positive number, got {value!r}")
        return float(value)

    def number(self, key: str) -> float:
        value = self.optional_number(key)
        if value is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs the key {key!r} in its rope parameters")
        return value

    def max_position_embeddings(self, needed_for: str) -> float:
        value = self._max_position_embeddings
        if value is None:
            what = "" if needed_for == "max_position_embeddings" else f" (or the key {needed_for!r})"
            raise ValueError(f"rope_type {self.rope_type!r} needs max_position_embeddings{what}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"max_position_embeddings must be a positive number, got {value!r}")
        return float(value)

    def original_max_position_embeddings(self) -> float:
        # transformers fills this key from max_position_embeddings when a config leaves it out; so do we.
        value = self.optional_number("original_max_position_embeddings")
        if value is None:
            if self._max_position_embeddings is None:
                raise ValueError(f"rope_type {self.rope_type!r} needs the key 'original_max_position_embeddings' "
                                 "(or max_position_embeddings)")
            value = self.max_position_embeddings("original_max_position_embeddings")
        return value

    def per_pair_list(self, key: str) -> torch.Tensor:
        values = self.parameters.get(key)
        if values is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs the key {key!r} in its rope parameters")
        values = torch.as_tensor(values, dtype=torch.float64, device="cpu")
        if values.shape != (self.rotary_dim // 2,):
            raise ValueError(f"{key!r} must hold rotary_dim/2 = {self.rotary_dim // 2} numbers, "
                             f"got shape {tuple(values.shape)}")
        if not bool((values > 0).all()):
            raise ValueError(f"{key!r} must hold positive numbers")
        return values


def _check_rotary_dim(rotary_dim) -> None:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim!r}")


# ----------------------------------------------------------------------------------------------------------------
# Reading a model config
# ----------------------------------------------------------------------------------------------------------------

# Models whose rotary pairs are interleaved (GPT-J's channels 2i, 2i+1) rather than NeoX's halves (i, i + d/2), by
# transformers' model_type (their modeling code rotates x[..., 0::2] with x[..., 1::2]; DeepSeek-V2 multiplies complex
# pairs, and so does Llama 4; ChatGLM is remote code; the vision-language models listed rotate their language part's
# pairs so). DeepSeek-V3 and GLM-4-MoE-Lite do so when their rope_interleave flag is set (the default); transformers
# then permutes q/k to halves before a NeoX rotation, which gives the same attention scores with q and k's rotary
# channels in another order.
_INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "codegen", "cohere", "cohere2", "cohere2_moe", "glm", "glm4", "helium",
                                      "ernie4_5", "ernie4_5_moe", "ernie4_5_vl_moe_text", "deepseek_v2",
                                      "deepseek_v4", "chatglm", "llama4", "llama4_text", "moonshine", "blt_local_encoder",
                                      "blt_local_decoder", "blt_global_transformer", "blt_patcher",
                                      "glm4v_text", "glm_ocr_text"})
_INTERLEAVE_FLAG_MODEL_TYPES = frozenset({"deepseek_v3", "glm4_moe_lite"})


def rope_parameters_from_config(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """Normalised rope parameters of a transformers config object or a plain ``config.json`` dict.

    Reads transformers 5.x ``rope_parameters`` or the legacy ``rope_scaling`` + ``rope_theta``, plus
    ``partial_rotary_factor``, ``head_dim`` (else ``hidden_size // num_attention_heads``) and
    ``max_position_embeddings``, and the keys older configs use for the same things: GPT-NeoX's ``rotary_pct`` and
    ``rotary_emb_base``, GPT-J's and CodeGen's ``rotary_dim`` (and ``n_embd`` / ``n_head``), DeepSeek's
    ``qk_rope_head_dim`` (the rotated part of each head), ChatGLM's ``kv_channels`` and ``rope_ratio``, Qwen2-VL's
    legacy rope type ``mrope`` (default frequencies; ``mrope_section`` is kept for ``mrope_cos_sin``), Phi-3's legacy
    ``su`` (and ``yarn`` with per-pair factors), which mean ``longrope``. A vision-language config is read through its
    ``text_config``.

    Returns the scaling keys plus ``rope_type``, ``rope_theta``, ``head_dim``, ``partial_rotary_factor``,
    ``rotary_dim``, ``max_position_embeddings`` and ``interleaved`` (the model pairs channels GPT-J's way), ready for
    ``rope_init(p, p["rotary_dim"])`` or ``RotaryEmbedding(p["head_dim"], scaling=p)``.

    ``layer_type``: for configs whose layer types rotate differently (Gemma 3's ``sliding_attention`` and
    ``full_attention``: transformers' nested ``rope_parameters``, or the legacy ``rope_local_base_freq`` beside
    ``rope_scaling``, which then applies to full attention only), the layer type whose parameters to return; such a
    config without it raises a ``ValueError`` naming the types. Other configs have one set for every layer.
    """
    def read(key):
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

    text = read("text_config")
    if text is not None and not any(read(key) for key in ("head_dim", "hidden_size", "n_embd", "qk_rope_head_dim")):
        return rope_parameters_from_config(text, layer_type)  # a vision-language model: its language model's rope
    model_type = read("model_type")
    scaling = read("rope_parameters") or read("rope_scaling") or {}
    if not isinstance(scaling, Mapping):
        raise ValueError(f"rope_parameters / rope_scaling must be a dict, got {type(scaling).__name__}")
    local_base = read("rope_local_base_freq")
    if local_base is not None and not any(isinstance(value, Mapping) for value in scaling.values()):
        # Gemma 3's legacy keys: the scaling and rope_theta are full attention's; sliding layers rotate unscaled
        theta = scaling.get("rope_theta", read("rope_theta"))
        scaling = {"full_attention": {**scaling, **({} if theta is None else {"rope_theta": theta})},
                   "sliding_attention": {"rope_type": "default", "rope_theta": local_base}}
    if any(isinstance(value, Mapping) for value in scaling.values()):
        types = [key for key, value in scaling.items() if isinstance(value, Mapping)]
        if layer_type not in types:
            raise ValueError(f"this config's rope parameters differ by layer type ({', '.join(types)}): pass "
                             f"layer_type= one of them" + ("" if layer_type is None else f", not {layer_type!r}"))
        scaling = scaling[layer_type]
    params = {key: value for key, value in scaling.items() if key != "type"}
    rope_type = _rope_type(scaling)
    if rope_type == "su" or (rope_type == "yarn" and "short_factor" in scaling):
        rope_type = "longrope"  # Phi-3's legacy names for its per-pair factors, which transformers maps so too
    params["rope_type"] = "default" if rope_type == "mrope" else rope_type  # transformers maps the legacy name too

    theta = scaling.get("rope_theta")
    if theta is None:
        theta = read("rope_theta") or read("rotary_emb_base")
    if theta is None and model_type == "chatglm":
        theta = DEFAULT_BASE * float(read("rope_ratio") or 1.0)
    params["rope_theta"] = float(theta or DEFAULT_BASE)

    head_dim = read("qk_rope_head_dim") or read("head_dim") or read("kv_channels")
    if head_dim is None:
        hidden_size = read("hidden_size") or read("n_embd")
        heads = read("num_attention_heads") or read("n_head")
        if not hidden_size or not heads:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
        head_dim = hidden_size // heads
    head_dim = int(head_dim)
    partial = scaling.get("partial_rotary_factor") or read("partial_rotary_factor") or read("rotary_pct")
    if partial is None and model_type == "chatglm":
        partial = 0.5  # ChatGLM rotates the first half of each head
    rotary_dim = read("rotary_dim")  # GPT-J, CodeGen: channels, not a fraction
    if isinstance(rotary_dim, int) and not isinstance(rotary_dim, bool) and partial is None:
        partial = rotary_dim / head_dim
    else:
        rotary_dim = int(head_dim * float(partial or 1.0))
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"head_dim * partial_rotary_factor = {head_dim} * {partial} must give a positive even "
                         f"rotary_dim <= head_dim, got {rotary_dim}")
    if model_type in _INTERLEAVE_FLAG_MODEL_TYPES:
        flag = read("rope_interleave")
        interleaved = True if flag is None else bool(flag)
    else:
        interleaved = model_type in _INTERLEAVED_MODEL_TYPES
    params.update(head_dim=head_dim, partial_rotary_factor=float(partial or 1.0), rotary_dim=rotary_dim,
                  max_position_embeddings=read("max_position_embeddings") or read("n_positions")
                  or read("seq_length"), interleaved=interleaved)

    if params["rope_type"] in ("yarn", "llama3", "longrope"):
        # Phi-3 keeps the trained length at the top level, and transformers lets that win over the dict.
        top_level = read("original_max_position_embeddings")
        if top_level is not None:
            params["original_max_position_embeddings"] = top_level
        elif params.get("original_max_position_embeddings") is None and params["max_position_embeddings"]:
            params["original_max_position_embeddings"] = params["max_position_embeddings"]
    return params


# ----------------------------------------------------------------------------------------------------------------
# cos/sin
# ----------------------------------------------------------------------------------------------------------------

def cos_sin_at(positions: torch.Tensor, inv_freq: torch.Tensor, *, attention_scaling: float = 1.0,
               device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width ``cos(p * inv_freq) * attention_scaling`` (and sin) for the given integer ``positions``.

    Shape ``positions.shape + (len(inv_freq),)``. The angle and cos/sin are float64; only the result is rounded
    to ``dtype``. Row ``p`` is bit-identical to row ``p`` of ``cos_sin_table`` (same arithmetic, elementwise).
    """
    freqs = inv_freq.to(device=device if device is not None else inv_freq.device, dtype=torch.float64)
    # float64 holds every integer position below 2**53 exactly, so the position itself is never rounded.
    theta = positions.to(device=freqs.device, dtype=torch.float64)[..., None] * freqs
    cos = (torch.cos(theta) * attention_scaling).to(dtype)
    sin = (torch.sin(theta) * attention_scaling).to(dtype)
    return cos, sin


def cos_sin_from_freqs(freqs: torch.Tensor, *, interleaved: bool = False, dtype: torch.dtype = torch.float32,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width ``(positions, rotary_dim/2)`` cos/sin tables from Transformer Engine's ``freqs``: the angles of
    every position, shape ``(positions, 1, 1, rotary_dim)`` (or ``(positions, rotary_dim)``), each pair's angle
    twice, as the two halves (NeoX) or side by side (``interleaved``: GPT-J), as TE's ``RotaryPositionEmbedding``
    returns them. cos/sin are evaluated in float64 of the given angles (TE forms them in float32, so its tables
    carry float32 angle errors) and rounded to ``dtype``. Row ``p`` serves position ``p``: pass the tables to
    ``apply_rope`` with the same ``interleaved``.
    """
    if freqs.ndim == 4 and freqs.shape[1:3] == (1, 1):
        freqs = freqs[:, 0, 0]
    if freqs.ndim != 2 or freqs.shape[-1] % 2:
        raise ValueError(f"freqs must be (positions, 1, 1, rotary_dim) or (positions, rotary_dim) with an even "
                         f"rotary_dim, got shape {tuple(freqs.shape)}")
    half = freqs.shape[-1] // 2
    angles = (freqs[:, 0::2] if interleaved else freqs[:, :half]).to(torch.float64)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def cos_sin_table(max_positions: int, rotary_dim: int | None = None, *, base: float = DEFAULT_BASE,
                  inv_freq: torch.Tensor | None = None, attention_scaling: float = 1.0,
                  device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width tables ``cos[p, i] = cos(p * inv_freq[i]) * attention_scaling`` (and sin) for ``p < max_positions``.

    Shape ``(max_positions, rotary_dim/2)``. Angles and cos/sin are evaluated in float64 on ``device``; only the
    result is rounded to ``dtype`` (float32 by default). For a scaled rope type pass ``inv_freq`` and
    ``attention_scaling`` from ``rope_init``.
    """
    if inv_freq is None:
        if rotary_dim is None:
            raise TypeError("cos_sin_table needs rotary_dim or inv_freq")
        inv_freq = inverse_frequencies(rotary_dim, base)  # (on the CPU: the table goes to the default device)
        device = device if device is not None else torch.get_default_device()
    if not isinstance(inv_freq, torch.Tensor) or not inv_freq.is_floating_point() or inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must be a 1-D floating tensor (rotary_dim/2,), got "
                         f"{getattr(inv_freq, 'dtype', type(inv_freq).__name__)} of shape "
                         f"{tuple(getattr(inv_freq, 'shape', ()))}")
    if max_positions < 0:
        raise ValueError(f"max_positions must be >= 0, got {max_positions}")
    target = device if device is not None else inv_freq.device
    positions = torch.arange(max_positions, dtype=torch.float64, device=target)
    return cos_sin_at(positions, inv_freq, attention_scaling=attention_scaling, device=target, dtype=dtype)
