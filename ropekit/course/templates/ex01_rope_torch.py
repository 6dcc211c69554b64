import torch


def rope_torch(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0, rotary_dim: int | None = None,
               interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of x (batch, seq, heads, head_dim) at integer positions (batch, seq), in plain PyTorch.

    Pair i turns by positions * base ** (-2i / rotary_dim); only the first rotary_dim channels turn (default: all),
    the rest pass through. NeoX pairs (i, i + rotary_dim/2), or GPT-J pairs (2i, 2i+1) when interleaved. Compute in
    float32 (or better) and return a tensor of x's dtype and shape.
    """
    raise NotImplementedError("your code here")
