"""transformers compatibility: a drop-in ``apply_rotary_pos_emb``, M-RoPE cos/sin, and a patcher for model modules.

transformers computes per-token cos/sin rows (full width, the two halves equal) and rotates with
``q * cos + rotate_half(q) * sin`` — four elementwise kernels and two temporaries per tensor. The drop-in hands the same
rows to the v4 kernel (``per_token=True``): q and k in one launch, fp32 math, same result.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from typing import Sequence

import torch

from .api import apply_rope

__all__ = ["apply_rotary_pos_emb", "mrope_cos_sin", "patched", "rope_config"]


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1):
    """Same signature and result as transformers 5.x ``apply_rotary_pos_emb``.

    ``cos``/``sin``: ``(batch, seq, rotary_dim)`` rows (as transformers' rotary modules return them).
    ``unsqueeze_dim=1`` means q/k are ``(batch, heads, seq, head_dim)``; ``unsqueeze_dim=2`` means
    ``(batch, seq, heads, head_dim)``. Channels past ``cos.shape[-1]`` pass through (partial rotary).
    In fp16/bf16 it rounds each product and the sum like the eager formula does, so results agree bit for bit.
    """
    if unsqueeze_dim not in (1, 2, -2, -3):
        raise ValueError(f"unsqueeze_dim must be 1 (q is (b, h, s, d)) or 2 (q is (b, s, h, d)), got {unsqueeze_dim}")
    layout = "bhsd" if unsqueeze_dim in (1, -3) else "bshd"
    return apply_rope(q, k, cos, sin, layout=layout, per_token=True, eager_rounding=True)


def mrope_cos_sin(cos_table: torch.Tensor, sin_table: torch.Tensor, position_ids: torch.Tensor,
                  mrope_section: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's multimodal RoPE as per-token rows for ``apply_rope(..., per_token=True)``.

    ``position_ids``: ``(3, batch, seq)`` (temporal, height, width) or ``(batch, seq)`` (text: all three equal).
    ``mrope_section``: how many of the ``rotary_dim/2`` pairs follow each axis, e.g. ``[16, 24, 24]``.
    Pair ``i`` in section ``j`` turns by ``position_ids[j] * inv_freq[i]``: a gather from the half-width tables;
    the result is full width (both halves equal), the layout transformers uses.
    """
    half = cos_table.shape[-1]
    if sum(mrope_section) != half:
        raise ValueError(f"mrope_section {list(mrope_section)} must sum to rotary_dim/2 = {half}")
    if position_ids.ndim == 2:
        position_ids = position_ids.expand(3, *position_ids.shape)
    if position_ids.ndim != 3 or position_ids.shape[0] != 3:
        raise ValueError(f"position_ids must be (3, batch, seq) or (batch, seq), got {tuple(position_ids.shape)}")
    axis_of_pair = torch.repeat_interleave(torch.arange(len(mrope_section)) % 3, torch.tensor(list(mrope_section)))
    axis_of_pair = axis_of_pair.to(position_ids.device)
    # (batch, seq, half): the position each pair of each token uses
    pos = position_ids.permute(1, 2, 0)[..., axis_of_pair]
    pair_index = torch.arange(half, device=position_ids.device).expand_as(pos)
    cos = cos_table[pos, pair_index]
    sin = sin_table[pos, pair_index]
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def rope_config(config) -> tuple[dict, int]:
    """(rope parameters dict, rotary_dim) from a transformers config object or dict (``rope_parameters`` or the
    legacy ``rope_scaling`` + ``rope_theta``); feed them to ``ropekit.RotaryEmbedding(scaling=...)``."""
    from .frequencies import rope_parameters_from_config

    params = rope_parameters_from_config(config)
    return params, params["rotary_dim"]


def _neox_pairs_with_drop_in_signature(module) -> str | None:
    """Why ``module``'s ``apply_rotary_pos_emb`` cannot be replaced by the drop-in (None when it can)."""
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is None:
        return "it has no apply_rotary_pos_emb"
    names = list(inspect.signature(original).parameters)[:4]
    if names != ["q", "k", "cos", "sin"]:
        return f"its apply_rotary_pos_emb takes ({', '.join(names)}, ...), not (q, k, cos, sin, unsqueeze_dim)"
    rotate = getattr(module, "rotate_half", None)
    try:
        source = inspect.getsource(rotate) if rotate is not None else ""
    except (OSError, TypeError):
        source = ""
    if "::2]" in source:
        return ("it pairs channels GPT-J's way (rotate_half over x[..., 0::2] and x[..., 1::2]); the drop-in rotates "
                "NeoX halves. Use ropekit.RotaryEmbedding(..., interleaved=True) or apply_rope(interleaved=True)")
    return None


@contextlib.contextmanager
def patched(*module_names: str, fn=apply_rotary_pos_emb):
    """Temporarily replace ``apply_rotary_pos_emb`` in transformers model modules, e.g.
    ``with ropekit.hf.patched("transformers.models.llama.modeling_llama"): model(ids)``.

    With the default ``fn`` (the NeoX drop-in), a module whose function has another signature or pairs channels
    GPT-J's way (GLM, Cohere, Helium, ERNIE 4.5: their ``rotate_half`` interleaves) is refused with a ``ValueError``
    instead of silently changing the model's output."""
    modules = [importlib.import_module(name) for name in module_names or ("transformers.models.llama.modeling_llama",)]
    if fn is apply_rotary_pos_emb:
        for module in modules:
            why = _neox_pairs_with_drop_in_signature(module)
            if why is not None:
                raise ValueError(f"ropekit's apply_rotary_pos_emb cannot stand in for {module.__name__}'s: {why}")
    saved = [m.apply_rotary_pos_emb for m in modules]
    try:
        for m in modules:
            m.apply_rotary_pos_emb = fn
        yield
    finally:
        for m, original in zip(modules, saved):
            m.apply_rotary_pos_emb = original
