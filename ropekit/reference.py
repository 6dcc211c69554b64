"""Float64 references: the single definition of "correct" for every test and notebook.

Everything here is plain PyTorch in float64, written to be read rather than to be fast.

Vocabulary
----------
* A head vector ``x`` of ``head_dim`` channels; the first ``rotary_dim`` of them are rotated, the tail passes through.
* The rotated channels form ``rotary_dim / 2`` pairs. Pair ``i`` turns by the angle ``position * inv_freq[i]``.
* **NeoX pairing** (``rotate_half``, Llama/HF default): pair ``i`` is channels ``(i, i + rotary_dim/2)``.
* **GPT-J pairing** (interleaved): pair ``i`` is channels ``(2i, 2i + 1)``.
* The forward rotates by ``+θ``; its backward (and its inverse) rotates by ``-θ`` (the conjugate rotation).

Tensors are ``(batch, seq, heads, head_dim)`` ("bshd") or packed ``(tokens, heads, head_dim)`` ("thd"); the
position of every token is an integer tensor of the token shape (``(batch, seq)`` or ``(tokens,)``).
"""

from __future__ import annotations

import torch

from .frequencies import inverse_frequencies

__all__ = [
    "token_positions",
    "varlen_positions",
    "angles",
    "rotate_pairs",
    "rope",
    "rope_backward",
    "mrope_pair_positions",
    "mrope",
    "nope_temperature",
    "rope_from_cos_sin",
    "rotate_half",
    "rope_rotate_half",
    "rope_complex",
    "rope_matrix",
]


def token_positions(batch: int, seqlen: int, *, offsets=0, position_ids=None) -> torch.Tensor:
    """Positions of a ``(batch, seqlen)`` block of tokens, as int64 ``(batch, seqlen)``.

    ``offsets`` is a scalar (every sequence starts there) or a ``(batch,)`` tensor (per-sequence start, e.g. the
    length of each KV cache in decode). ``position_ids`` (anything that broadcasts to ``(batch, seqlen)``) wins over
    offsets when given.
    """
    if position_ids is not None:
        return torch.as_tensor(position_ids).to(torch.int64).cpu().expand(batch, seqlen).clone()
    base = torch.arange(seqlen, dtype=torch.int64).expand(batch, seqlen)
    offsets = torch.as_tensor(offsets, dtype=torch.int64).cpu()
    return base + offsets.reshape(-1, 1) if offsets.ndim else base + offsets


def varlen_positions(cu_seqlens, *, offsets=0) -> torch.Tensor:
    """Positions of packed sequences: token ``t`` of sequence ``j`` sits at ``t - cu_seqlens[j] + offsets[j]``."""
    cu_seqlens = torch.as_tensor(cu_seqlens, dtype=torch.int64).cpu()
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    offsets = torch.as_tensor(offsets, dtype=torch.int64).cpu().expand(len(lengths))
    parts = [torch.arange(n, dtype=torch.int64) + int(o) for n, o in zip(lengths, offsets)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``θ[..., i] = position * inv_freq[i]`` in float64 (shape: positions.shape + (rotary_dim/2,))."""
    return positions.to(torch.float64).cpu()[..., None] * inv_freq.to(torch.float64).cpu()


def _pairs(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _unpairs(first: torch.Tensor, second: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((first, second), dim=-1).flatten(-2)
    return torch.cat((first, second), dim=-1)


def rotate_pairs(x_rot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False,
                 conjugate: bool = False) -> torch.Tensor:
    """Rotate the pairs of ``x_rot`` (last dim = rotary_dim) by angles whose cos/sin broadcast to ``(..., rotary_dim/2)``.

    ``(a, b) -> (a cos θ - b sin θ, b cos θ + a sin θ)``; ``conjugate`` rotates by ``-θ`` instead.
    """
    x_rot = x_rot.to(torch.float64)
    cos, sin = cos.to(torch.float64), sin.to(torch.float64)
    if conjugate:
        sin = -sin
    a, b = _pairs(x_rot, interleaved)
    return _unpairs(a * cos - b * sin, b * cos + a * sin, interleaved)


def rope(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0, rotary_dim: int | None = None,
         inv_freq: torch.Tensor | None = None, interleaved: bool = False, conjugate: bool = False,
         attention_scaling: float = 1.0) -> torch.Tensor:
    """Rotary embedding of ``x`` (``(..., heads, head_dim)``) at integer ``positions`` (x's token shape), in float64.

    Returns a float64 tensor on the CPU. ``inv_freq`` overrides ``base`` (used for the scaled rope types);
    ``attention_scaling`` multiplies cos and sin (YaRN / LongRoPE's attention factor).
    """
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and <= head_dim ({head_dim}), got {rotary_dim}")
    freqs = inverse_frequencies(rotary_dim, base) if inv_freq is None else inv_freq
    theta = angles(positions, freqs)[..., None, :]  # broadcast over heads
    cos, sin = torch.cos(theta) * attention_scaling, torch.sin(theta) * attention_scaling
    x64 = x.to(torch.float64).cpu()  # differentiable: gradcheck runs on the reference too
    rotated = rotate_pairs(x64[..., :rotary_dim], cos, sin, interleaved=interleaved, conjugate=conjugate)
    return torch.cat((rotated, x64[..., rotary_dim:]), dim=-1)


def rope_backward(grad_out: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """Gradient of :func:`rope` w.r.t. its input: the rotation is orthogonal, so the backward is the rotation by -θ."""
    kwargs["conjugate"] = not kwargs.get("conjugate", False)
    return rope(grad_out, positions, **kwargs)


def mrope_pair_positions(position_ids: torch.Tensor, mrope_section, *, mrope_interleaved: bool = False) -> torch.Tensor:
    """M-RoPE's position of every rotary pair: ``position_ids`` ``(3, *tokens)`` (temporal, height, width) ->
    ``(*tokens, sum(mrope_section))`` int64.

    Contiguous sections (Qwen2-VL, Qwen2.5-VL; transformers' ``apply_multimodal_rotary_pos_emb``, vLLM's
    ``MRotaryEmbedding``): the first ``t`` pairs take the temporal position, the next ``h`` the height, the last
    ``w`` the width. Interleaved (Qwen3-VL; transformers' ``apply_interleaved_mrope``, vLLM's
    ``apply_interleaved_rope``): pair ``i`` takes the height position when ``i % 3 == 1`` and ``i < 3h``, the width
    when ``i % 3 == 2`` and ``i < 3w``, the temporal one otherwise.
    """
    t, h, w = (int(n) for n in mrope_section)
    ids = torch.as_tensor(position_ids).to(torch.int64).cpu()
    columns = []
    for i in range(t + h + w):
        if mrope_interleaved:
            axis = 1 if (i % 3 == 1 and i < 3 * h) else 2 if (i % 3 == 2 and i < 3 * w) else 0
        else:
            axis = 0 if i < t else 1 if i < t + h else 2
        columns.append(ids[axis])
    return torch.stack(columns, dim=-1)


def mrope(x: torch.Tensor, position_ids: torch.Tensor, mrope_section, *, mrope_interleaved: bool = False,
          base: float = 10000.0, rotary_dim: int | None = None, inv_freq: torch.Tensor | None = None,
          interleaved: bool = False, conjugate: bool = False) -> torch.Tensor:
    """Multimodal RoPE of ``x`` (``(*tokens, heads, head_dim)``), in float64 on the CPU: pair ``i`` turns by
    ``pair_position[i] * inv_freq[i]`` with :func:`mrope_pair_positions`' positions (``position_ids``:
    ``(3, *tokens)``). ``interleaved``: GPT-J pairing, as in :func:`rope`."""
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    freqs = inverse_frequencies(rotary_dim, base) if inv_freq is None else inv_freq
    pair_positions = mrope_pair_positions(position_ids, mrope_section, mrope_interleaved=mrope_interleaved)
    theta = (pair_positions.to(torch.float64) * freqs.to(torch.float64).cpu()[:rotary_dim // 2])[..., None, :]
    x64 = x.to(torch.float64).cpu()
    rotated = rotate_pairs(x64[..., :rotary_dim], torch.cos(theta), torch.sin(theta), interleaved=interleaved,
                           conjugate=conjugate)
    return torch.cat((rotated, x64[..., rotary_dim:]), dim=-1)


def nope_temperature(x: torch.Tensor, positions: torch.Tensor, floor_scale, attn_scale: float) -> torch.Tensor:
    """Llama 4's NoPE layers (transformers' ``attn_temperature_tuning``): nothing rotates, and every channel of ``x``
    (``(*tokens, heads, head_dim)``) is multiplied by ``log(floor((position + 1) / floor_scale) + 1) * attn_scale +
    1`` of its token, in float64 on the CPU (``positions``: ``x``'s token shape)."""
    pos = torch.as_tensor(positions).to(torch.int64).cpu()
    turns = torch.div(pos + 1, int(floor_scale), rounding_mode="floor").to(torch.float64)
    scale = torch.log(turns + 1) * float(attn_scale) + 1
    return x.to(torch.float64).cpu() * scale[..., None, None]


def rope_from_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False,
                      conjugate: bool = False) -> torch.Tensor:
    """Rotary embedding with full-width cos/sin that broadcast to ``x[..., :rotary_dim]`` (HF's layout), in float64.

    Channel ``j`` of the output is ``x_j cos_j + partner(x)_j sin_j`` where the partner of the first channel of a pair
    is ``-second`` and of the second is ``+first``: exactly ``x * cos + rotate_half(x) * sin`` for NeoX pairing.
    """
    rotary_dim = cos.shape[-1]
    x64 = x.to(torch.float64).cpu()  # differentiable: gradcheck runs on the reference too
    cos, sin = cos.detach().to(torch.float64).cpu(), sin.detach().to(torch.float64).cpu()
    if conjugate:
        # the transpose of the map: the rotation by -θ when a pair's two channels share their angle (as every table
        # does), and for rows whose halves differ the exact vector-Jacobian product of the formula above
        sin_a, sin_b = _pairs(sin, interleaved)
        sin = _unpairs(-sin_b, -sin_a, interleaved)
    a, b = _pairs(x64[..., :rotary_dim], interleaved)
    partner = _unpairs(-b, a, interleaved)
    return torch.cat((x64[..., :rotary_dim] * cos + partner * sin, x64[..., rotary_dim:]), dim=-1)


# --- Three more ways to write the same rotation; the tests check that all of them agree. -------------------------

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's helper: ``(x1, x2) -> (-x2, x1)`` over the two halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_rotate_half(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
    """NeoX rotation as transformers writes it: ``x * cos + rotate_half(x) * sin`` with full-width cos/sin."""
    theta = angles(positions, inverse_frequencies(x.shape[-1], base))[..., None, :]
    theta = torch.cat((theta, theta), dim=-1)
    x = x.to(torch.float64).cpu()
    return x * torch.cos(theta) + rotate_half(x) * torch.sin(theta)


def rope_complex(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
    """GPT-J rotation as the RoFormer paper writes it: each pair is a complex number multiplied by ``e^{iθ}``."""
    theta = angles(positions, inverse_frequencies(x.shape[-1], base))[..., None, :]
    z = torch.view_as_complex(x.to(torch.float64).cpu().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2)


def rope_matrix(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
    """GPT-J rotation as a block-diagonal matrix ``R(θ)`` of 2x2 rotations applied to each head vector."""
    head_dim = x.shape[-1]
    theta = angles(positions, inverse_frequencies(head_dim, base))  # (..., head_dim/2)
    c, s = torch.cos(theta), torch.sin(theta)
    blocks = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)  # (..., head_dim/2, 2, 2)
    rotation = torch.zeros(*theta.shape[:-1], head_dim, head_dim, dtype=torch.float64)
    for i in range(head_dim // 2):
        rotation[..., 2 * i:2 * i + 2, 2 * i:2 * i + 2] = blocks[..., i, :, :]
    # one rotation matrix per token, shared by all heads
    return torch.einsum("...ij,...hj->...hi", rotation, x.to(torch.float64).cpu())


# --- The fused pre-processing ops' references: QK-norm, cache writes, float8. -----------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, *, eps: float, weight_offset: float = 0.0,
             over_heads: bool = False) -> torch.Tensor:
    """Per-head RMSNorm over the last dimension in float64: ``x * rsqrt(mean(x^2) + eps) * (weight_offset + w)``
    (transformers' Qwen3 ``RMSNorm`` with ``weight_offset=0``, Gemma's ``1 + w`` with 1); ``weight`` None: no weight,
    ``x * rsqrt(mean(x^2) + eps)`` (Llama 4's ``Llama4TextL2Norm``). ``over_heads``: over the last two dimensions
    ``(heads, head_dim)`` together, a ``(heads * head_dim,)`` weight (OLMo-2's RMSNorm of the whole q or k
    projection, before it is split into heads). Differentiable."""
    x64 = x.to(torch.float64).cpu()
    if over_heads:
        return rms_norm(x64.flatten(-2), weight, eps=eps, weight_offset=weight_offset).unflatten(-1, x64.shape[-2:])
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * (weight_offset + weight.to(torch.float64).cpu())


def rope_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, *,
               interleaved: bool = False) -> torch.Tensor:
    """Rotate ``x`` (``(..., heads, head_dim)``, float64) by half-width cos/sin table rows at integer ``positions``
    (x's token shape); the table's width fixes rotary_dim, channels past it pass through."""
    rotary_dim = 2 * cos.shape[-1]
    rows = positions.to(torch.int64).cpu()
    c = cos.detach().to(torch.float64).cpu()[rows][..., None, :]
    s = sin.detach().to(torch.float64).cpu()[rows][..., None, :]
    x64 = x.to(torch.float64).cpu()
    return torch.cat((rotate_pairs(x64[..., :rotary_dim], c, s, interleaved=interleaved), x64[..., rotary_dim:]), -1)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest float8 e4m3fn value (ties to even), saturating at ±448 (infinities too), NaN kept;
    returned as float64."""
    x64 = x.to(torch.float64)
    saturated = torch.where(torch.isnan(x64), x64, x64.clamp(-448.0, 448.0))
    return saturated.to(torch.float8_e4m3fn).to(torch.float64)


def e5m2(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest float8 e5m2 value (ties to even), saturating at ±57344 (infinities too), NaN kept;
    returned as float64."""
    x64 = x.to(torch.float64)
    saturated = torch.where(torch.isnan(x64), x64, x64.clamp(-57344.0, 57344.0))
    return saturated.to(torch.float8_e5m2).to(torch.float64)


def int8(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest integer (ties to even), saturating at [-128, 127], NaN as 0; returned as float64."""
    x64 = torch.nan_to_num(x.to(torch.float64), nan=0.0)
    return torch.round(x64.clamp(-128.0, 127.0))


# each quantised cache format: its rounding (float64 -> float64) and the largest value it stores
CACHE_FORMATS = {torch.float8_e4m3fn: (e4m3, 448.0), torch.float8_e5m2: (e5m2, 57344.0), torch.int8: (int8, 127.0)}


def token_head_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-(token, head) scale of head vectors ``x`` ``(..., head_dim)`` stored as ``dtype`` (a key of
    :data:`CACHE_FORMATS`): ``max |x|`` (NaN not counted) over the format's largest value, rounded to float32 and
    floored at the smallest normal float32 (an all-zero head keeps a finite, nonzero scale); ``(..., 1)`` float64."""
    x64 = x.to(torch.float64)
    amax = torch.where(torch.isnan(x64), 0.0, x64.abs()).amax(-1, keepdim=True)
    scale = (amax / CACHE_FORMATS[dtype][1]).to(torch.float32).clamp_min(torch.finfo(torch.float32).tiny)
    return scale.to(torch.float64)


def quantise(x: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    """What a quantised cache of ``dtype`` stores for ``x`` at ``scale`` (broadcast against x): the float32 quotient
    ``x / scale`` (x and the scale in float32, the division correctly rounded, as docs/fused.md states) rounded to
    the format (saturating), as float64 values of that format. (The float64 quotient would round differently where
    it lies within a float32 rounding of one of int8's midpoints.)"""
    quotient = x.to(torch.float32) / torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return CACHE_FORMATS[dtype][0](quotient.to(torch.float64))


def dequantise(stored: torch.Tensor, scale) -> torch.Tensor:
    """The attention's reader of a quantised cache: the stored values (float8 or int8) times their scale, float64."""
    return stored.to(torch.float64).cpu() * torch.as_tensor(scale, dtype=torch.float64).cpu()


# DeepSeek's fp8_ds_mla latent-cache entry (vLLM's kv_cache_dtype="fp8_ds_mla", what FlashMLA's sparse attention
# reads): one token's bytes are [kv_c in e4m3, one float32 scale a tile of DS_MLA_TILE channels | k_pe in the model's
# dtype], the scale a tile's max|x| / 448 as per (token, head) (token_head_scale, a tile for the head vector).
DS_MLA_TILE = 128


def ds_mla_entry(kv_c: torch.Tensor, k_pe: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp8_ds_mla entries ``(..., latent + 4 * latent / DS_MLA_TILE + rope_dim * itemsize)`` bytes (uint8, on
    the CPU) that a writer stores for latent vectors ``kv_c (..., latent)`` and the rotated ``k_pe (..., rope_dim)``
    (float64 truths): each tile's scale (:func:`token_head_scale` of the tile, float32), its values
    :func:`quantise`'d to e4m3 at it, and k_pe rounded to ``dtype``."""
    tiles = kv_c.to(torch.float64).cpu().unflatten(-1, (-1, DS_MLA_TILE))
    scales = token_head_scale(tiles, torch.float8_e4m3fn)
    values = quantise(tiles, scales, torch.float8_e4m3fn).to(torch.float8_e4m3fn).flatten(-2)
    return torch.cat((values.view(torch.uint8), scales[..., 0].to(torch.float32).contiguous().view(torch.uint8),
                      k_pe.cpu().to(dtype).contiguous().view(torch.uint8)), -1)


def ds_mla_read(entries: torch.Tensor, latent: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's reader of fp8_ds_mla entries (uint8 ``(..., entry)``): ``(kv_c, k_pe)`` in float64, kv_c as
    each e4m3 value times its tile's float32 scale, k_pe the stored ``dtype`` values."""
    entries = entries.cpu().contiguous()
    tiles = latent // DS_MLA_TILE
    values = entries[..., :latent].view(torch.float8_e4m3fn).to(torch.float64).unflatten(-1, (tiles, DS_MLA_TILE))
    scales = entries[..., latent:latent + 4 * tiles].view(torch.float32).to(torch.float64)
    kv_c = (values * scales[..., None]).flatten(-2)
    return kv_c, entries[..., latent + 4 * tiles:].view(dtype).to(torch.float64)


# NVFP4 (NVIDIA's 4-bit float, as FlashInfer's and vLLM's NVFP4 KV caches store it): e2m1 values (sign bit 3, two
# exponent bits, one mantissa bit; magnitude code i of the nibble's bits 0-2 is E2M1_VALUES[i]), two a byte with
# element 2i in the low nibble, one e4m3 block scale per 16 consecutive elements, one float32 global scale a tensor:
# value = e2m1 * block_scale * global_scale
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16


def e2m1(x: torch.Tensor) -> torch.Tensor:
    """float64 -> the nearest e2m1 value (ties to the even code: the one whose mantissa bit is 0), saturating at ±6
    (infinities too), NaN as 0; returned as float64 with x's sign."""
    x64 = x.to(torch.float64)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    magnitude = torch.nan_to_num(x64.abs(), nan=0.0).clamp(max=6.0)
    distance = (magnitude[..., None] - grid).abs()
    nearest = distance == distance.amin(-1, keepdim=True)
    even = torch.arange(8) % 2 == 0
    index = (nearest * (1 + even.to(torch.int64))).argmax(-1)  # a tie: the even code
    return torch.where(torch.signbit(x64), -grid[index], grid[index])


def nvfp4_quantise(x: torch.Tensor, global_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """What an NVFP4 cache stores for head vectors ``x`` ``(..., head_dim)`` at ``global_scale``, in float64: (the e2m1
    values ``(..., head_dim)``, the e4m3 block scales ``(..., head_dim / 16)``). Each 16 consecutive elements get
    ``block = e4m3(amax / (6 * global_scale))`` (amax with NaN not counted), each element ``e2m1(x / (block *
    global_scale))`` (0 where that product is 0)."""
    blocks = x.to(torch.float64).cpu().unflatten(-1, (-1, NVFP4_BLOCK))
    g = float(torch.as_tensor(global_scale, dtype=torch.float64).reshape(()))
    amax = torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax(-1)
    block = e4m3(amax / (6 * g))
    dequant = (block * g)[..., None]
    values = torch.where(dequant == 0, 0.0 * blocks, e2m1(blocks / torch.where(dequant == 0, 1.0, dequant)))
    return values.flatten(-2), block


def nvfp4_dequantise(packed: torch.Tensor, block_scales: torch.Tensor, global_scale) -> torch.Tensor:
    """The attention's reader of an NVFP4 cache: bytes ``(..., head_dim / 2)`` (element 2i in the low nibble) and
    e4m3 block scales ``(..., head_dim / 16)`` (``torch.float8_e4m3fn`` or its bytes) -> ``e2m1 * block_scale *
    global_scale``, float64 ``(..., head_dim)``."""
    packed = packed.cpu().view(torch.uint8).to(torch.int64)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    values = torch.where(codes & 0x8 != 0, -grid[codes & 0x7], grid[codes & 0x7])
    scales = block_scales.cpu().view(torch.float8_e4m3fn).to(torch.float64).repeat_interleave(NVFP4_BLOCK, -1)
    return values * scales * float(torch.as_tensor(global_scale, dtype=torch.float64).reshape(()))


def e2m1_spacing(values: torch.Tensor) -> torch.Tensor:
    """The distance between neighbouring e2m1 values at ``|values|`` (float64; past 6 that of [4, 6])."""
    magnitude = values.to(torch.float64).abs()
    return torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))


def paged_cache_write(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """A float64 copy of ``cache`` ``(num_blocks, block_size, heads, dim)`` with token ``t``'s ``values[t]``
    (``(tokens, heads, dim)``) at slot ``slot_mapping[t] = block * block_size + row``; slot -1 writes nothing."""
    out = cache.to(torch.float64).cpu().clone()
    flat = out.view(-1, *out.shape[2:])
    for t, slot in enumerate(slot_mapping.cpu().tolist()):
        if slot >= 0:
            flat[slot] = values[t].to(torch.float64).cpu()
    return out


def contiguous_cache_write(cache: torch.Tensor, values: torch.Tensor, offsets) -> torch.Tensor:
    """A float64 copy of ``cache`` ``(batch, max_seq, heads, dim)`` with sequence ``b``'s tokens ``values[b]``
    (``(batch, seq, heads, dim)``, or a list of ``(seq_b, heads, dim)``) at rows ``offsets[b] + s``."""
    out = cache.to(torch.float64).cpu().clone()
    for b, offset in enumerate(torch.as_tensor(offsets).reshape(-1).tolist()):
        rows = values[b].to(torch.float64).cpu()
        out[b, offset:offset + rows.shape[0]] = rows
    return out


__all__ += ["rms_norm", "rope_table", "e4m3", "e5m2", "int8", "token_head_scale", "quantise", "dequantise", "e2m1",
            "nvfp4_quantise", "nvfp4_dequantise", "e2m1_spacing", "paged_cache_write", "contiguous_cache_write",
            "ds_mla_entry", "ds_mla_read"]
