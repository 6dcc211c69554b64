"""The v4 ladder: notebook 05 builds the production kernels in eight steps, each a complete kernel of its own.

Each step is a **teaching copy** of the step before it with one idea added, so that its diff with that step is the
lesson; the package's production kernel (``ropekit.triton.v4``) is where the ideas live together, with the switches
that only buy speed. Every step runs through the same launcher (:func:`rope_ladder`) and is checked against the
float64 reference on several shapes (:mod:`.verify`).

1. ``step1_qk`` — q and k in one launch (GQA: fewer k heads), tiles of tokens x heads, positions 0..seq-1;
2. ``step2_positions`` — a scalar offset, per-sequence offsets or position ids;
3. ``step3_gptj`` — GPT-J's neighbour pairs as a switch;
4. ``step4_partial`` — rotary on the first ``rotary_dim`` channels only, the tail copied;
5. ``step5_conjugate`` — the rotation by -θ (the backward pass); in place needs no new kernel code;
6. ``step6_int64`` — offsets in int64 when a tensor spans 2**31 elements or more;

and two steps that add speed, not features, each a copy of step 1 (what the timed prefill needs) with one idea:

7. ``step7_fused_qk`` — one program takes a block of tokens x every head of q and of k, all loads before any store,
   cos/sin fetched once for both (the production tile's ``TILE.FUSED_QK``);
8. ``step8_flat`` — blocks of consecutive elements, each element's NeoX partner loaded separately (torch.compile's
   structure; the production flat kernel, ``ropekit.triton.v4_flat``, takes whole head vectors instead and loads
   each pair once); contiguous NeoX over the whole head only.

``FEATURE_STEPS`` and ``SPEED_STEPS`` name the two groups; a speed step's ``BASE`` names the step it copies.
"""

from __future__ import annotations

import ast
import importlib
import inspect

from .launch import FlatBlock, LadderConfig, bytes_moved, needs_int64, rope_ladder

__all__ = ["STEPS", "step", "kernel_lines", "rope_ladder", "LadderConfig", "FlatBlock", "FEATURE_STEPS", "SPEED_STEPS", "base",
           "bytes_moved", "needs_int64"]

FEATURE_STEPS = ("step1_qk", "step2_positions", "step3_gptj", "step4_partial", "step5_conjugate", "step6_int64")
SPEED_STEPS = ("step7_fused_qk", "step8_flat")
STEPS = FEATURE_STEPS + SPEED_STEPS


def step(name_or_number):
    """A step's module, by number (1..8) or name."""
    name = STEPS[name_or_number - 1] if isinstance(name_or_number, int) else name_or_number
    if name not in STEPS:
        raise ValueError(f"no ladder step {name_or_number!r}; the steps are {', '.join(STEPS)}")
    return importlib.import_module(f"{__name__}.{name}")


def base(module):
    """The step a step is a copy of: the one before it, or a speed step's ``BASE``; None for step 1."""
    name = module.__name__.rsplit(".", 1)[-1]
    if hasattr(module, "BASE"):
        return step(module.BASE)
    number = STEPS.index(name)
    return step(number) if number else None


def kernel_lines(module) -> int:
    """Lines of kernel code in a step: its @triton.jit functions without blank lines, comments and docstrings."""
    functions = {id(fn): fn for fn in (getattr(v, "fn", None) for v in vars(module).values())
                 if fn is not None and getattr(fn, "__module__", None) == module.__name__}
    count = 0
    for fn in functions.values():
        source = inspect.getsource(fn)
        tree = ast.parse(source).body[0]
        skipped = set()
        first = tree.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            skipped = set(range(first.lineno, first.end_lineno + 1))
        count += sum(1 for number, line in enumerate(source.splitlines(), start=1)
                     if number not in skipped and line.strip() and not line.strip().startswith("#"))
    return count
