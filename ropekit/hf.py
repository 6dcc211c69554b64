"""transformers compatibility: a drop-in ``apply_rotary_pos_emb``, M-RoPE cos/sin, and a patcher for model modules.

transformers computes per-token cos/sin rows (full width, the two halves equal) and rotates with
``q * cos + rotate_half(q) * sin`` — four elementwise kernels and two temporaries per tensor. The drop-in hands the same
rows to the v4 kernel (``per_token=True``): q and k in one launch, fp32 math, same result.
"""

from __future__ import annotations

import contextlib
import functools
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
    the result is full width (both halves equal), the layout transformers uses. Positions outside the table give
    NaN rows. Raises ``TypeError``/``ValueError`` naming ``position_ids`` or ``mrope_section``.
    """
    half = cos_table.shape[-1]
    sections = list(mrope_section)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sections):
        raise ValueError(f"mrope_section must hold non-negative ints, got {sections}")
    if sum(sections) != half:
        raise ValueError(f"mrope_section {sections} must sum to rotary_dim/2 = {half}")
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"position_ids must be an int32 or int64 tensor, got "
                        f"{getattr(position_ids, 'dtype', type(position_ids).__name__)}")
    if position_ids.ndim == 2:
        position_ids = position_ids.expand(3, *position_ids.shape)
    if position_ids.ndim != 3 or position_ids.shape[0] != 3:
        raise ValueError(f"position_ids must be (3, batch, seq) or (batch, seq), got {tuple(position_ids.shape)}")
    axis_of_pair = torch.repeat_interleave(torch.arange(len(mrope_section)) % 3, torch.tensor(list(mrope_section)))
    axis_of_pair = axis_of_pair.to(position_ids.device)
    # (batch, seq, half): the position each pair of each token uses
    pos = position_ids.permute(1, 2, 0)[..., axis_of_pair]
    # Positions outside the table are never read (a negative index would wrap to the table's end): their rows come
    # out as NaN, as apply_rope's are, and no host sync is needed to find them.
    in_table = (pos >= 0) & (pos < cos_table.shape[0])
    pos = torch.where(in_table, pos, 0)
    pair_index = torch.arange(half, device=position_ids.device).expand_as(pos)
    nan = torch.tensor(float("nan"), dtype=cos_table.dtype, device=cos_table.device)
    cos = torch.where(in_table, cos_table[pos, pair_index], nan)
    sin = torch.where(in_table, sin_table[pos, pair_index], nan)
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
    return _differs_on_probe(original)


@functools.lru_cache(maxsize=None)
def _differs_on_probe(original) -> str | None:
    """Why ``original(q, k, cos, sin)`` is not what the drop-in computes, bit for bit, on probe inputs in float32 and
    bfloat16 (None when it is). A signature and a name say little: a module may flip ``rotate_half``'s sign, take
    half-width cos, rotate in the complex form or compute in float32; running both is what tells."""
    from . import device
    from .frequencies import cos_sin_at, inverse_frequencies

    generator = torch.Generator().manual_seed(0)
    batch, heads, seq, head_dim = 2, 3, 5, 16
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    cos, sin = cos_sin_at(positions, inverse_frequencies(head_dim, 10000.0), dtype=torch.float64)
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    for dtype in (torch.float32, torch.bfloat16):
        q, k = (torch.randn(batch, h, seq, head_dim, generator=generator).to(device=device.DEVICE, dtype=dtype)
                for h in (heads, 1))
        rows = cos.to(device.DEVICE, dtype), sin.to(device.DEVICE, dtype)
        try:
            theirs = original(q.clone(), k.clone(), *rows)
        except Exception as error:  # noqa: BLE001 — any failure means it takes other inputs than the drop-in's
            return f"it fails on transformers' standard inputs ({type(error).__name__}: {error})"
        ours = apply_rotary_pos_emb(q.clone(), k.clone(), *rows)
        if not (isinstance(theirs, tuple) and len(theirs) == 2 and all(
                isinstance(t, torch.Tensor) and t.shape == o.shape and t.dtype == o.dtype and torch.equal(t, o)
                for t, o in zip(theirs, ours))):
            return (f"on a {dtype} probe its result differs from the drop-in's (another rotation, cos width, "
                    "rounding or sign); the drop-in would change the model's output")
    return None


@contextlib.contextmanager
def patched(*module_names: str, fn=apply_rotary_pos_emb):
    """Temporarily replace ``apply_rotary_pos_emb`` in transformers model modules, e.g.
    ``with ropekit.hf.patched("transformers.models.llama.modeling_llama"): model(ids)``.

    With the default ``fn`` (the NeoX drop-in), each module's own function is first run on probe inputs in float32
    and bfloat16 beside the drop-in; a module whose function has another signature, pairs channels GPT-J's way, or
    computes anything but the same bits (a sign-flipped ``rotate_half``, half-width cos, the complex form, float32
    math in a bfloat16 model) is refused with a ``ValueError`` instead of silently changing the model's output."""
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
