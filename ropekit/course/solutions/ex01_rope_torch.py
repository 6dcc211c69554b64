import torch


def rope_torch(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0, rotary_dim: int | None = None,
               interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of x (batch, seq, heads, head_dim) at integer positions (batch, seq), in plain PyTorch.

    Pair i turns by positions * base ** (-2i / rotary_dim); only the first rotary_dim channels turn (default: all),
    the rest pass through. NeoX pairs (i, i + rotary_dim/2), or GPT-J pairs (2i, 2i+1) when interleaved. Compute in
    float32 (or better) and return a tensor of x's dtype and shape.
    """
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    # Angles in float64: positions * inv_freq is exact enough at any position; only cos/sin are rounded to float32.
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    theta = positions.to(torch.float64)[..., None] * inv_freq  # (batch, seq, rotary_dim/2)
    cos = torch.cos(theta).float()[:, :, None, :]  # broadcast over heads
    sin = torch.sin(theta).float()[:, :, None, :]
    x_rot = x[..., :rotary_dim].float()
    if interleaved:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        a, b = x_rot[..., : rotary_dim // 2], x_rot[..., rotary_dim // 2:]
    turned_a, turned_b = a * cos - b * sin, b * cos + a * sin
    if interleaved:
        rotated = torch.stack((turned_a, turned_b), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((turned_a, turned_b), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)
