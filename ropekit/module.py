"""``RopeTable`` (a growable float32 cos/sin table) and ``RotaryEmbedding`` (the nn.Module that owns one)."""

from __future__ import annotations

from typing import Optional

import torch

from .api import apply_rope
from .frequencies import cos_sin_table, inverse_frequencies, rope_init

__all__ = ["RopeTable", "RotaryEmbedding"]


class RopeTable:
    """Half-width float32 cos/sin tables ``(rows, rotary_dim/2)`` built from float64 angles.

    ``ensure(n)`` grows the table (doubling) when a host-known length needs more rows. It never runs inside a CUDA
    graph capture: size it up front with ``max_positions`` for captured decode loops.
    """

    def __init__(self, rotary_dim: int, max_positions: int = 8192, *, base: float = 10000.0,
                 inv_freq: Optional[torch.Tensor] = None, attention_scaling: float = 1.0, device=None):
        self.rotary_dim = rotary_dim
        self.inv_freq = inverse_frequencies(rotary_dim, base) if inv_freq is None else inv_freq.to(torch.float64)
        if self.inv_freq.shape != (rotary_dim // 2,):
            raise ValueError(f"inv_freq must have shape ({rotary_dim // 2},), got {tuple(self.inv_freq.shape)}")
        self.attention_scaling = float(attention_scaling)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cos, self.sin = self._build(max_positions)

    def _build(self, rows: int):
        return cos_sin_table(rows, inv_freq=self.inv_freq, attention_scaling=self.attention_scaling,
                             device=self.device)

    def __len__(self) -> int:
        return self.cos.shape[0]

    def ensure(self, rows: int) -> None:
        """Make the table at least ``rows`` long (doubling, so that a growing decode rebuilds it O(log n) times)."""
        if rows > len(self):
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"the cos/sin table must grow to {rows} rows inside a CUDA graph capture; "
                                   "create it with max_positions large enough before capturing")
            self.cos, self.sin = self._build(max(rows, 2 * len(self)))

    def to(self, device) -> "RopeTable":
        self.device = torch.device(device)
        self.cos, self.sin = self.cos.to(self.device), self.sin.to(self.device)
        return self


class RotaryEmbedding(torch.nn.Module):
    """Owns a float32 cos/sin table and applies RoPE to q and k.

    Args:
        head_dim: channels per head.
        rotary_dim: channels that rotate (default head_dim; partial rotary when smaller).
        base: the frequency base (rope_theta): 10000, 500000, 1e6, ...
        scaling: a transformers ``rope_scaling``/``rope_parameters`` dict (linear, dynamic, yarn, llama3, longrope).
        max_positions: rows built up front (the table grows for longer host-known lengths, never inside a graph).
        interleaved: GPT-J pairing instead of NeoX.
        backend: "triton" or "cuda".
    """

    def __init__(self, head_dim: int, *, rotary_dim: Optional[int] = None, base: float = 10000.0,
                 scaling: Optional[dict] = None, max_positions: int = 8192, interleaved: bool = False,
                 backend: str = "triton", device=None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim > head_dim or self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {self.rotary_dim}")
        self.interleaved = interleaved
        self.backend = backend
        parameters = dict(scaling or {})
        parameters.setdefault("rope_theta", base)
        inv_freq, attention_scaling = rope_init(parameters, self.rotary_dim, base=base,
                                                max_position_embeddings=max_positions)
        self.table = RopeTable(self.rotary_dim, max_positions, inv_freq=inv_freq,
                               attention_scaling=attention_scaling, device=device)

    def _apply(self, fn, recurse=True):
        # Keep the table on the module's device when the module moves (.cuda(), .to(...)).
        result = super()._apply(fn, recurse)
        probe = fn(torch.empty(0, device=self.table.device))
        if probe.device != self.table.device:
            self.table.to(probe.device)
        return result

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, *, positions=None, layout: str = "bshd",
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None, inplace: bool = False):
        if self.table.device != q.device:
            self.table.to(q.device)
        return apply_rope(q, k, table=self.table, positions=positions, layout=layout, interleaved=self.interleaved,
                          rotary_dim=self.rotary_dim, inplace=inplace, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, backend=self.backend)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, rows={len(self.table)}, "
                f"interleaved={self.interleaved}, backend={self.backend!r}")
