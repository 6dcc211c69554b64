"""Inverse frequencies and cos/sin tables, computed from float64 angles and stored in float32.

Why float64 angles: at position 1,000,000 a float32 angle ``p * inv_freq`` is off by up to half an ulp of 1e6
(0.03 rad), whatever sin/cos is used after it. Forming the angle in float64 and rounding only cos/sin to float32 keeps
every entry within one float32 rounding (<= 6e-8) of the exact value, at position 1e6 as at position 1.
"""

from __future__ import annotations

import torch

__all__ = ["inverse_frequencies", "cos_sin_table"]


def inverse_frequencies(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``base ** (-2i / rotary_dim)`` for ``i = 0 .. rotary_dim/2 - 1``, as float64 (CPU)."""
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim!r}")
    if not base > 1.0:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    return float(base) ** (-exponents)


def cos_sin_table(max_positions: int, rotary_dim: int | None = None, *, base: float = 10000.0,
                  inv_freq: torch.Tensor | None = None, attention_scaling: float = 1.0,
                  device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width tables ``cos[p, i] = cos(p * inv_freq[i]) * attention_scaling`` (and sin) for ``p < max_positions``.

    Shape ``(max_positions, rotary_dim/2)``. Angles and cos/sin are evaluated in float64 on ``device``; only the
    result is rounded to ``dtype`` (float32 by default).
    """
    if inv_freq is None:
        if rotary_dim is None:
            raise TypeError("cos_sin_table needs rotary_dim or inv_freq")
        inv_freq = inverse_frequencies(rotary_dim, base)
    if max_positions < 0:
        raise ValueError(f"max_positions must be >= 0, got {max_positions}")
    freqs = inv_freq.to(device=device, dtype=torch.float64)
    positions = torch.arange(max_positions, dtype=torch.float64, device=freqs.device)
    theta = torch.outer(positions, freqs)
    cos = (torch.cos(theta) * attention_scaling).to(dtype)
    sin = (torch.sin(theta) * attention_scaling).to(dtype)
    return cos, sin
