"""ropekit.reliability.arena: every view kind places a tensor of the asked shape inside a guarded buffer, and
knows whether it overlaps itself."""

import random

import torch

from ropekit.reliability.arena import VIEW_KINDS, Arena, footprint, self_overlapping


def test_views_cover_what_they_claim():
    arena = Arena(random.Random(1), torch.Generator().manual_seed(1), "cpu")
    for kind in VIEW_KINDS:
        view = arena.place(kind, (2, 3, 4), torch.float32, kind)
        assert view.shape == (2, 3, 4)
        mask = footprint(view, arena.buffer_of(view).base)
        assert 0 < int(mask.sum()) <= view.numel() and not mask[0] and not mask[-1]  # guards on both sides
        assert self_overlapping(view) == (int(mask.sum()) < view.numel())
