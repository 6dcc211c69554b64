"""Read a RoPE output and say which mistake produced it.

Every diagnosis comes from the numbers the reader's code produced, never from its source:

1. memory first: canaries around the output that changed (written out of bounds); under partial rotary, a first
   quarter paired with i + head_dim/2 (the full rotary's partner); a pass-through tail that changed; poison that is
   still there (never written);
2. then the values: the output is compared with ``ropekit.reference`` and, when it differs, with the reference of each
   usual mistake (the other direction, the other pairing, positions shifted by one, the channel stride ignored). The
   mistake whose reference matches is the diagnosis;
3. then the position each head vector was actually rotated at, recovered from the output: positions that change from
   head to head within a token mean a cos/sin block broadcast along the wrong axis; positions constant per token but
   not the token's own are wrong positions (offsets ignored, a wrong row index);
4. what is left: a half-precision output that is close but not float32-accurate (math done in half precision), and,
   where the code builds its own frequencies, angles that fit a different ``base``.

An exception (a compile error, a kernel decorated before ``import ropekit``) is read by ``errors.py`` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import reference
from ..testing import ulp
from .addressing import (Names, describe_cells, describe_outside, matching_strides, past_ks_heads, ranges,
                         unwritten_hint, whole_tokens_or_heads)
from .buffers import CANARY, POISON
from .cases import RopeInputs

__all__ = ["DIAGNOSES", "PASSING_NOTES", "GENERIC", "Finding", "analyse", "HALF_DTYPES", "ranges", "within_bound"]

# name -> what it means, in one line (the checker's messages say it at length)
DIAGNOSES = {
    "correct": "matches the float64 reference within the dtype's accuracy bound",
    "not_solved": "the template is untouched (raises NotImplementedError, or writes nothing)",
    "raised": "the code raised an exception",
    "compile_error": "the kernel does not compile (Triton's compiler or interpreter, or nvcc, rejected it)",
    "import_order": "a kernel decorated before `import ropekit` on a machine without a GPU (import ropekit first)",
    "needs_gpu": "the exercise needs a CUDA GPU to run (only compiled here)",
    "too_slow": "correct, but slower than the speed target against the copy ceiling measured in the same check",
    "wrong_direction": "rotation by -θ instead of +θ (or +θ where the backward asks for -θ)",
    "sign_in_one_channel": "one channel of each pair has the wrong sign on its sin term, the other channel is right",
    "other_pairing": "NeoX pairs (i, i + rotary_dim/2) and GPT-J pairs (2i, 2i+1) mixed up",
    "position_shift": "every token rotated with the angle of the position next to its own",
    "wrong_positions": "tokens rotated at positions other than their own (offsets ignored, the wrong row index)",
    "broadcast": "a token's cos/sin applied to other tokens' heads: a block broadcast along the wrong axis",
    "partial_pairing": "partial rotary paired channel i with i + head_dim/2 instead of i + rotary_dim/2",
    "tail_touched": "the channels past rotary_dim (the pass-through tail) were changed",
    "wrong_base": "frequencies built from another base than the one asked for",
    "half_precision_math": "close, but not float32-accurate: the math ran in half precision",
    "unwritten": "some output elements were never written (a mask too tight)",
    "out_of_bounds": "memory outside the output was written (a mask too loose)",
    "stray_rows": "cache rows that no token's slot names were written (a head mask or a slot's row start is off)",
    "load_out_of_bounds": "a load read past the end of an input (a load without a mask or bounds guard; found under "
                          "the interpreter or the CPU emulation of a CUDA kernel)",
    "overlapping_stores": "two threads stored to one output element (a stride too small; a race on a GPU)",
    "out_stride": "right values stored where another layout keeps them: out addressed with x's or contiguous strides",
    "stride_ignored": "the head-dim stride of a non-contiguous input was taken as 1",
    "cos_sin_reloaded": "correct values, passed with a note: each program reloads cos/sin in every head step",
    "wrong": "differs from the reference in a way the checker does not recognise",
}

# Diagnoses that pass with a note: the values are right and the cost is measured small (the check stays ok).
PASSING_NOTES = frozenset({"cos_sin_reloaded"})

# Considered for every RoPE-shaped exercise, whatever it lists: each fires only when the output (or the error) has its
# unmistakable signature, so a correct output or another mistake never triggers it.
GENERIC = frozenset({"wrong_positions", "broadcast", "partial_pairing", "compile_error", "import_order",
                     "out_stride", "sign_in_one_channel"})

HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class Finding:
    diagnosis: str
    message: str
    max_error: float | None = None


# --- accuracy bounds ---------------------------------------------------------------------------------------------

def within_bound(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, *, scale: float) -> torch.Tensor:
    """Elementwise: ``y`` within the bound of ``ropekit.testing`` for ``dtype`` (``scale`` = max|ref|)."""
    error = (y - ref).abs()
    if dtype in HALF_DTYPES:
        return error <= ulp(ref, dtype) + 1e-6 * scale
    if dtype == torch.float64:
        return error <= 1e-10 * max(scale, 1.0)
    return error <= 1e-5 * max(scale, 1.0)


def _matches(y: torch.Tensor, alt: torch.Tensor, dtype: torch.dtype, scale: float) -> bool:
    """Does ``y`` equal a mistake's reference? Looser than the pass bound: a half-precision output that also has a
    second, smaller problem should still be recognised."""
    error = (y - alt).abs()
    if not bool(torch.isfinite(error).all()):
        return False
    if dtype in HALF_DTYPES:
        return float(error.max()) <= 0.02 * scale
    return float(error.max()) <= 1e-4 * max(scale, 1.0)


# --- the analysis --------------------------------------------------------------------------------------------------

def analyse(inputs: RopeInputs, output: torch.Tensor, *, candidates: frozenset[str],
            names: Names = Names(), program: str = "tile") -> Finding:
    """Diagnose ``output`` (the output view after the run, or the tensor the code returned); ``names`` says how the
    reader's kernel names its elements (q's and k's heads in one output, for exercise 05); ``program`` says what the
    reader wrote, so that hints use its words: ``"function"`` (PyTorch), ``"row"`` (one program a head vector) or
    ``"tile"`` (a program a block of tokens and heads)."""
    case = inputs.case
    x = inputs.x.view
    x64 = x.detach().to(torch.float64).cpu()
    expected = inputs.expected
    y = output.detach().to(torch.float64).cpu()
    scale = float(expected.abs().max())
    rot = case.rot

    written = torch.ones_like(y, dtype=torch.bool)
    for name, before in inputs.inputs_before.items():
        after = getattr(inputs, name).storage.detach().cpu()
        changed = ~((after == before) | (torch.isnan(after) & torch.isnan(before)))
        if inputs.out is not None and changed.any():
            return Finding("out_of_bounds", (
                f"Written out of bounds: {int(changed.sum())} elements of the input {name} were overwritten. Only "
                "OUT may be stored to; check the pointer each tl.store (or write) uses."))
    if inputs.out is not None:
        written = y != POISON
        outside = inputs.out.outside()
        touched = outside != CANARY
        if not written.any() and not touched.any():
            return Finding("not_solved", "Not yet solved: the kernel ran but wrote nothing (every output element "
                                         "still holds the poison value the checker put there).")
        if touched.any():
            where_outside = torch.nonzero(~inputs.out.in_view).flatten()[touched]
            if "out_stride" in candidates:
                borrowed = matching_strides(inputs, expected,
                                            lambda values: within_bound(values, expected, case.dtype, scale=scale))
                if borrowed is not None:
                    return Finding("out_stride", (
                        f"The output is addressed with the wrong strides, not written past a mask: {borrowed}. "
                        f"{int(touched.sum())} of the stores land in the gaps around and between out's elements, "
                        "and the elements they should have filled are wrong or never written. Build every store's "
                        "address from OUT's own strides (stride_ob, stride_os, stride_oh, stride_od): a view such as "
                        "out need not be laid out like x, nor be contiguous."))
            stray = (f"{int(touched.sum())} elements of the memory around and between the output's elements were "
                     f"overwritten: {describe_outside(inputs, where_outside, names)}.")
            ghosts = past_ks_heads(inputs, names, where_outside)
            if ghosts:
                n_q = names.split
                n_k = y.shape[2] - n_q
                return Finding("out_of_bounds", (
                    f"Written out of bounds exactly where k's head{'s' if len(ghosts) > 1 else ''} {ranges(ghosts)} "
                    f"would be in out_k: {stray} "
                    f"k has n_heads_k heads (GQA; here {n_k}, q has {n_q}): mask k's head lanes with n_heads_k, not "
                    "n_heads_q (nor the block's width BLOCK_H)."))
            if not written.all():
                return Finding("out_of_bounds", (
                    f"Stores landed beside their targets: {stray} Meanwhile {describe_cells(~written, names)} were "
                    "never written. The lanes are shifted, not too many: an offset is off (for example the second "
                    "half of a head vector starts HEAD_DIM // 2 channels in, whatever the block's width), so "
                    "stores meant for the missing elements went past them."))
            return Finding("out_of_bounds", (
                f"Written out of bounds (a mask too loose?): {stray} Every store needs a mask that is false for "
                "lanes past the end of the row (or tile)."))

    if "partial_pairing" in candidates:
        finding = _partial_pairing(inputs, y, x64, written, scale)
        if finding is not None:
            return finding

    if rot < case.head_dim:
        tail_changed = written[..., rot:] & (y[..., rot:] != x64[..., rot:])
        if tail_changed.any():
            rotary_ok = bool(within_bound(y[..., :rot], expected[..., :rot], case.dtype, scale=scale).all())
            return Finding("tail_touched", (
                f"The tail of the partial rotary was changed: only the first rotary_dim = {rot} of the "
                f"{case.head_dim} channels turn; channels {rot}-{case.head_dim - 1} must come out equal to the "
                f"input, but {int(tail_changed.sum())} of them differ. "
                + ("The rotated channels themselves are right." if rotary_ok else
                   f"The rotated channels are wrong too: with partial rotary the pairs are "
                   f"{'(2i, 2i + 1)' if case.interleaved else f'(i, i + {rot // 2})'} and the pair index runs to "
                   f"rotary_dim/2 = {rot // 2}, not head_dim/2.")))

    if not written.all():
        where = describe_cells(~written, names)
        hint = unwritten_hint(~written, names)
        if rot < case.head_dim and not (~written)[..., :rot].any():
            hint = ("Out of place, the tail channels past rotary_dim are not rotated but must still be copied to "
                    "the output.")
        return Finding("unwritten", f"Elements never written: {where} still hold the poison value. {hint}")

    error = (y - expected).abs()
    max_error = float(error.max()) if error.numel() else 0.0
    if bool(within_bound(y, expected, case.dtype, scale=scale).all()):
        return Finding("correct", "", max_error)

    finding = _match_mistake(inputs, y, scale, candidates)
    if finding is not None:
        finding.max_error = max_error
        return finding

    finding = _fit_positions(inputs, y, x64, scale, candidates, names, program)
    if finding is not None:
        finding.max_error = max_error
        return finding

    dtype_name = str(case.dtype).replace("torch.", "")
    if "half_precision_math" in candidates and case.dtype in HALF_DTYPES and bool(torch.isfinite(y).all()) \
            and max_error <= 0.03 * float(x64.abs().max()):
        ulps = float((error / ulp(expected, case.dtype)).max())
        return Finding("half_precision_math", (
            f"Close, but not float32-accurate: computed in float32 and rounded once at the end, a {dtype_name} "
            f"output is off by at most one {dtype_name} ulp plus 1e-6 of the largest value (the checker's bound); "
            f"yours is off by up to {ulps:.1f} ulps "
            f"(max |error| {max_error:.3g}). Part of the math ran in half precision: convert x (and cos/sin) to "
            f"float32 before multiplying, and convert to {dtype_name} only for the result."),
            max_error)

    if "wrong_base" in candidates:
        finding = _fit_base(inputs, y, x64, scale)
        if finding is not None:
            finding.max_error = max_error
            return finding

    nan_hint = ""
    if bool(torch.isnan(y).any()):
        nan_hint = (f" {int(torch.isnan(y).sum())} outputs are NaN: the memory around the cos/sin table holds NaN, "
                    "so a read outside the table (a row past its end or before its start) shows up like this.")
    worst = torch.unravel_index(torch.argmax(torch.nan_to_num(error, nan=float("inf"))), error.shape)
    return Finding("wrong", (
        f"Does not match the reference: max |error| {max_error:.3g} at {names.element(worst)} (expected "
        f"{float(expected[worst]):.6g}, got {float(y[worst]):.6g}).{_where_wrong(y, expected, case, scale, names)} "
        f"It matches none of the mistakes the checker recognises. Try the case by hand: print your output next to "
        f"ropekit.reference.rope(...) for one token.{nan_hint}"), max_error)


def _where_wrong(y: torch.Tensor, expected: torch.Tensor, case, scale: float, names: Names) -> str:
    """Where the wrong elements lie, when that points at one offset: whole sequences (the batch offset), whole heads
    (the head offset), whole tokens (the token offset)."""
    wrong = ~within_bound(y, expected, case.dtype, scale=scale)
    if bool(wrong.all()):
        return ""  # everything is wrong: no one offset to point at
    per_seq = wrong.any(dim=(1, 2, 3))
    if wrong.shape[0] > 1 and bool(per_seq[0]) is False and bool(per_seq.any()) and torch.equal(
            wrong, per_seq[:, None, None, None].expand_as(wrong)):
        return (f" Sequence 0 is right and every element of sequences {ranges(torch.nonzero(per_seq).flatten())} is "
                "wrong: is the batch offset (batch x the batch stride) in every address?")
    whole = whole_tokens_or_heads(wrong)
    if whole is not None and whole[0] == "heads":
        return (f" Exactly {names.heads(torch.nonzero(whole[1]).flatten())} are wrong, in every token: look at the "
                "head offset (head x the head stride).")
    if whole is not None:
        return " Whole tokens are wrong and others right: look at the token offset (token x the sequence stride)."
    return ""


def _alternatives(inputs: RopeInputs, candidates: frozenset[str]):
    """(diagnosis, reference of that mistake, (batch, seq) rows where it is defined, words) for each candidate."""
    case = inputs.case
    x = inputs.x.view
    kwargs = dict(base=case.base, rotary_dim=case.rot, interleaved=case.interleaved, conjugate=case.conjugate)
    all_rows = torch.ones(case.batch, case.seq, dtype=torch.bool)
    if "wrong_direction" in candidates:
        flipped = dict(kwargs, conjugate=not case.conjugate)
        if case.conjugate:
            words = ("Rotation in the wrong direction: this case asks for the backward (the conjugate rotation, by "
                     "-θ) and your output is the forward rotation by +θ. The backward is the same rotation with "
                     "sin negated.")
        else:
            words = ("Rotation in the wrong direction: your output is the rotation by -θ. A pair (a, b) turns to "
                     "(a cos θ - b sin θ, b cos θ + a sin θ): check the signs of the two sin terms.")
        yield "wrong_direction", reference.rope(x, inputs.positions, **flipped), all_rows, words
    if "sign_in_one_channel" in candidates:
        yield from _one_channel_flipped(inputs, kwargs, all_rows)
    if "other_pairing" in candidates:
        other = dict(kwargs, interleaved=not case.interleaved)
        half = case.rot // 2
        if case.interleaved:
            words = (f"The other pairing: you rotated NeoX pairs (i, i + {half}) but this case asks for GPT-J's "
                     "interleaved pairs (2i, 2i + 1).")
        else:
            words = (f"The other pairing: you rotated GPT-J's neighbours (2i, 2i + 1) but this case asks for NeoX "
                     f"pairs (i, i + rotary_dim/2) = (i, i + {half}): the two halves of the rotary channels.")
        yield "other_pairing", reference.rope(x, inputs.positions, **other), all_rows, words
    if "position_shift" in candidates:
        for delta in (1, -1):
            shifted = inputs.positions + delta
            rows = shifted >= 0 if case.table_len is None else (shifted >= 0) & (shifted < case.table_len)
            where = (f"the cos/sin row {'after' if delta > 0 else 'before'} the right one" if case.table_len
                     is not None else f"positions {'+' if delta > 0 else '-'} 1 in the angles, or a position "
                     "counted from 1")
            words = (f"Positions shifted by one: every token was rotated with the angle of position "
                     f"p {'+' if delta > 0 else '-'} 1 instead of its own position p (e.g. {where}).")
            if case.offsets:
                words += " In decode, token s of sequence b sits at offsets[b] + s."
            yield "position_shift", reference.rope(x, shifted, **kwargs), rows, words
    if "stride_ignored" in candidates and x.stride(-1) != 1:
        as_if_contiguous = torch.as_strided(inputs.x.storage, x.shape, x.stride()[:-1] + (1,), x.storage_offset())
        words = (f"The head-dim stride was ignored: in this case x is a non-contiguous view whose channels are "
                 f"{x.stride(-1)} elements apart (stride_xd = {x.stride(-1)}), and your output is what you get by "
                 "reading them as if they were adjacent. Multiply the channel index by the head-dim stride.")
        yield "stride_ignored", reference.rope(as_if_contiguous, inputs.positions, **kwargs), all_rows, words


def _one_channel_flipped(inputs: RopeInputs, kwargs: dict, rows: torch.Tensor):
    """One channel of every pair right and the other turned the other way: a single sin term with the wrong sign.
    (Both flipped is the rotation by -θ: ``wrong_direction``.)"""
    case = inputs.case
    x = inputs.x.view
    right = reference.rope(x, inputs.positions, **kwargs)
    flipped = reference.rope(x, inputs.positions, **dict(kwargs, conjugate=not case.conjugate))
    half = case.rot // 2
    first = slice(0, case.rot, 2) if case.interleaved else slice(0, half)
    second = slice(1, case.rot, 2) if case.interleaved else slice(half, case.rot)
    s1, s2 = ("+", "-") if case.conjugate else ("-", "+")
    turn = f"(a·cos θ {s1} b·sin θ, b·cos θ {s2} a·sin θ)"
    for which, other, term, lanes in (("first", "second", "b·sin", first), ("second", "first", "a·sin", second)):
        alt = right.clone()
        alt[..., lanes] = flipped[..., lanes]
        yield "sign_in_one_channel", alt, rows, (
            f"The {which} channel of each pair is wrong: the sign of the {term} term. The {other} channel is right, "
            f"so this is not a turn the other way (that flips both signs). A pair (a, b) turns to {turn}.")


def _match_mistake(inputs: RopeInputs, y: torch.Tensor, scale: float, candidates: frozenset[str]) -> Finding | None:
    rot = inputs.case.rot
    for name, alt, rows, words in _alternatives(inputs, candidates):
        if not rows.any():
            continue
        if _matches(y[rows][..., :rot], alt[rows][..., :rot], inputs.case.dtype, scale):
            return Finding(name, words)
    return None


def _partial_pairing(inputs: RopeInputs, y: torch.Tensor, x64: torch.Tensor, written: torch.Tensor,
                     scale: float) -> Finding | None:
    """NeoX under partial rotary pairs channel i with i + rotary_dim/2. Pairing it with i + head_dim/2 (the full
    rotary's partner) leaves a recognisable first quarter, out[i] = x[i] cos - x[i + head_dim/2] sin, while channels
    rotary_dim/2 to rotary_dim never turn (unwritten, or copied unchanged)."""
    case = inputs.case
    rot, head_dim = case.rot, case.head_dim
    if rot >= head_dim or case.interleaved:
        return None
    quarter, half_head = rot // 2, head_dim // 2
    first = written[..., :quarter]
    second = written[..., quarter:rot] & (y[..., quarter:rot] != x64[..., quarter:rot])
    if not first.any() or second.any():
        return None  # channels past the first quarter turned as well: the pair index ran past rotary_dim/2
    inv_freq = torch.pow(torch.tensor(case.base, dtype=torch.float64),
                         -torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    theta = inputs.positions.to(torch.float64)[..., None, None] * inv_freq  # (batch, seq, 1, rot/2)
    sign = -1.0 if case.conjugate else 1.0
    alt = x64[..., :quarter] * theta.cos() - sign * x64[..., half_head:half_head + quarter] * theta.sin()
    got = y[..., :quarter][first]
    if not _matches(got, alt[first], case.dtype, scale) or _matches(got, inputs.expected[..., :quarter][first],
                                                                      case.dtype, scale):
        return None
    return Finding("partial_pairing", (
        f"Partial rotary pairs the wrong channels: only the first rotary_dim = {rot} of the {head_dim} channels turn, "
        f"so NeoX pair i is (i, i + rotary_dim/2) = (i, i + {quarter}) for i < {quarter}. Your output pairs channel i "
        f"with i + head_dim/2 = i + {half_head}, the partner it would have if the whole head turned. Use "
        "rotary_dim/2 (not head_dim/2) for the offset of the second half, and copy channels "
        f"{rot}-{head_dim - 1} unchanged."))


# How a token's angles reach the wrong heads, in the words of what the reader wrote.
_BROADCAST_HINTS = {
    "function": ("The angles were spread over the wrong axis: angles of shape (batch, seq, rotary_dim/2) meet x's "
                 "(batch, seq, heads, rotary_dim/2) from the right, so their seq axis lands on the head axis. Insert "
                 "the head axis: angles[:, :, None, :]."),
    "row": ("With one program a (token, head) row, the position comes from the row's token, "
            "(row // n_heads) % seq_len, not from the row index itself."),
    "thread": ("With one thread a pair, the position comes from the pair's token: its row is pair / n_pairs_per_row, "
               "and the row's token (row / n_heads) % seq_len, not the row index itself."),
    "tile": ("In a tile, a token's cos/sin row was spread over the wrong axis: a cos tile [BLOCK_S, HALF] combined "
             "with x [BLOCK_S, BLOCK_H, HALF] lines up from the right, so its token axis lands on the head axis. "
             "Insert the head axis: `cos[:, None, :]` is [BLOCK_S, 1, HALF], one token's row for all of its heads."),
}


def _fit_positions(inputs: RopeInputs, y: torch.Tensor, x64: torch.Tensor, scale: float,
                   candidates: frozenset[str], names: Names = Names(), program: str = "tile") -> Finding | None:
    """For each head vector, find the position whose rotation it is (if any). The pattern of those positions names
    the mistake: positions that change from head to head within one token come from a cos/sin block broadcast along
    the wrong axis; positions constant per token but not the token's own are wrong positions."""
    if not candidates & {"broadcast", "wrong_positions"}:
        return None
    case = inputs.case
    batch, seq, heads, head_dim = y.shape
    rot = case.rot
    truth = inputs.positions[:, :, None].expand(batch, seq, heads)
    n_positions = case.table_len if case.table_len is not None else int(truth.max()) + seq + 2
    rows = x64.reshape(-1, 1, 1, head_dim).expand(-1, n_positions, 1, head_dim)
    at = torch.arange(n_positions).expand(rows.shape[0], n_positions)
    every = reference.rope(rows, at, base=case.base, rotary_dim=rot, interleaved=case.interleaved,
                           conjugate=case.conjugate)[:, :, 0, :rot]  # (rows, positions, rot)
    error = (every - y.reshape(-1, 1, head_dim)[..., :rot]).abs().amax(dim=-1)
    error = torch.nan_to_num(error, nan=float("inf"))
    best = error.argmin(dim=1)
    tolerance = 0.02 * scale if case.dtype in HALF_DTYPES else 1e-4 * max(scale, 1.0)
    fitted = torch.where(error.gather(1, best[:, None])[:, 0] <= tolerance, best, -1).reshape(batch, seq, heads)
    zero = (y[..., :rot] == 0).all(dim=-1) & (x64[..., :rot] != 0).any(dim=-1)
    found = fitted >= 0
    if int(found.sum()) < max(2, found.numel() // 2) or not (found & (fitted != truth)).any():
        return None
    zero_words = (f" {int(zero.sum())} head vectors came out as zeros: their cos and sin were both 0, the `other` "
                  "of a masked load of a cos/sin row that was out of range." if zero.any() else "")
    varies = [(b, s) for b in range(batch) for s in range(seq)
              if len(set(fitted[b, s][found[b, s]].tolist())) > 1]
    if varies and "broadcast" in candidates and case.offsets:
        # Each head at its own token index plus some sequence's offset, another sequence's for some heads: the
        # offset was read with the wrong index (a head block's program id, say), not the sequence's.
        offsets = [int(o) for o in case.offsets]
        b, s = varies[0]
        used = {int(fitted[b, s, h]) - s for h in range(heads) if found[b, s, h]}
        if used <= set(offsets) and used != {offsets[b]}:
            seen = ", ".join(f"{names.head(h)} with offset {int(fitted[b, s, h]) - s}"
                             for h in range(heads) if found[b, s, h])
            return Finding("broadcast", (
                f"The heads of one token were rotated with different sequences' offsets: token {s} of sequence {b} "
                f"(offset {offsets[b]}, so position {int(truth[b, s, 0])}) has {seen}. A token's offset belongs to "
                "its sequence: read OFFSETS at the sequence's index (the grid axis over sequences, e.g. "
                "tl.program_id(2)), not at a head block's or a token block's program id."))
    if varies and "broadcast" in candidates:
        b, s = varies[0]
        seen = ", ".join(f"{names.head(h)} at position {int(fitted[b, s, h])}"
                         for h in range(heads) if found[b, s, h])
        return Finding("broadcast", (
            f"The heads of one token were rotated at different positions: token {s} of sequence {b} (position "
            f"{int(truth[b, s, 0])}) has {seen}. Every head of a token shares the token's position. "
            f"{_BROADCAST_HINTS[program]}{zero_words}"))
    if "wrong_positions" not in candidates:
        return None
    wrong = torch.nonzero(found & (fitted != truth))
    # One example per token (its heads share the token's position, so they would repeat the same words).
    examples = list(dict.fromkeys(f"sequence {int(b)} token {int(s)}: position {int(fitted[b, s, h])} instead of "
                                  f"{int(truth[b, s, h])}" for b, s, h in wrong))
    examples = "; ".join(examples[:3]) + (f"; ... ({len(examples)} tokens in all)" if len(examples) > 3 else "")
    if case.offsets:
        hint = " In decode, token s of sequence b sits at offsets[b] + s: are the offsets added?"
    elif program == "function":
        hint = (" The positions argument holds each token's position, which need not be its index: build the "
                "angles from it, positions[..., None] * inv_freq, not from torch.arange(seq_len).")
    else:
        hint = (" A token's position is its index in its sequence: (row // n_heads) % seq_len for a row of a "
                "contiguous (batch, seq, heads) tensor.")
    return Finding("wrong_positions", (
        f"Tokens were rotated at positions other than their own ({len(wrong)} head vectors; {examples}).{hint}"
        f"{zero_words}"))


def _fit_base(inputs: RopeInputs, y: torch.Tensor, x64: torch.Tensor, scale: float) -> Finding | None:
    """Recover each pair's angle at position 1 from (input, output); if the frequencies follow base' ** (-2i/d) for
    some base' != base and the whole output agrees with base', the base is the mistake."""
    case = inputs.case
    rot, half = case.rot, case.rot // 2
    at_one = inputs.positions == 1
    if not at_one.any() or half < 2:
        return None
    if case.interleaved:
        a, b = x64[..., 0:rot:2], x64[..., 1:rot:2]
        a2, b2 = y[..., 0:rot:2], y[..., 1:rot:2]
    else:
        a, b = x64[..., :half], x64[..., half:rot]
        a2, b2 = y[..., :half], y[..., half:rot]
    angle = torch.atan2(a * b2 - b * a2, a * a2 + b * b2)[at_one]  # (tokens at p=1, heads, half): = inv_freq[i]
    freq_1 = float(angle[..., 1].median())
    if not 0.0 < freq_1 < 1.0:
        return None
    fitted = freq_1 ** (-half)  # inv_freq[1] = base ** (-2/rot)
    if not math.isfinite(fitted) or abs(fitted / case.base - 1.0) < 1e-3:
        return None
    alt = reference.rope(inputs.x.view, inputs.positions, base=fitted, rotary_dim=rot,
                         interleaved=case.interleaved, conjugate=case.conjugate)
    tolerance = 3e-2 if case.dtype in HALF_DTYPES else 1e-3
    if float((y[..., :rot] - alt[..., :rot]).abs().max()) > tolerance * max(scale, 1.0):
        return None
    words = (f"Wrong frequency base: your angles follow inv_freq[i] = base ** (-2i / {rot}) with "
             f"base ≈ {fitted:.5g}, but this case asks for base = {case.base:g}.")
    close = lambda value: abs(fitted / value - 1.0) < 1e-2  # noqa: E731
    if close(10000.0):
        words += " That is the usual default 10000: use the base argument instead of a constant."
    elif rot < case.head_dim and close(case.base ** (rot / case.head_dim)):
        words += (f" That is base ** (rotary_dim / head_dim): the exponent must be divided by rotary_dim = {rot}, "
                  f"not head_dim = {case.head_dim}.")
    elif close(math.sqrt(case.base)):
        words += " That is sqrt(base): the exponent is 2i / rotary_dim, not i / rotary_dim."
    elif close(case.base ** 2):
        words += " That is base ** 2: the exponent is 2i / rotary_dim, with i the pair index (not the channel index)."
    return Finding("wrong_base", words)
