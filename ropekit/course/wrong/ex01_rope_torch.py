"""Deliberately wrong answers to exercise 01_rope_torch, one per diagnosis (used by tests/test_course.py only).

Each is the solution with one mistake, marked ``# MISTAKE``.
"""

import torch


def _rope(x, positions, *, base=10000.0, rotary_dim=None, interleaved=False, sign=1.0, math_dtype=torch.float32,
          pair_neighbours=None, whole_head=False, ignore_base=False):
    rotary_dim = x.shape[-1] if (rotary_dim is None or whole_head) else rotary_dim
    if ignore_base:
        base = 10000.0
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    theta = positions.to(torch.float64)[..., None] * inv_freq
    cos = torch.cos(theta).to(math_dtype)[:, :, None, :]
    sin = torch.sin(theta).to(math_dtype)[:, :, None, :] * sign
    x_rot = x[..., :rotary_dim].to(math_dtype)
    neighbours = interleaved if pair_neighbours is None else pair_neighbours
    if neighbours:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        a, b = x_rot[..., : rotary_dim // 2], x_rot[..., rotary_dim // 2:]
    turned_a, turned_b = a * cos - b * sin, b * cos + a * sin
    if neighbours:
        rotated = torch.stack((turned_a, turned_b), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((turned_a, turned_b), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def rope_minus_theta(x, positions, **kw):
    return _rope(x, positions, sign=-1.0, **kw)  # MISTAKE: sin negated


def rope_always_neox(x, positions, **kw):
    return _rope(x, positions, pair_neighbours=False, **kw)  # MISTAKE: the interleaved flag is ignored


def rope_whole_head(x, positions, **kw):
    return _rope(x, positions, whole_head=True, **kw)  # MISTAKE: rotary_dim ignored, the tail turns too


def rope_default_base(x, positions, **kw):
    return _rope(x, positions, ignore_base=True, **kw)  # MISTAKE: base hard-coded to 10000


def rope_in_x_dtype(x, positions, **kw):
    return _rope(x, positions, math_dtype=x.dtype, **kw)  # MISTAKE: cos/sin and the products in x's dtype


def rope_partner_half_the_head(x, positions, *, base=10000.0, rotary_dim=None, interleaved=False):
    if interleaved or rotary_dim in (None, x.shape[-1]):
        return _rope(x, positions, base=base, rotary_dim=rotary_dim, interleaved=interleaved)
    half, half_head = rotary_dim // 2, x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    theta = positions.to(torch.float64)[..., None] * inv_freq
    cos, sin = torch.cos(theta).float()[:, :, None, :], torch.sin(theta).float()[:, :, None, :]
    out = x.float()
    a, b = out[..., :half].clone(), out[..., half_head:half_head + half].clone()  # MISTAKE: i + head_dim/2
    out[..., :half] = a * cos - b * sin
    out[..., half_head:half_head + half] = b * cos + a * sin
    return out.to(x.dtype)


def rope_token_index(x, positions, *, base=10000.0, rotary_dim=None, interleaved=False):
    """Each token at its index in the sequence, whatever ``positions`` says."""
    index = torch.arange(x.shape[1]).expand(x.shape[0], -1)  # MISTAKE: torch.arange(seq), not positions
    return _rope(x, index, base=base, rotary_dim=rotary_dim, interleaved=interleaved)


WRONG = {
    "wrong_positions": rope_token_index,
    "wrong_direction": rope_minus_theta,
    "other_pairing": rope_always_neox,
    "tail_touched": rope_whole_head,
    "wrong_base": rope_default_base,
    "half_precision_math": rope_in_x_dtype,
    "partial_pairing": rope_partner_half_the_head,
}
