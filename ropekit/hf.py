"""transformers compatibility: a drop-in ``apply_rotary_pos_emb``, M-RoPE cos/sin, and a patcher for model modules.

transformers computes per-token cos/sin rows (full width, the two halves equal) and rotates with
``q * cos + rotate_half(q) * sin`` — four elementwise kernels and two temporaries per tensor. The drop-in hands the
same rows to the v4 kernel (``per_token=True``): q and k in one launch, fp32 math, same result.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import operator
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
    cos/sin of a wider dtype than q (float32 rows beside bf16 activations) promote as the formula's products do: q and
    k are rotated in that dtype and returned in it.
    """
    if unsqueeze_dim not in (1, 2, -2, -3):
        raise ValueError(f"unsqueeze_dim must be 1 (q is (b, h, s, d)) or 2 (q is (b, s, h, d)), got {unsqueeze_dim}")
    layout = "bhsd" if unsqueeze_dim in (1, -3) else "bshd"
    if isinstance(q, torch.Tensor) and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor):
        wide = torch.promote_types(torch.promote_types(q.dtype, cos.dtype), sin.dtype)
        if wide != q.dtype:
            q, k = q.to(wide), (k.to(wide) if isinstance(k, torch.Tensor) else k)
    return apply_rope(q, k, cos, sin, layout=layout, per_token=True, eager_rounding=True)


def mrope_cos_sin(cos_table: torch.Tensor, sin_table: torch.Tensor, position_ids: torch.Tensor,
                  mrope_section: Sequence[int], *, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's multimodal RoPE as per-token rows for ``apply_rope(..., per_token=True)``.

    ``position_ids``: ``(3, batch, seq)`` (temporal, height, width) or ``(batch, seq)`` (text: all three equal).
    ``mrope_section``: how many of the ``rotary_dim/2`` pairs follow each axis, e.g. ``[16, 24, 24]``.
    Pair ``i`` in section ``j`` turns by ``position_ids[j] * inv_freq[i]``: a gather from the half-width tables;
    the result is full width (both halves equal), the layout transformers uses. ``interleaved`` (Qwen3-VL's
    ``mrope_interleaved``): the axes take turns pair by pair instead, ``i % 3`` = 1 height and 2 width while
    ``i < 3 * mrope_section[axis]``, every other pair temporal.

    ``apply_rope(q, k, cos_table, sin_table, positions=position_ids, mrope_section=...)`` makes the same choice inside
    the kernel, without these rows (docs/api.md#m-rope-multimodal-positions); the rows serve ``backend="cuda"`` and
    code that wants them.

    Positions outside ``[0, len(cos_table))`` raise a ``ValueError`` (a host sync on a GPU). Inside
    ``torch.compile`` or CUDA-graph capture, where the host cannot read them, their rows are NaN instead: the
    rotated output is NaN there, never a neighbouring row.
    """
    _check_mrope_arguments(cos_table, sin_table, position_ids, mrope_section)
    half = cos_table.shape[-1]
    if position_ids.ndim == 2:
        position_ids = position_ids.expand(3, *position_ids.shape)
    if position_ids.ndim != 3 or position_ids.shape[0] != 3:
        raise ValueError(f"position_ids must be (3, batch, seq) or (batch, seq), got {tuple(position_ids.shape)}")
    _check_positions_in_table(position_ids, cos_table.shape[0])
    if interleaved and len(mrope_section) != 3:
        raise ValueError(f"an interleaved mrope_section has three entries (t, h, w), got {list(mrope_section)}")
    axis_of_pair = _axis_of_pair([int(n) for n in mrope_section], interleaved, half, position_ids.device)
    # (batch, seq, half): the position each pair of each token uses
    pos = position_ids.permute(1, 2, 0)[..., axis_of_pair]
    pair_index = torch.arange(half, device=position_ids.device).expand_as(pos)
    # (positions the host could not check above) an out-of-table position reads a NaN row, never another row
    outside = (pos < 0) | (pos >= cos_table.shape[0])
    pos = pos.clamp(0, max(cos_table.shape[0] - 1, 0))
    cos = cos_table[pos, pair_index].masked_fill(outside, float("nan"))
    sin = sin_table[pos, pair_index].masked_fill(outside, float("nan"))
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _axis_of_pair(mrope_section: list, interleaved: bool, half: int, device) -> torch.Tensor:
    """Each pair's axis (0 temporal, 1 height, 2 width; ``ropekit.positions.mrope_axis_of_pair``'s), computed on
    ``device`` from the pair index: no host data is copied to the device, so a CUDA graph can capture the build."""
    pairs = torch.arange(half, device=device)
    if interleaved:
        _, h, w = mrope_section
        return ((pairs % 3 == 1) & (pairs < 3 * h)).long() + 2 * ((pairs % 3 == 2) & (pairs < 3 * w)).long()
    axis = torch.zeros_like(pairs)
    for start in itertools.accumulate(mrope_section[:-1]):  # section j's pairs have passed j section starts
        axis += pairs >= start
    return axis % 3


def _check_mrope_arguments(cos_table, sin_table, position_ids, mrope_section) -> None:
    for name, t in (("cos_table", cos_table), ("sin_table", sin_table)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.ndim != 2:
            raise ValueError(f"{name} must be a 2-D floating tensor (max_positions, rotary_dim/2), got "
                             f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
    if cos_table.shape != sin_table.shape:
        raise ValueError(f"cos_table and sin_table must have the same shape, got {tuple(cos_table.shape)} and "
                         f"{tuple(sin_table.shape)}")
    if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"position_ids must be an int32 or int64 tensor, got "
                        f"{getattr(position_ids, 'dtype', type(position_ids).__name__)}")
    if position_ids.device != cos_table.device:
        raise ValueError(f"position_ids is on {position_ids.device} but cos_table is on {cos_table.device}")
    try:
        section = [operator.index(n) for n in mrope_section if not isinstance(n, bool)]
    except TypeError:
        section = []
    if not section or len(section) != len(list(mrope_section)) or min(section) < 0:
        raise ValueError(f"mrope_section must be a non-empty list of non-negative ints, got {list(mrope_section)}")
    if sum(section) != cos_table.shape[-1]:
        raise ValueError(f"mrope_section {section} must sum to rotary_dim/2 = {cos_table.shape[-1]}")


def _check_positions_in_table(position_ids: torch.Tensor, rows: int) -> None:
    if position_ids.numel() == 0 or torch.compiler.is_compiling() or (
            position_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    low, high = int(position_ids.min()), int(position_ids.max())
    if low < 0 or high >= rows:
        raise ValueError(f"position_ids must lie in [0, {rows}) (the table's rows), got values from {low} to {high}")


def rope_config(config, layer_type: str | None = None) -> tuple[dict, int]:
    """(rope parameters dict, rotary_dim) from a transformers config object or dict (``rope_parameters`` or the
    legacy ``rope_scaling`` + ``rope_theta``; ``layer_type`` as :func:`ropekit.rope_parameters_from_config`); feed
    them to ``ropekit.RotaryEmbedding(scaling=...)``."""
    from .frequencies import rope_parameters_from_config

    params = rope_parameters_from_config(config, layer_type)
    return params, params["rotary_dim"]


# (q and k's dtype, cos/sin's): the last as OLMo-style rotary modules return float32 rows beside bf16 activations
_PROBE_DTYPES = ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32))
_verdicts: dict = {}  # (module name, its function, its rotate_half) -> why the drop-in can't stand in (None: it can)


# The probe's sequences, (tokens, batch): a short prefill, a decode step, one past a few token blocks, and one past
# 8192 tokens (llama3's trained context; past longrope's and most yarn models' original one), where a module that
# switches its computation for long sequences (as the dynamic, yarn, longrope and llama3 rope types may) shows it. A
# module's function cannot tell its model's rope type (the config holds it), so every module runs every length.
_PROBE_SHAPES = ((5, 2), (1, 1), (40, 1), (8200, 1))


def _probe_inputs(rotary_dim: int, seq: int, batch: int) -> tuple[torch.Tensor, ...]:
    """q (2 heads) and k (1 head) of head_dim 16 in transformers' ``(batch, heads, seq, head_dim)`` and per-token
    cos/sin rows of ``rotary_dim`` columns, the two halves equal (as transformers' rotary modules return them), in
    float64 on the CPU: each dtype's probe casts them."""
    generator = torch.Generator().manual_seed(seq)
    q = torch.randn(batch, 2, seq, 16, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, 1, seq, 16, generator=generator, dtype=torch.float64)
    theta = torch.rand(batch, seq, rotary_dim // 2, generator=generator, dtype=torch.float64) * 40
    return q, k, torch.cat((theta.cos(), theta.cos()), -1), torch.cat((theta.sin(), theta.sin()), -1)


def _sampled_tokens(seq: int) -> list[int]:
    """The tokens of a probe the drop-in is compared on: all of a short one; of a longer one the first and the last,
    and of one past 8192 tokens also token 8192. (With ``_PROBE_SHAPES``, 16 in all: one program's tile under the
    interpreter.)"""
    if seq <= 8:
        return list(range(seq))
    return sorted({0, seq - 1} | ({8192} if seq > 8192 else set()))


def _fold(x: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The sampled tokens of every sequence of a ``(batch, heads, seq, d)`` tensor or ``(batch, seq, d)`` rows, as one
    sequence of ``batch * len(tokens)`` tokens (``(1, heads, n, d)`` or ``(1, n, d)``)."""
    if x.ndim == 4:
        picked = x[:, :, tokens].transpose(0, 1)
        return picked.reshape(1, picked.shape[0], -1, picked.shape[-1])
    return x[:, tokens].reshape(1, -1, x.shape[-1])


def _rotate_half_hint(module) -> str:
    """A word on the module's ``rotate_half`` when it is not transformers' ``(x1, x2) -> (-x2, x1)``."""
    rotate = getattr(module, "rotate_half", None)
    if rotate is None:
        return ""
    from .reference import rotate_half as neox_rotate_half
    x = torch.randn(2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    try:
        got = rotate(x)
    except Exception:  # noqa: BLE001  (any failure only means: no hint)
        return ""
    if torch.equal(got, neox_rotate_half(x)):
        return ""
    gptj = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    if torch.equal(got, gptj):
        return (" Its rotate_half pairs channels GPT-J's way (x[..., 0::2], x[..., 1::2]): use "
                "ropekit.RotaryEmbedding(..., interleaved=True) or apply_rope(interleaved=True).")
    return " Its rotate_half is not transformers' (x1, x2) -> (-x2, x1)."


def _probe(original) -> str | None:
    """Run ``original`` and the drop-in on the same probe inputs: None when they agree (bit for bit in bfloat16, at
    float32's default tolerance in float32), else what differs. cos/sin full width, then half width (partial rotary):
    a width ``original`` cannot take is skipped, but each dtype needs one width it takes. Each width runs every
    sequence of ``_PROBE_SHAPES``; the drop-in's result for a token depends on that token's q, k, cos and sin only, so
    it runs once on the sampled tokens of them all (a long call is minutes in the Triton interpreter)."""
    from .device import DEVICE
    inputs = {}  # (rotary_dim, seq, batch) -> the float64 inputs, drawn once for every dtype
    for dtype, table_dtype in _PROBE_DTYPES:
        ran = False
        for width, rotary_dim in (("full-width", 16), ("half-width", 8)):
            probes = []
            for seq, batch in _PROBE_SHAPES:
                if (rotary_dim, seq, batch) not in inputs:
                    inputs[rotary_dim, seq, batch] = _probe_inputs(rotary_dim, seq, batch)
                q, k, cos, sin = inputs[rotary_dim, seq, batch]
                q, k = (t.to(device=DEVICE, dtype=dtype) for t in (q, k))
                cos, sin = (t.to(device=DEVICE, dtype=table_dtype) for t in (cos, sin))
                where = (f"a {seq}-token {str(dtype).removeprefix('torch.')} probe with {width} cos/sin in "
                         f"{str(table_dtype).removeprefix('torch.')}")
                try:
                    want = original(q.clone(), k.clone(), cos.clone(), sin.clone())
                except Exception as error:  # noqa: BLE001
                    if not probes:  # it does not take cos/sin of this width: models never call it so
                        break
                    return (f"on {where} it raises ({type(error).__name__}) where it takes {_PROBE_SHAPES[0][0]} "
                            "tokens")
                if not (isinstance(want, (tuple, list)) and len(want) == 2
                        and all(isinstance(w, torch.Tensor) and w.shape == x.shape for w, x in zip(want, (q, k)))):
                    kinds = ", ".join(f"{tuple(w.shape)} {str(w.dtype).removeprefix('torch.')}"
                                      if isinstance(w, torch.Tensor) else type(w).__name__ for w in want) \
                        if isinstance(want, (tuple, list)) else type(want).__name__
                    return f"on {where} it returns ({kinds}), not (q_embed, k_embed) of q's and k's shapes"
                tokens = _sampled_tokens(seq)
                probes.append((where, [_fold(t, tokens) for t in (q, k, cos, sin)], [_fold(w, tokens) for w in want]))
            if not probes:
                continue
            ran = True
            why = _compare(probes)
            if why is not None:
                return why
        if not ran and dtype == table_dtype:
            return f"it raises on every {str(dtype).removeprefix('torch.')} probe (full- and half-width cos/sin)"
    return None


def _compare(probes) -> str | None:
    """The drop-in, once, on every probe's sampled tokens, against the module's results there: what differs."""
    inputs = [torch.cat([given[i] for _, given, _ in probes], dim=2 if i < 2 else 1) for i in range(4)]
    try:
        got_q, got_k = apply_rotary_pos_emb(*inputs)
    except (TypeError, ValueError) as error:
        return f"on {probes[0][0]} ropekit's drop-in raises ({error}) where it returns a result"
    start = 0
    for where, given, want in probes:
        n = given[0].shape[2]
        for name, g, w in zip(("q", "k"), (got_q[:, :, start:start + n], got_k[:, :, start:start + n]), want):
            if w.dtype != g.dtype:
                return (f"on {where} its {name}_embed is {str(w.dtype).removeprefix('torch.')}, ropekit's "
                        f"{str(g.dtype).removeprefix('torch.')}")
            if g.dtype == torch.float32:
                same = torch.allclose(g, w, rtol=1.3e-6, atol=1e-5, equal_nan=True)
            else:
                same = torch.equal(g, w)
            if not same:
                gap = float((g.double() - w.double()).abs().max())
                exact = "differs from" if g.dtype == torch.float32 else "is not bit-identical to"
                return (f"on {where} its {name}_embed {exact} ropekit's (max |difference| {gap:.3g}); "
                        "it computes another rotation or rounds differently")
        start += n
    return None


def _why_not_drop_in(module) -> str | None:
    """Why ropekit's ``apply_rotary_pos_emb`` cannot stand in for ``module``'s (None when it can)."""
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is None:
        return "it has no apply_rotary_pos_emb"
    try:
        names = list(inspect.signature(original).parameters)[:4]
    except (TypeError, ValueError):
        names = []
    if names != ["q", "k", "cos", "sin"]:
        return f"its apply_rotary_pos_emb takes ({', '.join(names)}, ...), not (q, k, cos, sin, unsqueeze_dim)"
    key = (module.__name__, original, getattr(module, "rotate_half", None))
    if key not in _verdicts:
        why = _probe(original)
        _verdicts[key] = None if why is None else why + _rotate_half_hint(module)
    return _verdicts[key]


@contextlib.contextmanager
def patched(*module_names: str, fn=apply_rotary_pos_emb):
    """Temporarily replace ``apply_rotary_pos_emb`` in transformers model modules, e.g.
    ``with ropekit.hf.patched("transformers.models.llama.modeling_llama"): model(ids)``.

    With the default ``fn`` (the NeoX drop-in) every module is verified before anything is patched: its own
    ``apply_rotary_pos_emb`` and ropekit's run on probe inputs (float32 and bfloat16; full-width cos/sin, and
    half-width where the module takes them; 5, 1, 40 and 8200 tokens, the last past 8192 where a scaled rope type's
    code may switch) and must agree, bit for bit in bfloat16. A module that computes something else (another pairing,
    a sign-flipped ``rotate_half``, half-width cos, the complex form, float32 math rounded once, another signature,
    another result for decode steps or long sequences only) is refused with a ``ValueError`` naming it, instead of
    silently changing the model's output.
    A custom ``fn`` is the caller's to vouch for: it is not probed."""
    modules = [importlib.import_module(name) for name in module_names or ("transformers.models.llama.modeling_llama",)]
    if fn is apply_rotary_pos_emb:
        for module in modules:
            why = _why_not_drop_in(module)
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
