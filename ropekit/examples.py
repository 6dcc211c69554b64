"""A small attention block that uses ropekit the way a model does (notebook 08 builds on it).

``RopeAttention`` is a Llama-style causal self-attention layer (no biases, grouped-query heads, RoPE on q and k).
It shows the three ways a model calls RoPE:

* ``forward``: training / prefill of a ``(batch, seq, hidden)`` block, positions ``0..seq-1``;
* ``forward_cached``: prefill into, or decode from, a :class:`KVCache`. The cache's per-sequence lengths are a
  tensor on the device and are passed straight to RoPE as per-sequence offsets, so a decode step never asks the
  host where a sequence is (no ``.item()``, no sync): it can be captured in a CUDA graph and compiled;
* ``forward_varlen``: a packed batch ``(tokens, hidden)`` with ``cu_seqlens`` (layout ``"thd"``), the way
  variable-length training batches are fed without padding.

:func:`reference_forward` is the same layer in float64 with :func:`ropekit.reference.rope`, for checking.
Attention itself is plain PyTorch (``scaled_dot_product_attention``): this module is about where RoPE goes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from . import reference
from .module import RotaryEmbedding

__all__ = ["KVCache", "RopeAttention", "reference_forward", "varlen_attention_mask"]


class KVCache:
    """Pre-allocated keys (already rotated) and values ``(batch, max_len, kv_heads, head_dim)`` plus ``lengths``:
    how many tokens each sequence holds, an int64 ``(batch,)`` tensor on the cache's device.

    Nothing here reads ``lengths`` on the host, so every method can run inside a CUDA graph.
    """

    def __init__(self, batch: int, max_len: int, n_kv_heads: int, head_dim: int, *, dtype=torch.float32,
                 device=None):
        self.k = torch.zeros(batch, max_len, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``(batch, s, kv_heads, head_dim)`` new keys/values at ``lengths[b] + 0..s-1`` (lengths unchanged)."""
        slots = self.lengths[:, None] + torch.arange(k.shape[1], device=k.device)  # (batch, s)
        index = slots[:, :, None, None].expand_as(k)
        self.k.scatter_(1, index, k)
        self.v.scatter_(1, index, v)

    def clone(self) -> "KVCache":
        copy = KVCache.__new__(KVCache)
        copy.k, copy.v, copy.lengths = self.k.clone(), self.v.clone(), self.lengths.clone()
        return copy


def varlen_attention_mask(cu_seqlens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """``(tokens, tokens)`` bool: token i may attend to token j when both belong to the same packed sequence and
    j <= i (block-diagonal causal). Built on the device from ``cu_seqlens`` (no host sync)."""
    token = torch.arange(n_tokens, device=cu_seqlens.device)
    sequence = torch.searchsorted(cu_seqlens[1:].to(torch.int64), token, right=True)
    return (sequence[:, None] == sequence[None, :]) & (token[None, :] <= token[:, None])


class RopeAttention(torch.nn.Module):
    """Causal self-attention with RoPE (Llama layout: bshd projections, NeoX pairing by default, GQA).

    Args:
        hidden_size: model width.
        n_heads, n_kv_heads: query heads and key/value heads (``n_heads % n_kv_heads == 0``).
        head_dim: channels per head (default ``hidden_size // n_heads``).
        rotary_dim, base, scaling, interleaved: passed to :class:`ropekit.RotaryEmbedding`.
        max_positions: rows of the cos/sin table, built up front (the cache's ``max_len`` must fit, because decode
            positions live on the device and the table cannot grow from them).
    """

    def __init__(self, hidden_size: int, n_heads: int, n_kv_heads: int, head_dim: Optional[int] = None, *,
                 rotary_dim: Optional[int] = None, base: float = 10000.0, scaling: Optional[dict] = None,
                 interleaved: bool = False, max_positions: int = 4096, device=None, dtype=None):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim or hidden_size // n_heads
        linear = dict(bias=False, device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(hidden_size, n_heads * self.head_dim, **linear)
        self.k_proj = torch.nn.Linear(hidden_size, n_kv_heads * self.head_dim, **linear)
        self.v_proj = torch.nn.Linear(hidden_size, n_kv_heads * self.head_dim, **linear)
        self.o_proj = torch.nn.Linear(n_heads * self.head_dim, hidden_size, **linear)
        self.rotary = RotaryEmbedding(self.head_dim, rotary_dim=rotary_dim, base=base, scaling=scaling,
                                      interleaved=interleaved, max_positions=max_positions, device=device)

    # --- the pieces ---------------------------------------------------------------------------------------------

    def project(self, x: torch.Tensor):
        """``(..., hidden)`` -> q ``(..., n_heads, head_dim)``, k and v ``(..., n_kv_heads, head_dim)``.

        A reshape of the projection's output, so the token axes keep their order: bshd for ``(b, s, hidden)``
        inputs, thd for packed ``(tokens, hidden)`` ones. RoPE reads these layouts in place, no transpose."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.n_kv_heads, self.head_dim)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               allowed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q ``(b, s, h, d)``, k/v ``(b, L, h_kv, d)``; ``allowed`` ``(b, s, L)`` bool or None for causal (L == s).
        Returns ``(b, s, hidden)``."""
        groups = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(groups, dim=2)  # each kv head serves `groups` query heads
        v = v.repeat_interleave(groups, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=None if allowed is None else allowed[:, None], is_causal=allowed is None)
        return self.o_proj(out.transpose(1, 2).flatten(2))

    # --- the three ways in ----------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Training / prefill without a cache: ``(b, s, hidden)`` at positions ``0..s-1``, causal."""
        q, k, v = self.project(x)
        q, k = self.rotary(q, k)  # positions None: 0..s-1, a host-known range (the table may grow)
        return self.attend(q, k, v)

    def forward_cached(self, x: torch.Tensor, cache: KVCache,
                       n_new: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Prefill (s > 1) or decode (s == 1) ``(b, s, hidden)`` tokens that continue each sequence of ``cache``.

        Token i of sequence b sits at position ``cache.lengths[b] + i``: the lengths tensor *is* the per-sequence
        offset RoPE needs. ``n_new`` ``(b,)``: how many of the s tokens are real when a prefill batch is
        right-padded (default: all s). Padding is written to the cache but lies beyond ``lengths``: it is never
        attended to and the next tokens overwrite it.
        """
        s = x.shape[1]
        q, k, v = self.project(x)
        # Under autograd RoPE saves its positions for the backward; the in-place `lengths +=` below would then
        # invalidate them, so training through the cache rotates at a copy. Inference (no grad) uses the tensor itself.
        start = cache.lengths.clone() if torch.is_grad_enabled() else cache.lengths
        # A (b,) tensor means "one offset per sequence"; when b == s > 1 ropekit reads a 1-D tensor as position ids
        # shared by the batch (transformers' convention), so a multi-token chunk passes the unambiguous (b, 1).
        q, k = self.rotary(q, k, positions=start if s == 1 else start[:, None])
        cache.write(k, v)
        query_position = start[:, None] + torch.arange(s, device=x.device)  # (b, s)
        key_position = torch.arange(cache.max_len, device=x.device)
        allowed = key_position[None, None, :] <= query_position[:, :, None]  # (b, s, max_len)
        out = self.attend(q, cache.k, cache.v, allowed)
        cache.lengths += s if n_new is None else n_new
        return out

    def forward_varlen(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """A packed batch ``(tokens, hidden)``: sequence j is ``x[cu_seqlens[j]:cu_seqlens[j+1]]``, its positions
        restart at 0. ``max_seqlen`` is a host int (it sizes the launch; passing it avoids a host sync)."""
        q, k, v = self.project(x)  # (tokens, heads, head_dim): layout "thd"
        q, k = self.rotary(q, k, layout="thd", cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        allowed = varlen_attention_mask(cu_seqlens, x.shape[0])
        # one "batch" of all tokens; the mask keeps the sequences apart
        return self.attend(q[None], k[None], v[None], allowed[None])[0]


def reference_forward(block: RopeAttention, x: torch.Tensor, positions: torch.Tensor, *,
                      allowed: Optional[torch.Tensor] = None, weights: Optional[dict] = None) -> torch.Tensor:
    """``block`` in float64 on the CPU, with :func:`ropekit.reference.rope` as the rotation.

    x ``(b, s, hidden)``; positions ``(b, s)`` int; ``allowed`` ``(b, s, s)`` bool (default causal). ``weights``:
    float64 tensors named like ``block``'s parameters (pass ones that require grad to get reference gradients).
    """
    if weights is None:
        weights = {name: p.detach().to(torch.float64).cpu() for name, p in block.named_parameters()}
    x = x.detach().to(torch.float64).cpu()
    b, s, _ = x.shape
    h, h_kv, d = block.n_heads, block.n_kv_heads, block.head_dim
    table = block.rotary.table
    rope = dict(rotary_dim=block.rotary.rotary_dim, inv_freq=table.inv_freq, interleaved=block.rotary.interleaved,
                attention_scaling=table.attention_scaling)
    q = reference.rope((x @ weights["q_proj.weight"].T).view(b, s, h, d), positions, **rope)
    k = reference.rope((x @ weights["k_proj.weight"].T).view(b, s, h_kv, d), positions, **rope)
    v = (x @ weights["v_proj.weight"].T).view(b, s, h_kv, d)
    k = k.repeat_interleave(h // h_kv, dim=2)
    v = v.repeat_interleave(h // h_kv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d ** 0.5
    if allowed is None:
        allowed = torch.ones(s, s, dtype=torch.bool).tril().expand(b, s, s)
    scores = scores.masked_fill(~allowed.cpu()[:, None], float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).flatten(2)
    return out @ weights["o_proj.weight"].T
