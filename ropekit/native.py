"""The native backend: what the kernels compute, in plain PyTorch ops (vLLM's ``forward_native``).

Without a GPU, and for CPU tensors on a machine with one, this is where ``apply_rope`` and the fused ops end
(``ropekit.device.backend_for``). It is the last step of the one path, not a path of its own: a call is validated
and planned exactly as for a launch, then :func:`rope` takes the arguments of v4's launcher
(:func:`ropekit.triton.launch.rope_v4`) and :func:`fused` those of the fused kernel's
(:func:`ropekit.triton.fused.launch_fused`), and they write the same outputs.

The semantics are the kernels' (docs/api.md, docs/fused.md):

* Math in float32 (float64 for float64 inputs), rounded once to the output's dtype; with ``eager_rounding``, each
  product and the sum rounded, as eager PyTorch's ``x * cos + rotate_half(x) * sin`` rounds.
* Pair ``(a, b)`` (NeoX: channels ``i, i + R/2``; GPT-J: ``2i, 2i + 1``) becomes ``(a cos_a - b sin_a, b cos_b + a
  sin_b)``; ``conjugate`` (and the backward) applies the transpose: ``sin_a, sin_b <- -sin_b, -sin_a``.
* A table position outside the table reads NaN angles (the token comes out NaN, loudly).
* Without a table (``inv_freq``): cos and sin of the float64 angle ``position * inv_freq``, times ``scale``, rounded
  once to the math dtype (the kernel reduces the angle mod 2π in float64 first, so its bits may differ in the last
  place of the math dtype).
* Varlen: sequence ``b`` covers the packed rows ``cu[b] + s`` for ``s < min(len_b, max_seqlen)``; rows outside
  ``[0, tokens)`` are never touched and rows no sequence covers are not written, whatever ``cu_seqlens`` holds.
* Caches: the rotated k (QK-normed first when weights are given) and v go to ``slot = slots[token]`` (paged: block
  ``slot // block_size``, row ``slot % block_size``) or to row ``offsets[b] + s`` of sequence ``b`` (contiguous); a
  slot or row outside the cache (-1 among them) writes nothing. A quantised cache receives ``x / scale`` (float32,
  correctly rounded) rounded to float8 e4m3 or e5m2 (saturating at +-448, +-57344) or int8 (saturating at
  [-128, 127]), at one scale, one a head, or one a (token, head) computed from the values and written beside.
* A rotated tile that only one store at one scale reads (a float8 q; k into a float8 or int8 cache at a per-tensor
  scale, k's own output not written; the norm, if any, before the rotation) is rotated by the angles times
  ``1 / scale`` (float32, correctly rounded): its rotated channels store their format's rounding of that rotation,
  the channels past ``rotary_dim`` ``x / scale``.

The operations run in the kernels' order, so the bits are the interpreter's (and the GPU's, where it does not contract
a product and a sum into one FMA), except the norm's sum of squares and the weight gradient's sums, whose order of
summation is PyTorch's. ``tests/test_native.py`` compares both backends bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .positions import SCALAR_OFFSET, SEQ_OFFSETS, PositionSpec, mrope_axis_of_pair, mrope_sections

__all__ = ["rope", "fused", "e4m3_bits", "quantised", "token_head_scales"]

CACHE_CONTIGUOUS, CACHE_PAGED, CACHE_PAGE_TABLE = 1, 2, 3  # the fused kernel's cache modes (ropekit.triton.fused)


# --------------------------------------------------------------------------------------------------------------------
# Tokens, angles and pairs: what every op shares.
# --------------------------------------------------------------------------------------------------------------------

class _Tokens(NamedTuple):
    """The tokens a call covers. Without varlen: every ``(b, s)`` of the ``(batch, seq)`` grid (``rows`` None,
    ``seq`` ``(batch, 1)``, ``local`` ``(1, seq)``: they broadcast). Varlen: the packed rows the sequences cover,
    each with its sequence and its index inside it (all ``(n,)``)."""

    rows: Optional[torch.Tensor]
    seq: torch.Tensor
    local: torch.Tensor

    def take(self, x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The covered tokens' rows of a token-major tensor (the tensor itself without varlen)."""
        return x if x is None or self.rows is None else x[self.rows]

    def put(self, out: torch.Tensor, channels: slice, values: torch.Tensor) -> None:
        """Write ``values`` (the covered tokens) into ``channels`` of ``out``, through its strides, rounded once to
        ``out``'s dtype (a copy between dtypes rounds to nearest, ties to even)."""
        if self.rows is None:
            out[..., channels].copy_(values)
        else:
            out[self.rows, ..., channels] = values.to(out.dtype)


def _tokens(spec: PositionSpec, n_batch: int, seqlen: int, n_rows: int, device) -> _Tokens:
    if not spec.is_varlen:
        return _Tokens(None, torch.arange(n_batch, device=device)[:, None], torch.arange(seqlen, device=device)[None])
    cu = spec.cu_seqlens.to(torch.int64)
    local = torch.arange(spec.max_seqlen, device=device)
    rows = cu[:-1, None] + local  # (n_seqs, max_seqlen)
    covered = (local < (cu[1:] - cu[:-1])[:, None]) & (rows >= 0) & (rows < n_rows)
    seq = torch.arange(n_batch, device=device)[:, None].expand_as(rows)
    return _Tokens(rows[covered], seq[covered], local.expand_as(rows)[covered])


def _positions(spec: PositionSpec, tokens: _Tokens) -> torch.Tensor:
    """Every covered token's table position (``ropekit.positions``' modes); M-RoPE's three, on a last axis."""
    if spec.is_mrope:
        ids = spec.tensor.to(torch.int64)  # (3, batch, seq) or (3, tokens)
        return torch.stack([tokens.take(axis) for axis in ids], -1)
    if spec.mode == SCALAR_OFFSET:
        return tokens.local + spec.offset
    if spec.mode == SEQ_OFFSETS:
        return spec.tensor.to(torch.int64)[tokens.seq] + tokens.local
    return tokens.take(spec.tensor.to(torch.int64))  # position ids: (batch, seq), or (tokens,) packed


def _pair_positions(spec: PositionSpec, tokens: _Tokens) -> torch.Tensor:
    """Every covered token's position per pair (``(..., rotary_dim / 2)`` with M-RoPE: its axis' position), or per
    token (``(..., 1)``, shared by the pairs)."""
    position = _positions(spec, tokens)
    if not spec.is_mrope:
        return position[..., None]
    axis = torch.tensor(mrope_axis_of_pair(*mrope_sections(spec.mode)), device=position.device)
    return position[..., axis]


def _pairs(x: torch.Tensor, rotary_dim: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and the second channel of every rotary pair: NeoX halves, or GPT-J's even and odd channels."""
    if interleaved:
        return x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    return x[..., :rotary_dim // 2], x[..., rotary_dim // 2:rotary_dim]


def _pair_channels(rotary_dim: int, interleaved: bool) -> tuple[slice, slice]:
    """Where the first and the second channels of the pairs lie (what :func:`_pairs` reads)."""
    if interleaved:
        return slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    return slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)


def _joined(a: torch.Tensor, b: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The inverse of :func:`_pairs`: the rotary channels in order."""
    return torch.stack((a, b), -1).flatten(-2) if interleaved else torch.cat((a, b), -1)


def _angles(cos, sin, spec: PositionSpec, tokens: _Tokens, rotary_dim: int, interleaved: bool, per_token: bool,
            conjugate: bool, math: torch.dtype, inv_freq: Optional[torch.Tensor] = None, scale: float = 1.0) -> tuple:
    """``(cos_a, sin_a, cos_b, sin_b)`` of every covered token's pairs, in the math dtype, with a heads axis to
    broadcast over: from the half-width table at the token's position (NaN outside the table), from the token's
    own full-width row (channel a's and channel b's columns), or computed from the position and ``inv_freq``. With
    M-RoPE, each pair at the position of its axis."""
    if inv_freq is not None:
        angle = _pair_positions(spec, tokens).to(torch.float64) * inv_freq[:rotary_dim // 2].to(torch.float64)
        cos_a = cos_b = (torch.cos(angle) * scale).to(math)
        sin_a = sin_b = (torch.sin(angle) * scale).to(math)
    elif per_token:
        cos_a, cos_b = _pairs(tokens.take(cos).to(math), rotary_dim, interleaved)
        sin_a, sin_b = _pairs(tokens.take(sin).to(math), rotary_dim, interleaved)
    elif spec.is_mrope:
        position = _pair_positions(spec, tokens)  # (..., rotary_dim / 2): a row per pair
        inside = (position >= 0) & (position < cos.shape[0])
        row, column = torch.where(inside, position, 0), torch.arange(rotary_dim // 2, device=position.device)
        cos_a = cos_b = torch.where(inside, _padded(cos)[row, column].to(math), float("nan"))
        sin_a = sin_b = torch.where(inside, _padded(sin)[row, column].to(math), float("nan"))
    else:
        position = _positions(spec, tokens)
        inside = ((position >= 0) & (position < cos.shape[0]))[..., None]
        row = torch.where(inside[..., 0], position, 0)
        half = rotary_dim // 2
        cos_a = cos_b = torch.where(inside, _padded(cos)[:, :half][row].to(math), float("nan"))
        sin_a = sin_b = torch.where(inside, _padded(sin)[:, :half][row].to(math), float("nan"))
    if conjugate:
        sin_a, sin_b = -sin_b, -sin_a
    return tuple(t.unsqueeze(-2) for t in (cos_a, sin_a, cos_b, sin_b))


def _padded(table: torch.Tensor) -> torch.Tensor:
    """A table with at least one row, so that row 0 can be gathered where no position lies inside it (the gathered
    values are then replaced by NaN, as the kernel's masked loads give)."""
    return table if table.shape[0] else table.new_zeros(1, *table.shape[1:])


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``dtype`` (to nearest, ties to even), kept in x's dtype."""
    return x.to(dtype).to(x.dtype)


def _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, out_dtype=None, eager_rounding: bool = False):
    """(a, b) -> (a cos_a - b sin_a, b cos_b + a sin_b); with ``eager_rounding`` each product and the sum rounded to
    ``out_dtype``."""
    if eager_rounding:
        return (_round(_round(x_a * cos_a, out_dtype) - _round(x_b * sin_a, out_dtype), out_dtype),
                _round(_round(x_b * cos_b, out_dtype) + _round(x_a * sin_b, out_dtype), out_dtype))
    return x_a * cos_a - x_b * sin_a, x_b * cos_b + x_a * sin_b


def _math_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _same_view(x: torch.Tensor, out: torch.Tensor) -> bool:
    return out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.shape == x.shape


# --------------------------------------------------------------------------------------------------------------------
# apply_rope: v4's launcher, natively.
# --------------------------------------------------------------------------------------------------------------------

def rope(q: torch.Tensor, k: Optional[torch.Tensor], cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], *,
         out_q: torch.Tensor, out_k: Optional[torch.Tensor], positions: PositionSpec, rotary_dim: int,
         interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False, copy_tail: bool = True,
         eager_rounding: bool = False, inv_freq: Optional[torch.Tensor] = None, scale: float = 1.0,
         nope: Optional[tuple] = None) -> None:
    """:func:`ropekit.triton.launch.rope_v4`'s arguments and outputs (q/k/out ``(batch, seq, heads, head_dim)`` views,
    ``(tokens, heads, head_dim)`` for varlen), computed in PyTorch ops. Trusts its caller, as the launcher does."""
    varlen = positions.is_varlen
    n_batch = positions.cu_seqlens.shape[0] - 1 if varlen else q.shape[0]
    tokens = _tokens(positions, n_batch, 0 if varlen else q.shape[1], q.shape[0], q.device)
    math, head_dim = _math_dtype(q), q.shape[-1]
    if nope is not None:
        _nope(q, k, out_q, out_k, positions, tokens, math, *nope)
        return
    angles = _angles(cos, sin, positions, tokens, rotary_dim, interleaved, cos_per_token, conjugate, math, inv_freq,
                     scale)
    in_place = _same_view(q, out_q) and (k is None or _same_view(k, out_k))
    for x, out in ((q, out_q), (k, out_k)):
        if x is None or x.numel() == 0:
            continue
        x_a, x_b = _pairs(tokens.take(x[..., :rotary_dim]).to(math), rotary_dim, interleaved)
        y_a, y_b = _rotate(x_a, x_b, *angles, out.dtype, eager_rounding)
        tail = tokens.take(x[..., rotary_dim:]) if copy_tail and rotary_dim < head_dim and not in_place else None
        for channels, values in zip(_pair_channels(rotary_dim, interleaved), (y_a, y_b)):
            tokens.put(out, channels, values)  # (in place: after every read of x)
        if tail is not None:
            tokens.put(out, slice(rotary_dim, head_dim), tail)


def _temperature(positions: PositionSpec, tokens: _Tokens, math: torch.dtype, floor_scale: int,
                 attn_scale: float) -> torch.Tensor:
    """A Llama 4 NoPE layer's temperature of each covered token, ``log(floor((p + 1) / floor_scale) + 1) *
    attn_scale + 1``: the floor in integers, the rest in float64, rounded once to the math dtype."""
    turns = torch.div(_positions(positions, tokens) + 1, floor_scale, rounding_mode="floor")
    return (torch.log(turns.to(torch.float64) + 1) * attn_scale + 1).to(math)


def _nope(q, k, out_q, out_k, positions: PositionSpec, tokens: _Tokens, math: torch.dtype, floor_scale: int,
          attn_scale: float) -> None:
    """A Llama 4 NoPE layer: q times its token's temperature (:func:`_temperature`), k copied out of place."""
    temperature = _temperature(positions, tokens, math, floor_scale, attn_scale)[..., None, None]
    if q.numel():
        tokens.put(out_q, slice(None), tokens.take(q).to(math) * temperature)
    if k is not None and k.numel() and not _same_view(k, out_k):
        tokens.put(out_k, slice(None), tokens.take(k))


# --------------------------------------------------------------------------------------------------------------------
# The fused ops: QK-norm, RoPE and the KV-cache write (and the norm's backward), the fused kernel's launcher natively.
# --------------------------------------------------------------------------------------------------------------------

# the fused kernel's quantising store (ropekit.triton.fused_tiles): formats and scales
PLAIN, E4M3, E5M2, INT8, NVFP4 = 0, 1, 2, 3, 4
PER_TENSOR, PER_HEAD, PER_TOKEN_HEAD, PER_BLOCK, PER_TILE = 0, 1, 2, 3, 4
TILE_CHANNELS = 128
# and its norm's place
NO_NORM, BEFORE, AFTER = 0, 1, 2
_FLOAT8 = {E4M3: (torch.float8_e4m3fn, 448.0), E5M2: (torch.float8_e5m2, 57344.0)}
_FORMAT_MAX = {E4M3: 448.0, E5M2: 57344.0, INT8: 127.0}


def quantised(x: torch.Tensor, scale: Optional[torch.Tensor], fmt: int) -> torch.Tensor:
    """``x / scale`` (the quotient correctly rounded in float32) in format ``fmt``: float8 bits (uint8), rounded to
    nearest even and saturating at the format's largest value (infinities too; PyTorch's own cast gives NaN or
    infinity past it), NaN kept; or int8 values, rounded to nearest even, saturating at [-128, 127], NaN as 0.
    ``scale`` None: ``x`` holds the quotients already (as ropekit.triton.fused_tiles.quantised takes it)."""
    quotient = x.to(torch.float32) if scale is None else x.to(torch.float32) / scale
    if fmt == INT8:
        return torch.round(torch.nan_to_num(quotient, nan=0.0).clamp(-128.0, 127.0)).to(torch.int8)
    dtype, largest = _FLOAT8[fmt]
    return quotient.clamp(-largest, largest).to(dtype).view(torch.uint8)


def e4m3_bits(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float8 e4m3fn bits (uint8) of ``x / scale`` (:func:`quantised`)."""
    return quantised(x, scale.reshape(()), E4M3)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """The e2m1 nibbles (uint8, 0-15) of float32 ``x``: sign in bit 3 (x's sign bit), magnitude code 0-7 for 0, 0.5,
    1, 1.5, 2, 3, 4, 6, to nearest with ties to the even code, saturating at 6; NaN gives a zero of its sign."""
    m = x.abs()
    code = sum(((m > 0.25), (m >= 0.75), (m > 1.25), (m >= 1.75), (m > 2.5), (m >= 3.5), (m > 5.0)),
               torch.zeros_like(m, dtype=torch.uint8))
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of ``(..., channels)`` values (channels a multiple of 16) at a one-element float32 global scale: (the
    e2m1 bytes ``(..., channels / 2)``, channel 2i in the low nibble; the e4m3 block-scale bytes ``(..., channels /
    16)``). Per 16 channels ``block = e4m3(amax / (6 * global))`` (NaN not counted), and each value stores
    ``e2m1(x / (block * global))`` in float32 (a zero block scale stores zeros of the values' signs)."""
    blocks = x.to(torch.float32).unflatten(-1, (-1, 16))
    g = global_scale.reshape(()).to(torch.float32)
    amax = torch.where(torch.isnan(blocks), 0.0, blocks.abs()).amax(-1)
    block = (amax / (6.0 * g)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    dequant = (block.to(torch.float32) * g)[..., None]
    quotient = torch.where(dequant == 0, blocks * 0.0, blocks / torch.where(dequant == 0, 1.0, dequant))
    codes = e2m1_codes(quotient).flatten(-2)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), block.view(torch.uint8)


def token_head_scales(values: torch.Tensor, fmt: int) -> torch.Tensor:
    """Per-(token, head) scales of ``(..., channels)`` float32 values: ``max|x| / format max`` (NaN not counted,
    float32 division), floored at the smallest normal float32; ``(..., 1)``."""
    amax = torch.where(torch.isnan(values), 0.0, values.abs()).amax(-1, keepdim=True).to(torch.float32)
    # divided by a tensor: PyTorch's CUDA division by a Python number multiplies by its reciprocal (one more rounding)
    return (amax / torch.full_like(amax, _FORMAT_MAX[fmt])).clamp_min(torch.finfo(torch.float32).tiny)


def _cache_places(tokens: _Tokens, seqlen: int, cache_mode: int, slots, page_table, block_size: int,
                  cache_len: int):
    """Every covered token's (block, row) in the cache and whether it is written at all, flattened: the fused
    kernel's address map (``ropekit.triton.fused_tiles.cache_slot``), reading no index outside its tensor."""
    if cache_mode == CACHE_CONTIGUOUS:
        row = slots.to(torch.int64)[tokens.seq] + tokens.local
        block = tokens.seq.expand_as(row)
        written = (row >= 0) & (row < cache_len)
        return block.reshape(-1), row.reshape(-1), written.reshape(-1)
    token = (tokens.rows if tokens.rows is not None else tokens.seq * seqlen + tokens.local).reshape(-1)
    if cache_mode == CACHE_PAGED:
        slot = slots.to(torch.int64)[token]
        written = (slot >= 0) & (slot < cache_len)
        return slot // max(block_size, 1), slot % max(block_size, 1), written
    batch_indices, kv_indices, kv_indptr = (t.to(torch.int64) for t in page_table)
    request, position = batch_indices[token], slots.to(torch.int64)[token]
    n_requests = kv_indptr.shape[0] - 1
    written = (request >= 0) & (request < n_requests) & (position >= 0) & (block_size > 0) & (kv_indices.numel() > 0)
    request, position = request.where(written, 0), position.where(written, 0)
    first = kv_indptr[request]
    end = kv_indptr[(request + 1).clamp(max=n_requests)]
    page_iter = first + position // max(block_size, 1)
    written &= (page_iter >= 0) & (page_iter < end) & (page_iter < kv_indices.shape[0])
    page = kv_indices[page_iter.where(written, 0)] if kv_indices.numel() else page_iter
    written &= (page >= 0) & (page < cache_len // max(block_size, 1))
    return page.where(written, 0), position % max(block_size, 1), written


def _write_cache(cache, places, values, scale, quant: tuple, global_scale=None) -> None:
    """Store the covered tokens' ``values`` (token-major, heads, channels) at their places in ``cache``: its dtype,
    or quantised as ``quant`` = (format, scales) says at ``scale`` (one float, or None where the values are the
    quotients already; one a head; or, per (token, head), a scale cache the computed scales are written to at the
    same places; per tile of TILE_CHANNELS channels likewise; NVFP4: the block-scale cache, written, over
    ``global_scale``)."""
    block, row, written = places
    values = values.reshape(written.shape[0], *values.shape[-2:])[written]
    fmt, scales = quant
    if fmt == PLAIN:
        cache[block[written], row[written]] = values.to(cache.dtype)
        return
    if fmt == NVFP4:
        packed, block_scales = nvfp4(values, global_scale)
        cache[block[written], row[written]] = packed
        scale[block[written], row[written]] = block_scales
        return
    if scales == PER_TILE:  # each tile a head vector of its own
        tiles = values.to(torch.float32).unflatten(-1, (-1, TILE_CHANNELS))
        computed = token_head_scales(tiles, fmt)
        scale[block[written], row[written]] = computed[..., 0]
        cache[block[written], row[written]] = quantised(tiles, computed, fmt).flatten(-2)
        return
    if scales == PER_TOKEN_HEAD:
        computed = token_head_scales(values.to(torch.float32), fmt)
        scale[block[written], row[written]] = computed[..., 0]
        scale = computed
    elif scales == PER_HEAD:
        scale = scale.reshape(-1)[:, None]  # a one-element scale broadcasts over the heads
    elif scale is not None:  # (None: the values are the quotients already)
        scale = scale.reshape(())
    cache[block[written], row[written]] = quantised(values, scale, fmt)


def _one_scale(i: int, out, q_format: int, q_scale, cache_mode: int, quant: tuple, k_scale, norm: int):
    """The one scale that the only store of q (``i`` 0) or k (1) divides by, where the kernel folds its reciprocal
    into the angles (ropekit.triton.fused_tiles.one_scale); else None."""
    if norm == AFTER:
        return None
    if i == 0:
        return q_scale if out is not None and q_format != PLAIN else None
    one = cache_mode and quant[0] in (E4M3, E5M2, INT8) and quant[1] == PER_TENSOR and out is None
    return k_scale if one else None


def _group_mean(per_head: torch.Tensor, head_dim: int, over_heads: bool) -> torch.Tensor:
    """The mean of ``(..., heads)`` sums over each head vector's ``head_dim`` values, or over a token's heads
    together (``(..., 1)``): the norm's group."""
    if over_heads:
        return per_head.sum(-1, keepdim=True) / (per_head.shape[-1] * head_dim)
    return per_head / head_dim


def _rsqrt_mean_square(x_a, x_b, x_t, eps: float, head_dim: int, over_heads: bool) -> torch.Tensor:
    """``1 / sqrt(mean(x^2) + eps)`` of each head vector given as pair halves and tail, or of a token's heads
    together, ``(..., heads or 1, 1)``."""
    squares = (x_a * x_a).sum(-1) + (x_b * x_b).sum(-1) + (x_t * x_t).sum(-1)
    return (1.0 / torch.sqrt(_group_mean(squares, head_dim, over_heads) + eps))[..., None]


def fused(q, k, cos, sin, *, positions: PositionSpec, rotary_dim: int, interleaved: bool = False,
          cos_per_token: bool = False, out_q=None, out_k=None, v=None, k_cache=None, v_cache=None,
          cache_mode: int = 0, slots=None, page_table=None, block_size: int = 1, cache_len: int = 0, k_scale=None,
          v_scale=None, quant: tuple = (PLAIN, PER_TENSOR), q_format: int = PLAIN, q_scale=None, k_global=None,
          v_global=None, q_weight=None, k_weight=None, eps: float = 0.0, weight_offset: float = 0.0,
          norm: int | None = None, norm_over_heads: bool = False, grad_q=None, grad_k=None, inv_freq=None,
          angle_scale: float = 1.0, nope: tuple | None = None, v_quant: tuple | None = None):
    """:func:`ropekit.triton.fused.launch_fused`'s arguments and outputs, computed in PyTorch ops: RMSNorm per head
    or over all heads of a token (``norm_over_heads``; with weights), RoPE (from the table, or from ``inv_freq``
    times ``angle_scale``; ``nope``: a NoPE layer, q times its temperature and k as it is), the outputs (None: not
    written) and, for k, the caches; with ``grad_q`` the backward of norm + rotation, returning the weight gradients
    ``(dw_q, dw_k)`` in the math dtype."""
    backward = grad_q is not None
    varlen = positions.is_varlen
    n_batch = positions.cu_seqlens.shape[0] - 1 if varlen else q.shape[0]
    seqlen = positions.max_seqlen if varlen else q.shape[1]
    math, head_dim = _math_dtype(q), q.shape[-1]
    if norm is None:  # the norm's place: before the rotation when weights are given
        norm = BEFORE if q_weight is not None else NO_NORM
    over_heads = norm_over_heads and norm != NO_NORM
    # the weights' lengths: head_dim, or over all heads one a (head, channel)
    heads = (q.shape[-2], k.shape[-2] if k is not None else 0)
    lengths = [n * head_dim for n in heads] if over_heads else [head_dim, head_dim]
    dw = [torch.zeros(n, dtype=math, device=q.device) for n in lengths] if backward else None
    if n_batch == 0 or seqlen == 0 or q.shape[0] == 0:
        return dw
    tokens = _tokens(positions, n_batch, seqlen, q.shape[0], q.device)
    if nope is not None:  # cos the temperature of each token (sin unused), as the kernel's NoPE position form
        temperature = _temperature(positions, tokens, math, *nope)[..., None, None]
        angles = (temperature, None, temperature, None)
    else:
        angles = _angles(cos, sin, positions, tokens, rotary_dim, interleaved, cos_per_token, backward, math,
                         inv_freq, angle_scale)
    # (an empty tensor's data pointer says nothing: q without heads is not "in place")
    in_place = (out_q is not None and out_q.numel() > 0 and out_q.data_ptr() == q.data_ptr()) or (
        out_k is not None and out_k.numel() > 0 and out_k.data_ptr() == k.data_ptr())
    write_tail = (backward or norm != NO_NORM or not in_place) and rotary_dim < head_dim
    for i, (x, out, grad, weight) in enumerate(((q, out_q, grad_q, q_weight), (k, out_k, grad_k, k_weight))):
        if x is None or x.numel() == 0:
            continue
        x_a, x_b = _pairs(tokens.take(x).to(math), rotary_dim, interleaved)
        x_t = tokens.take(x[..., rotary_dim:]).to(math)
        if norm != NO_NORM:
            # N(u) = u * r * w with r = 1 / sqrt(mean(u^2) + eps) over the whole head vector (or over all heads of
            # the token), w = weight_offset + weight (1 without weights; over all heads a (heads, head_dim) weight);
            # u = x before the rotation, the rotated x after it
            w = weight.to(math) + weight_offset if weight is not None else torch.ones(head_dim, dtype=math,
                                                                                     device=q.device)
            if over_heads and weight is not None:
                w = w.view(x.shape[-2], head_dim)
            (w_a, w_b), w_t = _pairs(w, rotary_dim, interleaved), w[..., rotary_dim:]
        if backward:
            # the norm's VJP N'(u)^T h = r w h - u r^3 mean(h w u) and the rotation's (angles arrive conjugated: by
            # -θ). Before: u = x, h = rotate(g, -θ), dx = N'(u)^T h; after: u = rotate(x, θ), h = g,
            # dx = rotate(N'(u)^T h, -θ). dw = the sum over tokens and heads of h u r
            g_a, g_b = _pairs(tokens.take(grad).to(math), rotary_dim, interleaved)
            g_t = tokens.take(grad[..., rotary_dim:]).to(math)
            if norm == AFTER:
                cos_a, sin_a, cos_b, sin_b = angles  # the transpose's: the forward's sines are -sin_b, -sin_a
                x_a, x_b = _rotate(x_a, x_b, cos_a, -sin_b, cos_b, -sin_a)
            else:
                g_a, g_b = _rotate(g_a, g_b, *angles)
            r = _rsqrt_mean_square(x_a, x_b, x_t, eps, head_dim, over_heads)
            dot = (g_a * w_a * x_a).sum(-1) + (g_b * w_b * x_b).sum(-1) + (g_t * w_t * x_t).sum(-1)
            c = r * r * r * _group_mean(dot, head_dim, over_heads)[..., None]
            dx_a, dx_b, dx_t = r * w_a * g_a - c * x_a, r * w_b * g_b - c * x_b, r * w_t * g_t - c * x_t
            if norm == AFTER:
                dx_a, dx_b = _rotate(dx_a, dx_b, *angles)
            tokens.put(out, slice(0, head_dim), torch.cat((_joined(dx_a, dx_b, interleaved), dx_t), -1))
            terms = torch.cat((_joined(g_a * x_a * r, g_b * x_b * r, interleaved), g_t * x_t * r), -1)
            dw[i] = terms.reshape(-1, lengths[i]).sum(0)  # over the tokens (per head: and the heads)
            continue
        if norm == BEFORE:
            r = _rsqrt_mean_square(x_a, x_b, x_t, eps, head_dim, over_heads)
            x_a, x_b, x_t = x_a * r * w_a, x_b * r * w_b, x_t * r * w_t
        scale = _one_scale(i, out, q_format, q_scale, cache_mode, quant, k_scale, norm) \
            if nope is None or i == 0 else None
        turn = angles
        if scale is not None:  # the rotation's values (NoPE's: the scaled q's) are the quotients; the channels
            # past rotary_dim are divided (the reciprocal and the tail's quotient in float32, as the kernel's store
            # takes them)
            one = scale.reshape(()).to(torch.float32)
            turn = tuple(None if angle is None else angle * torch.reciprocal(one).to(math) for angle in angles)
            x_t = (x_t.to(torch.float32) / one).to(math)
        if nope is None:
            y_a, y_b = _rotate(x_a, x_b, *turn)
        else:  # a NoPE layer: q times its temperature (cos), k as it is
            y_a, y_b = (x_a * turn[0], x_b * turn[2]) if i == 0 else (x_a, x_b)
        if norm == AFTER:
            r = _rsqrt_mean_square(y_a, y_b, x_t, eps, head_dim, over_heads)
            y_a, y_b, x_t = y_a * r * w_a, y_b * r * w_b, x_t * r * w_t
        y = torch.cat((_joined(y_a, y_b, interleaved), x_t), -1)
        if i == 1 and cache_mode:
            places = _cache_places(tokens, seqlen, cache_mode, slots, page_table, block_size, cache_len)
            _write_cache(k_cache, places, y, k_scale if scale is None else None, quant, k_global)
            if v is not None:
                _write_cache(v_cache, places, tokens.take(v), v_scale, quant if v_quant is None else v_quant,
                             v_global)
        if out is not None:
            if i == 0 and q_format != PLAIN:  # a float8 q at one scale
                y = quantised(y, q_scale.reshape(()) if scale is None else None, q_format)
            tokens.put(out, slice(0, head_dim if write_tail else rotary_dim), y if write_tail else y[..., :rotary_dim])
    return dw
