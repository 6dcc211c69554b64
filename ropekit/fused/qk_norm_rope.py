"""``qk_norm_rope``: RMSNorm of q and k (per head, or across all heads of each), then RoPE, in one launch, with its
fused backward.

Data flows as in ``apply_rope``: the call -> validation (apply_rope's for the rotary arguments, ``validate`` for the
weights) -> one launch of ``ropekit.triton.fused`` (or, on the native backend, :func:`ropekit.native.fused`). Four
ways in, one kernel:

* eager inference (no grad, not compiling): a plan (:mod:`ropekit.fused.plan`), made once per call signature after
  validation, then launched directly;
* autograd and ``torch.compile``: the functional custom op ``ropekit::qk_norm_rope`` (fake impl for tracing) whose
  registered backward is ``ropekit::qk_norm_rope_backward``, the fused backward kernel;
* ``inplace=True``: the mutating op ``ropekit::qk_norm_rope_`` when compiling, the launch otherwise (no autograd).

Semantics (docs/fused.md): ``y = rope(N(x))`` (``norm="before"``) or ``y = N(rope(x))`` (``"after"``) with
``N(x) = x * rsqrt(mean(x^2) + eps) * (weight_offset + w)`` (1 for w without weights) per head vector of head_dim
channels, the mean over all head_dim channels (also with partial rotary), or (``norm_over="heads"``) per token over
all heads x head_dim channels of q (of k) together, float32 math (float64 for float64 inputs) and one rounding at the
end.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple, Optional

import torch

from .. import device as _device
from .. import native
from ..layouts import to_bshd
from ..outputs import bump_versions, new_output
from ..positions import PositionSpec
from ..triton.fused import launch_fused, plan_fused
from ..triton.launch import released
from . import validate
from .plan import FusedPlan, keyed, planned, plans, reads_callers_memory, with_outputs

__all__ = ["qk_norm_rope", "fused_launch", "angle_flags", "NormLaunch", "position_fields", "schema_names"]


class NormLaunch(NamedTuple):
    """A validated ``qk_norm_rope`` call's launch arguments after q and k (and, for the backward, after the incoming
    gradients and q and k), by name: what :func:`_kernel_arguments` and the ``ropekit::qk_norm_rope`` custom ops take,
    in this order (a custom op's schema is positional: the module checks them against these fields when it is
    imported). The front door builds it by keyword; autograd saves its tensors and keeps the rest as they are."""

    q_weight: Optional[torch.Tensor]
    k_weight: Optional[torch.Tensor]
    cos: Optional[torch.Tensor]
    sin: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]  # the position spec's tensor, mode, sequence starts, offset and longest sequence
    pos_mode: int
    cu_seqlens: Optional[torch.Tensor]
    position_offset: int
    max_seqlen: int
    rotary_dim: int
    layout: str
    interleaved: bool
    per_token: bool
    eps: float
    weight_offset: float
    norm: int
    norm_over_heads: bool
    inv_freq: Optional[torch.Tensor]
    angle_scale: float


# where the fields autograd saves as tensors sit in a NormLaunch (it keeps the rest as they are)
_SAVED_AT = tuple(NormLaunch._fields.index(name) for name in ("q_weight", "k_weight", "cos", "sin", "positions",
                                                              "cu_seqlens", "inv_freq"))


def position_fields(spec: PositionSpec) -> dict:
    """A validated :class:`~ropekit.positions.PositionSpec` as the launches name its fields."""
    return dict(positions=spec.tensor, pos_mode=spec.mode, cu_seqlens=spec.cu_seqlens, position_offset=spec.offset,
                max_seqlen=spec.max_seqlen or 0)


def schema_names(op: str) -> tuple:
    """The parameter names of the custom op ``op`` (``"namespace::name"``), in its schema's order."""
    namespace, name = op.split("::")
    return tuple(a.name for a in getattr(getattr(torch.ops, namespace), name).default._schema.arguments)


def fused_launch(arguments: dict):
    """The last step of every fused op: the fused Triton kernel's launcher, or on the native backend for the call's
    q (``ropekit.device.backend_for``) :func:`ropekit.native.fused`, which takes the same arguments."""
    launch = native.fused if _device.backend_for(arguments["q"]) == "native" else launch_fused
    return launch(**arguments)


def angle_flags(scale, mrope_section, mrope_interleaved, nope_temperature=None) -> tuple | None:
    """What a plan key adds for the angles' host arguments: nothing at their defaults, exactly (the float 1.0, None,
    False, no NoPE layer: the common call's key is no longer for them), else ``(scale, mrope_section,
    mrope_interleaved, nope_temperature)`` with a list of sections and the NoPE pair as tuples, the pair's values
    beside their types (the key holds each flag's type beside it, not a tuple's items'); None where the sections are
    not a list or tuple of ints or ``nope_temperature`` is no pair (``(2.0, 3, 3)`` equals ``(2, 3, 3)`` as a key:
    validation says what is wrong, and such a call is not planned)."""
    if mrope_section is None and mrope_interleaved is False and type(scale) is float and scale == 1.0 and \
            nope_temperature is None:
        return ()
    if mrope_section is not None:
        if type(mrope_section) not in (list, tuple) or any(type(n) is not int for n in mrope_section):
            return None
        mrope_section = tuple(mrope_section)
    if nope_temperature is not None:
        if type(nope_temperature) not in (list, tuple) or len(nope_temperature) != 2:
            return None
        nope_temperature = tuple(nope_temperature), tuple(map(type, nope_temperature))
    return scale, mrope_section, mrope_interleaved, nope_temperature


def _spec(positions, pos_mode, cu_seqlens, position_offset, max_seqlen, layout) -> PositionSpec:
    return PositionSpec(pos_mode, position_offset, positions, cu_seqlens, max_seqlen if layout == "thd" else None)


def _kernel_arguments(q, k, q_weight, k_weight, cos, sin, positions, pos_mode, cu_seqlens, position_offset,
                      max_seqlen, rotary_dim, layout, interleaved, per_token, eps, weight_offset, norm,
                      norm_over_heads, inv_freq, angle_scale, out_q, out_k, grad_q=None, grad_k=None) -> dict:
    """A validated call as the fused launcher takes it: the kernels' ``(batch, seq, heads, dim)`` views (with
    ``inv_freq`` the angles without a table, cos and sin None)."""
    return dict(q=to_bshd(q, layout), k=to_bshd(k, layout), cos=cos, sin=sin,
                positions=_spec(positions, pos_mode, cu_seqlens, position_offset, max_seqlen, layout),
                rotary_dim=rotary_dim, interleaved=interleaved, cos_per_token=per_token, out_q=to_bshd(out_q, layout),
                out_k=to_bshd(out_k, layout), q_weight=q_weight, k_weight=k_weight, eps=eps,
                weight_offset=weight_offset, norm=norm, norm_over_heads=norm_over_heads,
                grad_q=to_bshd(grad_q, layout), grad_k=to_bshd(grad_k, layout), inv_freq=inv_freq,
                angle_scale=angle_scale)


def _launch(*args):
    return fused_launch(_kernel_arguments(*args))


def _forward_new(q, k, *args):
    out_q, out_k = new_output(q), (None if k is None else new_output(k))
    _launch(q, k, *args, out_q, out_k)
    return out_q, out_k


_FORWARD_OP, _BACKWARD_OP = "ropekit::qk_norm_rope", "ropekit::qk_norm_rope_backward"
_INPLACE_OP = "ropekit::qk_norm_rope_"


@torch.library.custom_op(_FORWARD_OP, mutates_args=())
def _norm_rope_op(q: torch.Tensor, k: Optional[torch.Tensor], q_weight: Optional[torch.Tensor],
                  k_weight: Optional[torch.Tensor], cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
                  positions: Optional[torch.Tensor], pos_mode: int, cu_seqlens: Optional[torch.Tensor],
                  position_offset: int, max_seqlen: int, rotary_dim: int, layout: str, interleaved: bool,
                  per_token: bool, eps: float, weight_offset: float, norm: int, norm_over_heads: bool,
                  inv_freq: Optional[torch.Tensor], angle_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out_q, out_k = _forward_new(q, k, q_weight, k_weight, cos, sin, positions, pos_mode, cu_seqlens,
                                position_offset, max_seqlen, rotary_dim, layout, interleaved, per_token, eps,
                                weight_offset, norm, norm_over_heads, inv_freq, angle_scale)
    return out_q, (out_k if out_k is not None else q.new_empty(0))  # a custom op returns tensors only


@_norm_rope_op.register_fake
def _norm_rope_fake(q, k, *args):
    return new_output(q), (new_output(k) if k is not None else q.new_empty(0))


@torch.library.custom_op(_BACKWARD_OP, mutates_args=())
def _norm_rope_backward_op(grad_q: torch.Tensor, grad_k: Optional[torch.Tensor], q: torch.Tensor,
                           k: Optional[torch.Tensor], q_weight: Optional[torch.Tensor],
                           k_weight: Optional[torch.Tensor], cos: Optional[torch.Tensor],
                           sin: Optional[torch.Tensor], positions: Optional[torch.Tensor], pos_mode: int,
                           cu_seqlens: Optional[torch.Tensor], position_offset: int, max_seqlen: int,
                           rotary_dim: int, layout: str, interleaved: bool, per_token: bool, eps: float,
                           weight_offset: float, norm: int, norm_over_heads: bool, inv_freq: Optional[torch.Tensor],
                           angle_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk = new_output(q), (None if k is None else new_output(k))
    dw_q, dw_k = _launch(q, k, q_weight, k_weight, cos, sin, positions, pos_mode, cu_seqlens, position_offset,
                         max_seqlen, rotary_dim, layout, interleaved, per_token, eps, weight_offset, norm,
                         norm_over_heads, inv_freq, angle_scale, dq, dk, grad_q, grad_k)
    # a custom op's outputs may not alias each other: the weight gradients are copies (the kernel may leave both in
    # one buffer), and an absent one (no k, or a weightless norm) is its own empty tensor
    return (dq, dk if dk is not None else q.new_empty(0),
            dw_q.to(q_weight.dtype, copy=True) if q_weight is not None else q.new_empty(0),
            dw_k.to(k_weight.dtype, copy=True) if k_weight is not None else q.new_empty(0))


@_norm_rope_backward_op.register_fake
def _norm_rope_backward_fake(grad_q, grad_k, q, k, q_weight, k_weight, *args):
    return (new_output(q), new_output(k) if k is not None else q.new_empty(0),
            torch.empty_like(q_weight) if q_weight is not None else q.new_empty(0),
            torch.empty_like(k_weight) if k_weight is not None else q.new_empty(0))


def _setup_context(ctx, inputs, output) -> None:
    call = list(inputs[2:])  # a NormLaunch's fields
    ctx.save_for_backward(*inputs[:2], *[call[i] for i in _SAVED_AT])
    for i in _SAVED_AT:
        call[i] = None
    ctx.call = call


def _backward(ctx, grad_q, grad_k):
    q, k, *saved = ctx.saved_tensors
    call = list(ctx.call)
    for i, tensor in zip(_SAVED_AT, saved):
        call[i] = tensor
    call = NormLaunch._make(call)
    if grad_q is None:
        grad_q = torch.zeros_like(q)
    if k is not None and (grad_k is None or grad_k.shape != k.shape):
        grad_k = torch.zeros_like(k)
    dq, dk, dw_q, dw_k = _norm_rope_backward_op(grad_q, grad_k if k is not None else None, q, k, *call)
    has_k = k is not None
    # q_weight's and k_weight's gradients, then None for the launch's other fields
    return (dq, dk if has_k else None, dw_q if call.q_weight is not None else None,
            dw_k if call.k_weight is not None else None) + (None,) * (len(NormLaunch._fields) - 2)


_norm_rope_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op(_INPLACE_OP, mutates_args=("q", "k"))
def _norm_rope_inplace_op(q: torch.Tensor, k: Optional[torch.Tensor], q_weight: Optional[torch.Tensor],
                          k_weight: Optional[torch.Tensor], cos: Optional[torch.Tensor],
                          sin: Optional[torch.Tensor], positions: Optional[torch.Tensor], pos_mode: int,
                          cu_seqlens: Optional[torch.Tensor], position_offset: int, max_seqlen: int, rotary_dim: int,
                          layout: str, interleaved: bool, per_token: bool, eps: float, weight_offset: float,
                          norm: int, norm_over_heads: bool, inv_freq: Optional[torch.Tensor],
                          angle_scale: float) -> None:
    _launch(q, k, q_weight, k_weight, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen,
            rotary_dim, layout, interleaved, per_token, eps, weight_offset, norm, norm_over_heads, inv_freq,
            angle_scale, q, k)


@_norm_rope_inplace_op.register_fake
def _norm_rope_inplace_fake(*args):
    return None


# the launcher and the custom ops take the launch's fields in NormLaunch's order, after q and k (the backward: after
# the incoming gradients and q and k)
for _parameters, _first in ((tuple(inspect.signature(_kernel_arguments).parameters), 2),
                            (schema_names(_FORWARD_OP), 2), (schema_names(_INPLACE_OP), 2),
                            (schema_names(_BACKWARD_OP), 4)):
    assert _parameters[_first:_first + len(NormLaunch._fields)] == NormLaunch._fields, _parameters


def qk_norm_rope(q: torch.Tensor, k: Optional[torch.Tensor] = None, cos: Optional[torch.Tensor] = None,
                 sin: Optional[torch.Tensor] = None, q_weight: Optional[torch.Tensor] = None,
                 k_weight: Optional[torch.Tensor] = None, *, eps: float = 1e-6, weight_offset: float = 0.0,
                 norm: str = "before", norm_over: str = "head", table=None, positions=None, layout: str = "bshd",
                 interleaved: bool = False, rotary_dim: Optional[int] = None, inplace: bool = False,
                 cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                 per_token: bool = False, inv_freq: Optional[torch.Tensor] = None, scale: float = 1.0,
                 mrope_section=None, mrope_interleaved: bool = False):
    """RMSNorm of q and k and RoPE in one launch: the norm before the rotation (Qwen3 / Gemma 3 QK-norm) or after
    it (``norm="after"``: Llama 4's weightless norm of the rotated q and k), over each head vector or across all
    heads of q and of k (``norm_over="heads"``: OLMo-2's QK-norm).

    Returns ``(q_out, k_out)`` (``k_out`` None when k is None).

    Args:
        q, k: as :func:`ropekit.apply_rope`; they may be strided slices of a packed qkv projection.
        cos, sin, table, positions, layout, interleaved, rotary_dim, inplace, cu_seqlens, max_seqlen, per_token: as
            :func:`ropekit.apply_rope`.
        inv_freq, scale, mrope_section, mrope_interleaved: as :func:`ropekit.apply_rope`: the angles computed in
            the kernel from the inverse frequencies (no table), and M-RoPE's sections, each pair at its own axis'
            position.
        q_weight, k_weight: the norms' weights (k_weight exactly when k is given): ``(head_dim,)``, or with
            ``norm_over="heads"`` ``(q_heads * head_dim,)`` and ``(k_heads * head_dim,)`` (head h's channels at
            ``h * head_dim``, as the projection's output is laid out); or both None: a norm without weights,
            ``x * rsqrt(mean(x^2) + eps)``.
        eps: added to the mean square, in float32: a normal float32 number (>= 1.1754944e-38), a Python or numpy
            scalar.
        weight_offset: the weight's offset: 0.0 (``x_hat * w``, Qwen3) or 1.0 (Gemma's ``x_hat * (1 + w)``).
        norm: ``"before"`` the rotation, ``y = rope(N(x))``, or ``"after"`` it, ``y = N(rope(x))`` (Llama 4's
            ``Llama4TextL2Norm``, with no weights and its ``eps`` the model's ``rms_norm_eps``).
        norm_over: the norm's extent: ``"head"``, each head vector's head_dim channels (Qwen3, Gemma 3, Llama 4), or
            ``"heads"``, each token's whole q (and k) projection, all heads x head_dim channels together, one mean
            square a token (OLMo-2's ``q_norm = RMSNorm(num_heads * head_dim)`` and ``k_norm``, applied before the
            projection is split into heads; the video diffusion transformers' QK-norm over the projection's whole
            width, e.g. Wan's).

    Autograd (out of place), either placement: gradients for q, k, q_weight and k_weight from one fused backward
    launch.
    Raises ``TypeError``/``ValueError`` naming the argument, before anything is written.
    """
    user = (q, k, q_weight, k_weight, cos, sin, positions, cu_seqlens, inv_freq)
    key = at = None
    angles = angle_flags(scale, mrope_section, mrope_interleaved)
    if table is None and (positions is None or isinstance(positions, torch.Tensor)) and \
            (layout != "thd" or max_seqlen is not None) and angles is not None and planned(user):
        # (as rope_and_cache: calls whose validation reads more than the signature are not planned)
        key, at = keyed("qk_norm_rope", user, (eps, weight_offset, norm, norm_over, layout, interleaved, rotary_dim,
                                               inplace, max_seqlen, per_token) + angles)
        plan = plans.find(key)
        if plan is not None:
            return _run_plan(plan, user, inplace, at=at)
    user_tables = (cos, sin)
    cos, sin, spec, rotary_dim = validate.rotary_arguments(q, k, cos, sin, table, positions, layout, rotary_dim,
                                                           cu_seqlens, max_seqlen, per_token, interleaved, inv_freq,
                                                           scale, mrope_section, mrope_interleaved)
    place = validate.check_norm_place(norm)
    over_heads = validate.check_norm_over(norm_over)
    eps, weight_offset = validate.check_norm(q, k, q_weight, k_weight, eps, weight_offset, weightless=True,
                                             over_heads=over_heads, layout=layout)
    args = NormLaunch(q_weight=q_weight, k_weight=k_weight, cos=cos, sin=sin, **position_fields(spec),
                      rotary_dim=rotary_dim, layout=layout, interleaved=interleaved, per_token=per_token, eps=eps,
                      weight_offset=weight_offset, norm=place, norm_over_heads=over_heads, inv_freq=inv_freq,
                      angle_scale=float(scale))
    compiling = torch.compiler.is_compiling()
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                 for t in (q, k, q_weight, k_weight))
    plan = FusedPlan(None, _NAMES, ("q", "k") if inplace else ())
    if inplace:
        if needs_grad:
            raise ValueError("inplace=True does not support autograd; use inplace=False when q, k or the weights "
                             "require grad")
        # the caller's own tensors (what validation derived from them is a view of them or a fresh copy); with
        # table= the table's cos/sin
        if table is None:
            plan.check(user, at)
        else:
            validate.check_overlaps(_NAMES[:4] + ("table", "table") + _NAMES[6:],
                                    (q, k, q_weight, k_weight, cos, sin, positions, cu_seqlens, inv_freq), ("q", "k"))
        if q.is_meta:
            return q, k
    if q.is_meta:
        return new_output(q), (None if k is None else new_output(k))
    if compiling or needs_grad:
        if inplace:
            _norm_rope_inplace_op(q, k, *args)
            return q, k
        out_q, out_k = _norm_rope_op(q, k, *args)
        return out_q, (out_k if k is not None else None)
    out_q, out_k = (q, k) if inplace else (new_output(q), None if k is None else new_output(k))
    if key is not None and reads_callers_memory((cos, sin, spec.tensor, spec.cu_seqlens),
                                                (*user_tables, positions, cu_seqlens)):
        # planned only when the launch reads the caller's own tensors (not grown tables, copies or derived views)
        plan.launch = released(plan_fused(**_kernel_arguments(q, k, *args, out_q, out_k)))
        plans.put(key, plan)
        return _run_plan(plan, user, inplace, out_q, out_k)
    _launch(q, k, *args, out_q, out_k)
    if inplace:
        bump_versions(q, k)
    return out_q, out_k


# the names of qk_norm_rope's tensors, in the order a plan checks them
_NAMES = ("q", "k", "q_weight", "k_weight", "cos", "sin", "positions", "cu_seqlens", "inv_freq")


def _run_plan(plan, user, inplace, out_q=None, out_k=None, at=None):
    """A planned call: the overlap rule in place, the outputs and the launch, on the caller's own tensors (the
    kernel's views of them have the same data pointers). ``at``: where the call's tensors lie (:func:`keyed`), under
    which the plan keeps its launch; None: not kept (a call that brings its outputs, the plan's first)."""
    q, k, q_weight, k_weight, cos, sin, positions, cu_seqlens, inv_freq = user
    if out_q is None:
        if inplace:
            at = plan.check(user, at)
            out_q, out_k = q, k
        else:  # (fresh outputs: nothing to check, but where the call lies keeps its launch)
            out_q, out_k = new_output(q), None if k is None else new_output(k)
            at = with_outputs(at, out_q, out_k)
    if plan.launch is not None and not plan.relaunch(at):
        plan.launch_at(at, q, k, out_q, out_k, None, None, None, None, None, None, None, None, None, q_weight,
                       k_weight, cos if inv_freq is None else inv_freq, sin, positions, cu_seqlens,
                       0)
    if inplace:
        bump_versions(q, k)
    return out_q, out_k
