"""Check a ladder step against the float64 reference (``ropekit.reference``) on several shapes and every feature the
step has: what notebook 05 runs after each step, and what the tests run for every step."""

from __future__ import annotations

import inspect

import torch

from ... import reference
from ...frequencies import cos_sin_table
from ...testing import assert_close_to_reference
from ..speed import QKShape as Shape
from .launch import FlatBlock, LadderConfig, rope_ladder

__all__ = ["Shape", "SHAPES", "CONFIGS", "FLAT_CONFIGS", "configs_for", "check_step"]


# Nothing divides evenly: token tails (5, 7 tokens), head tails (3, 5 heads; MQA's single k head), a head_dim that is
# not a power of two (80: 40 pairs in a block of 64 lanes), and each float dtype.
SHAPES = (
    Shape(2, 5, 3, 2, 16, torch.float32),
    Shape(1, 7, 5, 1, 80, torch.float16),
    Shape(3, 4, 4, 4, 32, torch.bfloat16),
)
# None: the launcher's own tile; (2, 2, 1): several token tiles and head blocks even on these small shapes.
CONFIGS = (None, LadderConfig(2, 2, 1))
# The flat path (step 8): its own default block, and blocks of 64 elements (many blocks; with head_dim 80 a block
# ends inside a head vector, so a partner lies in another program's block).
FLAT_CONFIGS = (None, FlatBlock(64, 1))


def configs_for(module) -> tuple:
    """The launch configs a step is checked with: tiles, or for the flat path (a ``BLOCK`` argument) flat blocks."""
    return FLAT_CONFIGS if "BLOCK" in inspect.signature(module.KERNEL.fn).parameters else CONFIGS


def _runs(features, shape: Shape, device):
    """(label, keyword arguments, reference keyword arguments) for each feature combination the step can run."""
    batch, seq = shape.batch, shape.seq
    yield "positions 0..seq-1", {}, {"positions": reference.token_positions(batch, seq)}
    if "positions" in features:
        offsets = torch.tensor([3, 0, 9][:batch], device=device)
        ids = torch.randint(0, 40, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
        shared = torch.arange(seq, device=device) * 2 + 1  # (seq,): the same ids for every sequence
        yield "scalar offset 7", {"positions": 7}, {"positions": reference.token_positions(batch, seq, offsets=7)}
        yield "per-sequence offsets", {"positions": offsets}, {
            "positions": reference.token_positions(batch, seq, offsets=offsets.cpu())}
        yield "position ids (b, s)", {"positions": ids}, {"positions": ids.cpu()}
        yield "position ids (s,), broadcast", {"positions": shared}, {
            "positions": reference.token_positions(batch, seq, position_ids=shared.cpu())}
    if "gptj" in features:
        yield "GPT-J pairs", {"interleaved": True}, {"positions": reference.token_positions(batch, seq),
                                                      "interleaved": True}
    if "partial" in features:
        rotary = shape.head_dim // 2 if shape.head_dim % 4 == 0 else shape.head_dim - 2
        yield f"rotary_dim {rotary}", {"rotary_dim": rotary}, {
            "positions": reference.token_positions(batch, seq), "rotary_dim": rotary}
        yield f"rotary_dim {rotary}, in place", {"rotary_dim": rotary, "inplace": True}, {
            "positions": reference.token_positions(batch, seq), "rotary_dim": rotary}
    if "int64" in features:  # the int64 offsets, forced on a small tensor: the same code path a huge tensor takes
        yield "int64 offsets (forced)", {"force_int64": True}, {"positions": reference.token_positions(batch, seq)}
    if "conjugate" in features:
        yield "conjugate (backward)", {"conjugate": True, "positions": 2}, {
            "positions": reference.token_positions(batch, seq, offsets=2), "conjugate": True}
        yield "conjugate, in place, GPT-J", {"conjugate": True, "inplace": True, "interleaved": True}, {
            "positions": reference.token_positions(batch, seq), "conjugate": True, "interleaved": True}


def check_step(module, device, shapes=SHAPES, configs=None, *, newest_only: bool = False) -> list[str]:
    """Run ``module``'s kernel on every shape, tile config and feature it has; assert each against the float64
    reference (outputs NaN-poisoned first; q and k both); return one line per run.

    ``configs``: default :func:`configs_for` the step. ``newest_only``: of the features, only the one this step adds
    (and plain positions 0..seq-1)."""
    kernel = module.KERNEL
    configs = configs_for(module) if configs is None else configs
    features = module.FEATURES[-1:] if newest_only else module.FEATURES
    lines = []
    generator = torch.Generator().manual_seed(0)
    for shape in shapes:
        q = torch.randn(shape.batch, shape.seq, shape.heads_q, shape.head_dim, generator=generator)
        k = torch.randn(shape.batch, shape.seq, shape.heads_k, shape.head_dim, generator=generator)
        q, k = q.to(device=device, dtype=shape.dtype), k.to(device=device, dtype=shape.dtype)
        for label, kwargs, ref_kwargs in _runs(features, shape, device):
            rotary = kwargs.get("rotary_dim", shape.head_dim)
            cos, sin = cos_sin_table(64, rotary, device=device)
            positions = ref_kwargs["positions"]
            others = {key: value for key, value in ref_kwargs.items() if key != "positions"}
            want_q, want_k = reference.rope(q, positions, **others), reference.rope(k, positions, **others)
            for config in configs:
                if kwargs.get("inplace"):  # rotate copies of q and k in their own memory
                    got_q, got_k = rope_ladder(kernel, q.clone(), k.clone(), cos, sin, config=config, **kwargs)
                else:
                    got_q, got_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
                    rope_ladder(kernel, q, k, cos, sin, out_q=got_q, out_k=got_k, config=config, **kwargs)
                assert_close_to_reference(got_q, want_q)
                assert_close_to_reference(got_k, want_k)
            lines.append(f"{shape.words:38s} {label:32s} q and k match the float64 reference")
    return lines
