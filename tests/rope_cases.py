"""Shared test material for the API, v4 and launch tests: readable cases, random tensors in any layout, and their
float64 reference outputs."""

import torch

import ropekit
from ropekit import reference as ref
from ropekit.layouts import TO_BSHD
from conftest import DEVICE


def make(layout, batch, seqlen, heads, head_dim, dtype, *, noncontiguous=False):
    """A random tensor in ``layout``; optionally a non-contiguous view (a slice of a wider head_dim)."""
    shape_bshd = (batch, seqlen, heads, head_dim + (16 if noncontiguous else 0))
    x = torch.randn(shape_bshd, dtype=torch.float32, device=DEVICE).to(dtype)
    x = x.permute(TO_BSHD[layout]).contiguous()
    return x[..., :head_dim] if noncontiguous else x


def expected(x, layout, positions_bs, **kwargs):
    """Reference output in x's layout, from a (batch, seq) position tensor."""
    x_bshd = x.permute(TO_BSHD[layout])
    return ref.rope(x_bshd, positions_bs, **kwargs).permute(TO_BSHD[layout])


def table(rows=64, rotary_dim=32, base=10000.0):
    return ropekit.cos_sin_table(rows, rotary_dim, base=base, device=DEVICE)


# Readable cases: (id, layout, batch, seq, hq, hk, head_dim, rotary_dim, interleaved, positions-kind, dtype)
CASES = [
    ("bshd-neox-none-fp32", "bshd", 2, 5, 4, 2, 32, 32, False, "none", torch.float32),
    ("sbhd-gptj-offset-fp32", "sbhd", 2, 5, 4, 4, 32, 32, True, "int", torch.float32),
    ("bhsd-neox-seqoffsets-bf16", "bhsd", 3, 4, 4, 1, 32, 32, False, "offsets", torch.bfloat16),
    ("bshd-gptj-ids-fp16", "bshd", 2, 6, 2, 2, 48, 48, True, "ids", torch.float16),
    ("bshd-neox-partial-ids1d-fp32", "bshd", 2, 6, 4, 2, 64, 32, False, "ids1d", torch.float32),
    ("sbhd-gptj-partial-offsets-bf16", "sbhd", 2, 3, 2, 1, 40, 24, True, "offsets", torch.bfloat16),
    ("bshd-neox-hd80-none-fp64", "bshd", 1, 3, 2, 2, 80, 80, False, "none", torch.float64),
    ("bshd-neox-decode-offsets-fp16", "bshd", 4, 1, 4, 2, 32, 32, False, "offsets", torch.float16),
]


def positions_for(kind, batch, seqlen):
    """(argument passed to apply_rope, (batch, seq) positions for the reference)."""
    if kind == "none":
        return None, ref.token_positions(batch, seqlen)
    if kind == "int":
        return 7, ref.token_positions(batch, seqlen, offsets=7)
    if kind == "offsets":
        offsets = torch.randint(0, 40, (batch,))
        return offsets.to(DEVICE), ref.token_positions(batch, seqlen, offsets=offsets)
    if kind == "ids":
        ids = torch.randint(0, 60, (batch, seqlen))
        return ids.to(DEVICE), ids
    if kind == "ids1d":
        ids = torch.randperm(60)[:seqlen]
        return ids.to(DEVICE), ids.expand(batch, seqlen)
    raise AssertionError(kind)


def valid_call():
    """A valid (q, k, cos, sin) to spoil one argument of."""
    q = make("bshd", 2, 3, 4, 32, torch.float32)
    k = make("bshd", 2, 3, 2, 32, torch.float32)
    cos, sin = table(16, 32)
    return q, k, cos, sin
