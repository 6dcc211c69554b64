"""The fuzzer's ``apply_rope`` target (and the case every rotary op shares): the call, its float64 reference, the
checks of its outputs, gradients and untouched rows, and the same call on meta tensors."""

from __future__ import annotations

import random
from typing import Callable

import torch

from ropekit.api import apply_rope
from ropekit.testing import check_close_to_reference

from .fuzz import EITHER, MATCH, Case, same_bits
from .rope_args import RopeArgs, from_tokens, to_tokens, draw_rope_args

__all__ = ["rope_case", "draw", "draw_cuda"]


def _rows_past_max(name, out, want, before, past, inplace) -> list[str]:
    """In place, each packed row past max_seqlen is either left as it was or rotated right (docs/api.md)."""
    if not inplace:
        return []
    for row in torch.nonzero(past).reshape(-1).tolist():
        if not same_bits(out[row], before[row]) and check_close_to_reference(out[row], want[row]) is not None:
            return [f"{name}: in place, packed row {row} (past max_seqlen) is neither left nor rotated right"]
    return []


def rope_case(target: str, args: RopeArgs, op: Callable, gen: torch.Generator, *,
              transform: Callable | None = None, after: Callable | None = None, extra=(),
              meta: bool = False) -> Case:
    """The case of a rotary op ``op(q, k, cos, sin, *extra, **kwargs) -> (q_out, k_out)``: its reference rotates
    ``transform(x, name)`` (float64, tokens' layout; identity by default, e.g. an RMSNorm for QK-norm), then applies
    ``after(y, name)`` to the rotated values (identity by default; a norm after the rotation)."""
    q, k, cos, sin, kwargs, layout = args.q, args.k, args.cos, args.sin, args.kwargs, args.kwargs["layout"]
    rotary_dim, inplace, grad, rotate_ref = args.spec["rotary_dim"], kwargs["inplace"], args.grad, args.rotate_ref
    if meta:
        return _on_meta(target, args, op, extra)
    grads = {}

    def call():
        if not grad:
            return op(q, k, cos, sin, *extra, **kwargs)
        q_leaf = q.detach().requires_grad_()
        k_leaf = None if k is None else k.detach().requires_grad_()
        out_q, out_k = op(q_leaf, k_leaf, cos, sin, *extra, **kwargs)
        weights = [torch.rand(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype)
                   for o in (out_q, out_k) if o is not None]
        loss = sum((o * w).sum() for o, w in zip((out_q, out_k), weights))
        loss.backward()
        grads.update(q=(q_leaf.grad, weights[0]), k=(None if k is None else (k_leaf.grad, weights[1])))
        return out_q, out_k

    def check(result) -> list[str]:
        problems = []
        out_q, out_k = result
        for name, out, x in (("q", out_q, q), ("k", out_k, k)):
            if x is None:
                if out is not None:
                    problems.append(f"returned a {name} output for an absent {name}")
                continue
            if out is None or out.shape != x.shape or out.dtype != x.dtype:
                problems.append(f"{name} output {None if out is None else (tuple(out.shape), out.dtype)} "
                                f"is not shaped like {name}")
                continue
            if inplace and out is not x:
                problems.append(f"in place, the {name} output is not {name} itself")
            if not inplace and any(out.untyped_storage().data_ptr() == b.base.untyped_storage().data_ptr()
                                   for b in args.arena.buffers):
                problems.append(f"out of place, the {name} output shares memory with an input")
            if rotate_ref is None:
                rows = args.untouched
                if inplace and rows is not None and not same_bits(out.detach().cpu()[rows], args.logical[name][rows]):
                    problems.append(f"{name}: in place, a packed row no sequence covers was written")
                continue
            x64 = to_tokens(args.logical[name], layout).requires_grad_(grad)
            reference = args.rotate_ref_k if name == "k" and args.rotate_ref_k is not None else rotate_ref
            want = reference(x64 if transform is None else transform(x64, name), args.logical["cos"],
                             args.logical["sin"])
            want = want if after is None else after(want, name)
            expected, got_rows, past = from_tokens(want.detach(), layout), out, args.past_max
            if past is not None and past.any():
                problems += _rows_past_max(name, out.detach().cpu(), expected, args.logical[name], past, inplace)
                expected, got_rows = expected[~past], out.detach().cpu()[~past]
            message = check_close_to_reference(got_rows, expected)
            if message is not None:
                problems.append(f"{name}: {message}")
            kept = slice(None) if past is None else ~past  # (rows past max_seqlen: unspecified out of place)
            if transform is None and after is None and not same_bits(out.detach().cpu()[kept][..., rotary_dim:],
                                                   args.logical[name][kept][..., rotary_dim:]):
                problems.append(f"{name}: the channels past rotary_dim are not passed through bit for bit")
            if grad and grads.get(name) is not None and (past is None or not past.any()):
                got, weight = grads[name]
                want.backward(to_tokens(weight, layout))  # the reference's own vector-Jacobian product
                message = None if got is None else check_close_to_reference(got, from_tokens(x64.grad, layout))
                if got is None or message is not None:
                    problems.append(f"grad of {name}: {message or 'missing'}")
        return problems

    return Case(target, args.spec, args.arena, call, check, expect=args.expectation(),
                why_raise="; ".join(args.why_raise), overlap=args.overlap,
                inplace_targets=[t for t in (q, k) if inplace and t is not None and t.numel()],
                env={"ROPEKIT_CHECK": "1" if args.spec["check_mode"] else "0"})


def draw(rng: random.Random, gen: torch.Generator, device, backend: str = "triton") -> Case:
    """One ``apply_rope`` case on ``backend`` (the CUDA backend on a GPU machine: ``draw_cuda``)."""
    args = draw_rope_args(rng, gen, device, backend=backend, switches=True, angles=True)
    meta = not args.spec["check_mode"] and not args.overlap and not args.grad and rng.random() < 0.04
    return rope_case("apply_rope", args, apply_rope, gen, meta=meta)


def draw_cuda(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``draw`` on the CUDA backend, whose documented contract leaves packed varlen batches out: a valid ``thd`` call
    may raise its NotImplementedError (docs/api.md), and is checked like any other when it runs."""
    case = draw(rng, gen, device, backend="cuda")
    if case.spec.get("layout") == "thd" and case.expect == MATCH:
        case.expect = EITHER
    return case


def _meta_like(t):
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _on_meta(target: str, args: RopeArgs, op: Callable, extra) -> Case:
    """The same call on meta tensors (shape inference, no data): the outputs' shapes and dtypes, nothing read."""
    q, k, cos, sin = (_meta_like(t) for t in (args.q, args.k, args.cos, args.sin))
    extra = tuple(_meta_like(t) for t in extra)
    kwargs = {name: _meta_like(value) for name, value in args.kwargs.items()}
    args.spec.update(meta=True)
    expect = args.expectation()
    if expect == MATCH and kwargs["layout"] == "thd" and kwargs["max_seqlen"] is None:
        expect = EITHER  # max_seqlen comes from cu_seqlens' values, which a meta tensor has not got

    def check(result) -> list[str]:
        problems = []
        for name, out, x in (("q", result[0], q), ("k", result[1], k)):
            if x is None:
                continue
            if out is None or out.device.type != "meta" or out.shape != x.shape or out.dtype != x.dtype:
                problems.append(f"meta: the {name} output is {None if out is None else (out.device, out.shape)}")
            elif kwargs["inplace"] and out is not x:
                problems.append(f"meta: in place, the {name} output is not {name} itself")
            elif not kwargs["inplace"] and not out.is_contiguous():
                problems.append(f"meta: the {name} output has strides {out.stride()}, not contiguous ones")
        return problems

    return Case(target, args.spec, args.arena, lambda: op(q, k, cos, sin, *extra, **kwargs), check, expect=expect,
                why_raise="; ".join(args.why_raise), env={"ROPEKIT_CHECK": "0"})
