"""Checks of the exercises that are not RoPE-shaped: the reader's function is called on fixed arguments.

Each check takes the reader's function and returns a :class:`~ropekit.course.diagnose.Finding`; an exercise names
its check in its ``check`` field (see ``exercises.py``), and the checker calls it instead of the RoPE cases.
"""

from __future__ import annotations

import torch

from .diagnose import Finding
from .errors import explain

__all__ = ["check_rotate_pair", "check_pair_indices"]


def check_rotate_pair(fn) -> Finding:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 64, dtype=torch.float64, generator=generator)
    theta = (torch.rand(64, dtype=torch.float64, generator=generator) * 2 - 1) * 3.0
    try:
        result = fn(a.clone(), b.clone(), theta.clone())
    except Exception as error:  # noqa: BLE001
        return explain(error)
    if result is None:
        return Finding("not_solved", "Not yet solved: your function returned None.")
    try:
        out_a, out_b = (torch.as_tensor(t, dtype=torch.float64) for t in result)
    except (TypeError, ValueError):
        return Finding("wrong", "Return two tensors: the turned a and the turned b.")
    expected_a, expected_b = a * torch.cos(theta) - b * torch.sin(theta), b * torch.cos(theta) + a * torch.sin(theta)

    def close(u, v):
        return u.shape == v.shape and bool(((u - v).abs() <= 1e-10).all())

    error = float(max((out_a - expected_a).abs().max(), (out_b - expected_b).abs().max())) \
        if out_a.shape == a.shape and out_b.shape == b.shape else None
    if close(out_a, expected_a) and close(out_b, expected_b):
        return Finding("correct", f"Correct: max |error| = {error:.3g}.", error)
    minus_a, minus_b = a * torch.cos(theta) + b * torch.sin(theta), b * torch.cos(theta) - a * torch.sin(theta)
    if close(out_a, minus_a) and close(out_b, minus_b):
        return Finding("wrong_direction", "Rotation in the wrong direction: your points turn clockwise (by -theta). "
                                          "Counter-clockwise is a' = a cos - b sin, b' = b cos + a sin.", error)
    if close(out_a, expected_b) and close(out_b, expected_a):
        return Finding("wrong", "The two results are swapped: return (turned a, turned b).", error)
    return Finding("wrong", "Not the rotation: for theta = pi/2 the point (1, 0) must go to (0, 1).", error)


def check_pair_indices(fn) -> Finding:
    for rotary_dim in (8, 12):
        for interleaved in (False, True):
            half = rotary_dim // 2
            pairs = torch.arange(half)
            neox = (pairs, pairs + half)
            gptj = (2 * pairs, 2 * pairs + 1)
            expected, other = (gptj, neox) if interleaved else (neox, gptj)
            call = f"pair_indices({rotary_dim}, interleaved={interleaved})"
            try:
                result = fn(rotary_dim, interleaved)
            except Exception as error:  # noqa: BLE001
                return explain(error)
            if result is None:
                return Finding("not_solved", "Not yet solved: your function returned None.")
            try:
                first, second = (torch.as_tensor(t) for t in result)
            except (TypeError, ValueError, RuntimeError):
                return Finding("wrong", f"{call}: return two integer tensors (first, second).")
            if first.dtype != torch.int64 or second.dtype != torch.int64:
                # index maps feed gather/index_select and pointer arithmetic, which take integers, not floats
                return Finding("wrong", (
                    f"{call} returned {first.dtype} and {second.dtype} tensors; the task asks for int64 channel "
                    "numbers (torch.arange gives int64 when its arguments are integers: keep rotary_dim // 2, "
                    "not rotary_dim / 2)."))
            first, second = first.reshape(-1), second.reshape(-1)

            def same(u, v):
                return u.shape == v.shape and bool((u == v).all())

            if same(first, expected[0]) and same(second, expected[1]):
                continue
            name = "GPT-J (interleaved)" if interleaved else "NeoX"
            if same(first, other[0]) and same(second, other[1]):
                return Finding("other_pairing", (
                    f"{call}: you returned the other pairing. {name} pairs channels "
                    + ("(2i, 2i + 1): neighbours." if interleaved else f"(i, i + {half}): the two halves.")))
            if same(first, expected[1]) and same(second, expected[0]):
                return Finding("wrong_direction", (
                    f"{call}: the right pairs in the wrong order (second, first). Rotating (b, a) instead of (a, b) "
                    "turns every pair the other way (-θ)."))
            return Finding("wrong", (
                f"{call} returned first={first.tolist()}, second={second.tolist()}; expected "
                f"first={expected[0].tolist()}, second={expected[1].tolist()}."))
    return Finding("correct", "Correct: both pairings, for rotary_dim 8 and 12 (index maps are exact: error 0).", 0.0)


