"""A fuzzer of hostile-but-plausible calls to ``ropekit.apply_rope``.

Each case draws, independently for every tensor argument (q, k, cos, sin, positions, cu_seqlens), its dtype, its
view (contiguous, a slice of a wider buffer, permuted, expanded with stride 0, a strided slice) and, for index
tensors, its values (in range, beyond the table, negative, for cu_seqlens also past the token count, decreasing,
huge). In place, q and k may alias (k a view of q's heads; slices of one packed qkv buffer, which do not overlap).
Every tensor lives inside a larger buffer filled with a sentinel (a guard region).

The oracle, for every case:

* a call whose arguments are valid matches the float64 reference (``ropekit.reference``; positions outside the table
  give NaN in the rotated channels, as documented), compared with ``ropekit.testing.check_close_to_reference``;
* a call the documentation says is refused raises ``TypeError``/``ValueError`` (or PyTorch's ``RuntimeError`` for
  overlapping in-place targets), and leaves every input bit for bit unchanged;
* a call with hostile values inside device tensors (cu_seqlens that do not describe the packed tokens) has an
  unspecified result, but
* in every case nothing outside the outputs changes: the guard regions and every tensor the call does not write
  are compared bit for bit afterwards.

``python -m ropekit.reliability.fuzz --cases 300 --seed 0`` prints the counts as JSON; ``run()`` returns them.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field

import torch

from .. import device as _device
from .. import reference as ref
from ..api import apply_rope
from ..frequencies import cos_sin_table, inverse_frequencies
from ..testing import check_close_to_reference

__all__ = ["run", "Case", "main"]

_GUARD = 29  # sentinel elements on each side of every buffer
_SENTINEL = -7777.0
_TO_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEAD_DIMS = (16, 32, 48)  # a bounded set of constexpr values keeps compiles bounded on a GPU


@dataclass
class Case:
    """What a case drew, for its reproducer line."""

    seed: int
    notes: list = field(default_factory=list)

    def note(self, **kw) -> None:
        self.notes.append(", ".join(f"{k}={v}" for k, v in kw.items()))


class _Buffers:
    """Tensors placed inside sentinel-filled buffers, and the check that nothing outside the allowed views moved."""

    def __init__(self, dev: str):
        self.dev = dev
        self.items = []  # [buffer, snapshot, views the call may write]

    def place(self, values: torch.Tensor, form: str, rng: random.Random) -> torch.Tensor:
        """A view with ``values`` in the given form, inside a guarded buffer."""
        shape = tuple(values.shape)
        if form == "wider" and values.ndim >= 1:
            # a slice of a wider last axis (strides of a column slice)
            extra = rng.choice((2, 6))
            big = torch.empty(shape[:-1] + (shape[-1] + extra,), dtype=values.dtype)
            start = rng.randint(0, extra)
            inner_shape = big.shape
            view_fn = lambda b: b[..., start:start + shape[-1]]  # noqa: E731
        elif form == "permuted" and values.ndim >= 2:
            order = list(range(values.ndim))[::-1]
            inner_shape = tuple(shape[i] for i in order)
            view_fn = lambda b: b.permute(*order)  # noqa: E731 (permute is an involution here)
        elif form == "strided" and values.ndim >= 1:
            inner_shape = (shape[0] * 2,) + shape[1:] if shape[0] else shape
            view_fn = lambda b: b[::2] if shape[0] else b  # noqa: E731
        else:
            inner_shape = shape
            view_fn = lambda b: b  # noqa: E731
        numel = 1
        for n in inner_shape:
            numel *= n
        fill = _SENTINEL if values.dtype.is_floating_point else -3
        buffer = torch.full((numel + 2 * _GUARD,), fill, dtype=values.dtype)
        inner = buffer[_GUARD:_GUARD + numel].view(inner_shape)
        view = view_fn(inner)
        view.copy_(values)
        buffer = buffer.to(self.dev)
        view = view_fn(buffer[_GUARD:_GUARD + numel].view(inner_shape))
        self.items.append([buffer, buffer.clone(), []])
        return view

    def writable(self, view: torch.Tensor) -> None:
        """The call may write ``view`` (in place): only its elements may change in its buffer."""
        for item in self.items:
            if item[0].untyped_storage().data_ptr() == view.untyped_storage().data_ptr():
                item[2].append(view)

    def moved_outside(self) -> str | None:
        for buffer, snapshot, views in self.items:
            mask = torch.ones(buffer.shape, dtype=torch.bool, device=buffer.device)
            for view in (v for v in views if v.numel()):
                index = torch.arange(buffer.numel(), device=buffer.device).as_strided(
                    view.shape, view.stride(), view.storage_offset() - buffer.storage_offset())
                mask[index.flatten()] = False
            same = (buffer == snapshot) | (torch.isnan(buffer) & torch.isnan(snapshot))
            if not bool(same[mask].all()):
                return f"memory outside the outputs changed ({int((~same[mask]).sum())} elements)"
        return None

    def inputs_unchanged(self) -> bool:
        return all(bool(((b == s) | (torch.isnan(b) & torch.isnan(s))).all()) for b, s, _ in self.items)


def _table_forms(rng):
    return rng.choice(("contiguous", "contiguous", "wider", "strided")), rng.choice(("contiguous", "wider", "strided"))


def _draw(rng: random.Random, dev: str, case: Case):
    """One call: (args, kwargs, expectation, buffers, what the reference needs)."""
    bufs = _Buffers(dev)
    dtype = rng.choice(_DTYPES)
    layout = rng.choice(("bshd", "sbhd", "bhsd", "thd", "thd"))
    head_dim = rng.choice(_HEAD_DIMS)
    rotary_dim = rng.choice((head_dim, head_dim, head_dim // 2))
    interleaved = rng.random() < 0.4
    inplace = rng.random() < 0.4
    per_token = layout != "thd" and rng.random() < 0.15
    hq, hk = rng.randint(0, 4), rng.randint(0, 3)
    with_k = rng.random() < 0.85
    batch, seq = rng.randint(0, 3), rng.randint(0, 6)
    rows = rng.choice((1, 8, 64))
    expect = "ok"

    # tokens and their positions (as the reference sees them)
    if layout == "thd":
        lengths = [rng.randint(0, 5) for _ in range(rng.randint(1, 4))]
        tokens = sum(lengths)
        cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))])
        max_seqlen = max(lengths)
        token_shape = (tokens,)
    else:
        token_shape = (batch, seq)
    pos_kind = rng.choice(("none", "int", "offsets", "ids"))
    if per_token:
        pos_kind = "none"
    hostile_values = rng.random() < 0.25
    if pos_kind == "none":
        positions_arg, offsets = None, 0
    elif pos_kind == "int":
        positions_arg = rng.choice((0, 3, rows - 1, -2)) if hostile_values else rng.randint(0, 3)
        offsets = positions_arg
    if layout == "thd":
        n_seqs = len(lengths)
        if pos_kind == "offsets":
            values = torch.randint(0, 3, (n_seqs,))
            if hostile_values:
                values[rng.randrange(n_seqs)] = rng.choice((-1, 10**6))
            ref_pos = ref.varlen_positions(cu, offsets=values)
            shape_arg = (n_seqs, 1) if n_seqs == tokens and tokens > 1 else (n_seqs,)
        elif pos_kind == "ids":
            values = torch.randint(0, rows, (tokens,))
            if hostile_values and tokens:
                values[rng.randrange(tokens)] = rng.choice((-5, 10**6))
            ref_pos = values
            shape_arg = (1, tokens) if n_seqs == tokens and tokens > 1 else (tokens,)
        else:
            ref_pos = ref.varlen_positions(cu, offsets=offsets)
    else:
        if pos_kind == "offsets":
            values = torch.randint(0, 3, (batch,))
            if hostile_values and batch:
                values[rng.randrange(batch)] = rng.choice((-1, 10**6))
            ref_pos = ref.token_positions(batch, seq, offsets=values)
            shape_arg = (batch, 1)
        elif pos_kind == "ids":
            values = torch.randint(0, rows, (batch, seq))
            if hostile_values and batch * seq:
                values[rng.randrange(batch), rng.randrange(seq)] = rng.choice((-5, 10**6))
            ref_pos = values
            shape_arg = (batch, seq)
        else:
            ref_pos = ref.token_positions(batch, seq, offsets=offsets)
    if pos_kind in ("offsets", "ids"):
        pos_dtype = rng.choice((torch.int32, torch.int64))
        positions_arg = bufs.place(values.reshape(shape_arg).to(pos_dtype), rng.choice(("contiguous", "strided",
                                                                                       "wider")), rng)
    case.note(dtype=dtype, layout=layout, head_dim=head_dim, rotary_dim=rotary_dim, interleaved=interleaved,
              inplace=inplace, per_token=per_token, hq=hq, hk=hk if with_k else None, token_shape=token_shape,
              rows=rows, positions=pos_kind, hostile_values=hostile_values)
    span = max_seqlen if layout == "thd" else seq
    if pos_kind in ("none", "int") and not per_token and (offsets < 0 or (offsets + span > rows and span > 0)):
        expect = "error"  # host-known positions are checked against the table

    # q and k
    def tensor(heads):
        if layout == "thd":
            shape_bshd = (tokens, heads, head_dim)
        else:
            shape_bshd = (batch, seq, heads, head_dim)
        x = torch.randn(shape_bshd, dtype=torch.float64).to(dtype)
        return x

    q_bshd = tensor(hq)
    k_bshd = tensor(hk) if with_k else None
    to_layout = (lambda x: x) if layout == "thd" else (lambda x: x.permute(_TO_BSHD[layout]))
    aliasing = rng.random() < 0.2 and with_k and inplace
    if aliasing and rng.random() < 0.5 and hq >= 2 and layout != "thd":
        q = bufs.place(to_layout(q_bshd).contiguous(), "contiguous", rng)
        k = q.narrow(1 if layout == "bhsd" else 2, 0, max(min(hk, hq), 1))  # k: a view of q's first heads
        k_bshd = k.permute(_TO_BSHD[layout]).cpu().clone()
        if expect == "ok" and k.numel() and q.numel():
            expect = "overlap"
        case.note(alias="k is a view of q's heads")
    elif aliasing and layout == "thd":
        packed = torch.cat((q_bshd.reshape(tokens, hq * head_dim), k_bshd.reshape(tokens, hk * head_dim),
                            torch.randn(tokens, hk * head_dim).to(dtype)), dim=1)
        qkv = bufs.place(packed, "contiguous", rng)
        q = qkv[:, :hq * head_dim].view(tokens, hq, head_dim)
        k = qkv[:, hq * head_dim:(hq + hk) * head_dim].view(tokens, hk, head_dim)
        case.note(alias="slices of one packed qkv")
    else:
        q = bufs.place(to_layout(q_bshd), rng.choice(("contiguous", "wider", "contiguous")), rng)
        k = bufs.place(to_layout(k_bshd), rng.choice(("contiguous", "wider")), rng) if with_k else None

    # tables
    if per_token:
        ids = torch.randint(0, 64, (batch, seq))
        theta = ref.angles(ids, inverse_frequencies(rotary_dim, 10000.0))
        cos_rows = torch.cat((theta.cos(), theta.cos()), -1).to(torch.float32)
        sin_rows = torch.cat((theta.sin(), theta.sin()), -1).to(torch.float32)
        cos_form, sin_form = _table_forms(rng)
        cos = bufs.place(cos_rows, cos_form, rng)
        sin = bufs.place(sin_rows, sin_form, rng)
        ref_cos, ref_sin = cos_rows, sin_rows
        if rotary_dim != head_dim and rng.random() < 0.3:
            expect = "error"  # rotary_dim narrower than the rows
            kwargs_rotary = rotary_dim // 2
        else:
            kwargs_rotary = None
    else:
        cos_t, sin_t = cos_sin_table(rows, rotary_dim)
        cos_form, sin_form = _table_forms(rng)
        cos, sin = bufs.place(cos_t, cos_form, rng), bufs.place(sin_t, sin_form, rng)
        kwargs_rotary = rotary_dim if rotary_dim != head_dim or rng.random() < 0.5 else None
    case.note(cos=cos_form, sin=sin_form)

    kwargs = dict(positions=positions_arg, layout=layout, interleaved=interleaved, inplace=inplace,
                  per_token=per_token)
    if kwargs_rotary is not None:
        kwargs["rotary_dim"] = kwargs_rotary
    contained_only = False
    if layout == "thd":
        cu_values = cu.clone()
        if rng.random() < 0.2 and len(cu_values) > 1:
            which = rng.choice(("past-end", "negative", "decreasing", "huge"))
            if which == "past-end":
                cu_values[-1] += rng.randint(1, 50)
            elif which == "negative":
                cu_values[0] = -rng.randint(1, 9)
            elif which == "decreasing" and len(cu_values) > 2:
                cu_values[1] = cu_values[-1] + 3
            else:
                cu_values[-1] = 2**40
            contained_only = True
            case.note(cu_seqlens=which)
        fits_int32 = not cu_values.numel() or bool(cu_values.abs().max() < 2**31)
        cu_dtype = rng.choice((torch.int32, torch.int64)) if fits_int32 else torch.int64
        kwargs["cu_seqlens"] = bufs.place(cu_values.to(cu_dtype), rng.choice(("contiguous", "strided", "wider")), rng)
        kwargs["max_seqlen"] = max_seqlen
    if inplace:
        for t in (q, k):
            if t is not None:
                bufs.writable(t)
    return (q, k, cos, sin), kwargs, expect, contained_only, bufs, (q_bshd, k_bshd, ref_pos, per_token, ref_cos
                                                                    if per_token else None,
                                                                    ref_sin if per_token else None, rows)


def _expected(x_bshd, layout, ref_pos, rotary_dim, interleaved, per_token, ref_cos, ref_sin, rows):
    """The float64 reference in the call's layout; tokens whose position is outside the table get NaN."""
    if x_bshd is None:
        return None
    if per_token:
        rotated = ref.rope_from_cos_sin(x_bshd, ref_cos[..., None, :], ref_sin[..., None, :], interleaved=interleaved)
    else:
        batch_shape = ref_pos.shape
        pos = ref_pos.reshape(batch_shape)
        valid = (pos >= 0) & (pos < rows)
        x = x_bshd if layout != "thd" else x_bshd[None]
        p = torch.where(valid, pos, 0) if layout != "thd" else torch.where(valid, pos, 0)[None]
        rotated = ref.rope(x, p, rotary_dim=rotary_dim, interleaved=interleaved)
        v = valid if layout != "thd" else valid[None]
        rotated[..., :rotary_dim] = torch.where(v[..., None, None], rotated[..., :rotary_dim],
                                                torch.tensor(float("nan"), dtype=torch.float64))
        if layout == "thd":
            rotated = rotated[0]
    return rotated if layout == "thd" else rotated.permute(_TO_BSHD[layout])


def _one(seed: int, dev: str) -> tuple[str, str | None]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    case = Case(seed)
    (q, k, cos, sin), kwargs, expect, contained_only, bufs, refs = _draw(rng, dev, case)
    q_bshd, k_bshd, ref_pos, per_token, ref_cos, ref_sin, rows = refs
    rotary_dim = kwargs.get("rotary_dim") or (cos.shape[-1] if per_token else 2 * cos.shape[-1])
    try:
        out_q, out_k = apply_rope(q, k, cos, sin, **kwargs)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        if not bufs.inputs_unchanged():
            return "violation", f"seed {seed}: raised {type(error).__name__} but changed its inputs; {case.notes}"
        if expect == "ok" and not contained_only:
            return "violation", f"seed {seed}: a valid call raised {type(error).__name__}: {error}; {case.notes}"
        if expect == "overlap" and not (isinstance(error, RuntimeError) and "memory location" in str(error)):
            return "violation", f"seed {seed}: overlap refused with {error!r}; {case.notes}"
        return "documented_error", None
    if not _device.INTERPRET:
        torch.cuda.synchronize()
    moved = bufs.moved_outside()
    if moved:
        return "violation", f"seed {seed}: {moved}; {case.notes}"
    if expect != "ok":
        return "violation", f"seed {seed}: expected {expect} but the call succeeded; {case.notes}"
    if contained_only:
        return "contained", None
    layout, interleaved = kwargs["layout"], kwargs["interleaved"]
    for name, out, x in (("q", out_q, q_bshd), ("k", out_k, k_bshd)):
        want = _expected(x, layout, ref_pos, rotary_dim, interleaved, per_token, ref_cos, ref_sin, rows)
        if want is None:
            continue
        message = check_close_to_reference(out, want, x.dtype)
        if message is not None:
            return "violation", f"seed {seed}: {name} {message}; {case.notes}"
    return "matched_reference", None


def run(cases: int = 300, seed: int = 0, device: str | None = None, progress=None) -> dict:
    """Run ``cases`` seeded cases; return the counts and every violation's reproducer line."""
    dev = device or _device.DEVICE
    counts = {"cases": 0, "matched_reference": 0, "documented_error": 0, "contained": 0, "violation": 0}
    violations = []
    start = time.perf_counter()
    for i in range(cases):
        outcome, detail = _one(seed * 1_000_003 + i, dev)
        counts["cases"] += 1
        counts[outcome] += 1
        if detail:
            violations.append(detail)
        if progress is not None:
            progress(i + 1, cases)
    counts["seconds"] = round(time.perf_counter() - start, 1)
    counts["device"] = dev
    counts["seed"] = seed
    counts["violations"] = violations
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropekit.reliability.fuzz", description=__doc__.split("\n\n")[0],
        epilog="example: python -m ropekit.reliability.fuzz --cases 300 --seed 0 --out fuzz.json")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    counts = run(args.cases, args.seed)
    text = json.dumps(counts, indent=1, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if counts["violation"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
