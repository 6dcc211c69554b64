"""The public entry point: ``apply_rope`` — the ``torch.library`` custom ops, autograd, and the eager fast path.

Data flows one way: the user's call -> :func:`ropekit.validate.prepare` (every check, before any write) -> a
:class:`RopeCall` (the validated call: tables, one :class:`~ropekit.positions.PositionSpec`, switches) -> one launcher
(Triton v4's :func:`~ropekit.triton.launch.rope_v4`, or CUDA) -> one kernel; or, as that last step, the same
arguments to :func:`ropekit.native.rope` (PyTorch ops: the default without a GPU, and for CPU tensors with one,
``ropekit.device.backend_for``). Layouts become ``(batch, seq, heads, head_dim)`` views here, once
(:mod:`ropekit.layouts`).

Four ways in, one launch function (``_run``):

* eager inference (no grad, not compiling): the launcher is called directly — no dispatcher on the hot path —
  and with the Triton backend a repeated call signature reuses its plan (``_EagerPlan``, kept in
  :data:`ropekit.triton.launch.plans`): a decode step skips validation and launch derivation;
* eager autograd: ``_RopeFunction``, a plain ``autograd.Function`` around the same launch (its backward is the
  rotation by -θ, i.e. the same kernel with ``conjugate`` flipped);
* ``torch.compile``: the functional custom op ``ropekit::rope`` (fake impl for tracing; the same backward registered
  with ``torch.library``);
* ``inplace=True``: the mutating op ``ropekit::rope_`` when compiling, the launcher otherwise (no autograd).
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional

import torch

from . import device as _device  # (first: the interpreter switch before triton is imported)
from . import native
from .layouts import LAYOUTS, TO_BSHD, batch_and_seq_axes
from .outputs import bump_versions, new_output
from .positions import SCALAR_OFFSET, PositionSpec
from .triton.launch import plan_rope, plans, released, rope_v4, signature, tensor_key
from .validate import BACKENDS, check_mode, check_nope, check_overlaps, prepare

__all__ = ["apply_rope", "LAYOUTS", "BACKENDS"]

log = logging.getLogger("ropekit")


class RopeCall(NamedTuple):
    """A validated call but for q, k and the outputs: what every way in hands to the launch. Its angles come from
    the cos/sin tables (or per-token rows), or, with ``inv_freq`` (cos and sin None), from each position times the
    inverse frequencies, multiplied by ``scale``; for a Llama 4 NoPE layer (``nope_floor_scale`` > 0) from none: q is
    multiplied by its token's attention temperature."""

    cos: Optional[torch.Tensor]
    sin: Optional[torch.Tensor]
    spec: PositionSpec
    rotary_dim: int
    layout: str
    interleaved: bool
    conjugate: bool
    per_token: bool
    eager_rounding: bool
    backend: str
    inv_freq: Optional[torch.Tensor] = None
    scale: float = 1.0
    nope_floor_scale: int = 0  # > 0: a NoPE layer (no rotation; q times its temperature, k copied)
    nope_attn_scale: float = 0.0


def _launcher(backend: str):
    if backend == "triton":
        if _device.INTERPRETER_MISSING:
            raise RuntimeError(f"backend='triton' cannot run here: {_device.INTERPRETER_MISSING}")
        return rope_v4
    if backend == "native":
        return native.rope
    from .cuda import rope_cuda  # built on first use; raises a clear error when no GPU / nvcc

    return rope_cuda


# --------------------------------------------------------------------------------------------------------------------
# Launch: one function every way in calls.
# --------------------------------------------------------------------------------------------------------------------

def _outputs(q, k, inplace: bool):
    """Where a call writes: q and k themselves, or fresh outputs (None for an absent k)."""
    if inplace:
        return q, k
    return new_output(q), (new_output(k) if k is not None else None)


def _kernel_views(q, k, out_q, out_k, layout: str) -> tuple:
    """The kernels' ``(batch, seq, heads, head_dim)`` views (packed ``thd`` stays 3-D)."""
    if layout in ("thd", "bshd"):  # no views to build: the hot path of decode
        return q, k, out_q, out_k
    order = TO_BSHD[layout]
    return (q.permute(order), None if k is None else k.permute(order), out_q.permute(order),
            None if out_k is None else out_k.permute(order))


def _switches(call: RopeCall) -> dict:
    """The launcher's keyword arguments that follow from the call alone."""
    angles = {} if call.inv_freq is None else dict(inv_freq=call.inv_freq, scale=call.scale)
    if call.nope_floor_scale:
        angles["nope"] = (call.nope_floor_scale, call.nope_attn_scale)
    return dict(positions=call.spec, rotary_dim=call.rotary_dim, interleaved=call.interleaved,
                conjugate=call.conjugate, cos_per_token=call.per_token, **angles)


def _run(q, k, call: RopeCall, out_q, out_k) -> None:
    """Run the kernel for a validated call; q/k/out are in the caller's layout. With the Triton backend the launch
    comes from the one plan cache, keyed by what :func:`~ropekit.triton.launch.plan_rope` derives it from: the
    autograd path (forward and backward) and the custom op meet a repeated signature with a dictionary lookup."""
    # per-token cos/sin arrive already broadcast to the token shape (by prepare, before any op or autograd saw them)
    q4, k4, oq4, ok4 = _kernel_views(q, k, out_q, out_k, call.layout)
    in_place = out_q is q  # (by identity: two empty tensors share data pointer 0)
    if call.backend != "triton" or log.isEnabledFor(logging.DEBUG):  # (debug logging reports every planning)
        _launcher(call.backend)(q4, k4, call.cos, call.sin, out_q=oq4, out_k=ok4, **_switches(call),
                                copy_tail=not in_place, **({"eager_rounding": True} if call.eager_rounding else {}))
        return
    spec = call.spec
    key = signature("rope", (q4, k4, oq4, ok4, call.cos, call.sin, spec.tensor, spec.cu_seqlens, call.inv_freq),
                    (in_place, spec.mode, spec.max_seqlen, call.rotary_dim, call.interleaved, call.conjugate,
                     call.per_token, call.eager_rounding, call.scale, call.nope_floor_scale, call.nope_attn_scale))
    launch = plans.get(key, _UNPLANNED)
    if launch is _UNPLANNED:
        _launcher("triton")  # (the interpreter's absence is reported before anything is planned)
        launch = plans.put(key, released(_plan(q4, k4, oq4, ok4, call, in_place)))
    if launch is not None:  # None: nothing to compute (empty tensors)
        launch(q4, k4, oq4, ok4, call.cos if call.inv_freq is None else call.inv_freq, call.sin, spec.tensor,
               spec.cu_seqlens, spec.offset)


_UNPLANNED = object()


def _plan(q4, k4, oq4, ok4, call: RopeCall, in_place: bool):
    """The Triton launch for a validated call's kernel views (the eager plan's and the validated call's)."""
    return plan_rope(q4, k4, call.cos, call.sin, out_q=oq4, out_k=ok4, **_switches(call), copy_tail=not in_place,
                     eager_rounding=call.eager_rounding)


def _rotate_new(q, k, call: RopeCall):
    """Out of place: fresh outputs, then the kernel."""
    out_q, out_k = _outputs(q, k, False)
    _run(q, k, call, out_q, out_k)
    return out_q, out_k


# --------------------------------------------------------------------------------------------------------------------
# The custom ops (torch.compile) and autograd. The ops' signature is written once, below: a RopeCall with the position
# spec's fields spelled out in schema types, since a custom op takes tensors, numbers and strings only.
# --------------------------------------------------------------------------------------------------------------------

_OP_PARAMS = ("Tensor{q} q", "Tensor{k}? k", "Tensor? cos", "Tensor? sin", "Tensor? positions", "int pos_mode",
              "Tensor? cu_seqlens", "int position_offset", "int max_seqlen", "int rotary_dim", "str layout",
              "bool interleaved", "bool conjugate", "bool per_token", "bool eager_rounding", "str backend",
              "Tensor? inv_freq", "float scale", "int nope_floor_scale", "float nope_attn_scale")
_NO_GRADS = (None,) * (len(_OP_PARAMS) - 2)  # the backward's answer for every input after q and k


def _op_schema(returns: str, q: str = "", k: str = "") -> str:
    return "(" + ", ".join(_OP_PARAMS).format(q=q, k=k) + ") -> " + returns


def _op_args(q, k, call: RopeCall) -> tuple:
    """A call as the custom ops take it (``_OP_PARAMS``)."""
    spec = call.spec
    return (q, k, call.cos, call.sin, spec.tensor, spec.mode, spec.cu_seqlens, spec.offset, spec.max_seqlen or 0,
            *call[3:])


def _from_op_args(args) -> tuple:
    """``(q, k, call)`` from the custom ops' arguments: the inverse of :func:`_op_args`."""
    q, k, cos, sin, positions, mode, cu_seqlens, offset, max_seqlen, *switches = args
    spec = PositionSpec(mode, offset, positions, cu_seqlens, max_seqlen if cu_seqlens is not None else None)
    return q, k, RopeCall(cos, sin, spec, *switches)


def _transposed(call: RopeCall) -> RopeCall:
    """The call whose rotation is the vector-Jacobian product of ``call``'s: the rotation is orthogonal, so its VJP
    is the rotation by -θ, i.e. the same kernel with CONJUGATE flipped. Incoming gradients may be non-contiguous or
    even zero-stride (loss = out.sum()): the kernel reads any strides."""
    return call._replace(conjugate=not call.conjugate)


def _rope(*args):
    q, k, call = _from_op_args(args)
    out_q, out_k = _rotate_new(q, k, call)
    return out_q, (out_k if out_k is not None else q.new_empty(0))  # a custom op returns tensors only


_rope_op = torch.library.custom_op("ropekit::rope", _rope, mutates_args=(), schema=_op_schema("(Tensor, Tensor)"))


@_rope_op.register_fake
def _rope_fake(q, k, *rest):
    return new_output(q), (new_output(k) if k is not None else q.new_empty(0))


def _save_for_backward(ctx, k, call: RopeCall) -> None:
    """Keep the call for the backward. Its tensors go through ``save_for_backward`` as well, so that autograd refuses
    a backward after one of them (positions, say) was modified in place, as it does for every op."""
    ctx.save_for_backward(call.cos, call.sin, call.spec.tensor, call.spec.cu_seqlens, call.inv_freq)
    ctx.call, ctx.has_k = call, k is not None


def _backward_call(ctx) -> RopeCall:
    ctx.saved_tensors  # noqa: B018  (unpacking raises if a saved tensor was modified since the forward)
    return _transposed(ctx.call)


def _setup_backward(ctx, inputs, output) -> None:
    _, k, call = _from_op_args(inputs)
    _save_for_backward(ctx, k, call)


def _rope_backward(ctx, grad_q, grad_k):
    dq, dk = _rope_op(*_op_args(grad_q, grad_k if ctx.has_k else None, _backward_call(ctx)))
    return (dq, dk if ctx.has_k else None) + _NO_GRADS


_rope_op.register_autograd(_rope_backward, setup_context=_setup_backward)


def _rope_inplace(*args) -> None:
    q, k, call = _from_op_args(args)
    _run(q, k, call, q, k)


_rope_inplace_op = torch.library.custom_op("ropekit::rope_", _rope_inplace, mutates_args=("q", "k"),
                                           schema=_op_schema("()", q="(a!)", k="(b!)"))


@_rope_inplace_op.register_fake
def _rope_inplace_fake(*args):
    return None


class _RopeFunction(torch.autograd.Function):
    """The eager autograd path: the same launch as ``ropekit::rope`` and its registered backward, recorded by a plain
    ``autograd.Function``, whose host cost per call is a fraction of the custom op's Python dispatch
    (docs/benchmarks.md, the ``ropekit-autograd`` rows); torch.compile still sees the custom op."""

    @staticmethod
    def forward(ctx, q, k, call: RopeCall):
        _save_for_backward(ctx, k, call)  # the tables and positions are not inputs: no gradient reaches them
        return _rotate_new(q, k, call)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        # through apply() again, so double backward works
        return _RopeFunction.apply(grad_q, grad_k if ctx.has_k else None, _backward_call(ctx)) + (None,)


# --------------------------------------------------------------------------------------------------------------------
# The eager fast path: a repeated call skips validation and launch derivation.
# --------------------------------------------------------------------------------------------------------------------

def _signature(q, k, cos, sin, positions, layout, interleaved, rotary_dim, inplace, cu_seqlens, max_seqlen, per_token,
               conjugate, eager_rounding, inv_freq, scale, mrope_section, mrope_interleaved, nope) -> tuple | None:
    """Everything that validation and the launch derive from, or None for a call that is not cached.

    A host-int position offset enters by its type only (its range is checked on every call, see ``_EagerPlan``);
    tensors by shape, strides, dtype and device, never by value, since validation never reads device values (that is
    ``ROPEKIT_CHECK``'s job, which bypasses this cache).
    """
    if positions is None or type(positions) is int:
        pos_key = type(positions)
    elif isinstance(positions, torch.Tensor):
        pos_key = tensor_key(positions)
    else:
        return None
    if layout == "thd" and max_seqlen is None:
        return None  # prepare derives it with a host sync: not something to skip
    for t in (q, k, cos, sin, cu_seqlens, inv_freq):
        if t is not None and not isinstance(t, torch.Tensor):
            return None
    if mrope_section is not None:
        if type(mrope_section) not in (list, tuple) or any(type(n) is not int for n in mrope_section):
            return None  # validation says what is wrong (and an int-valued float is no int)
        mrope_section = tuple(mrope_section)
    # types beside values: True == 1 as dict keys, but not as arguments
    return (tensor_key(q), tensor_key(k), tensor_key(cos), tensor_key(sin), pos_key, layout, type(interleaved),
            interleaved, type(rotary_dim), rotary_dim, inplace, tensor_key(cu_seqlens), type(max_seqlen), max_seqlen,
            per_token, type(conjugate), conjugate, eager_rounding, tensor_key(inv_freq), type(scale), scale,
            mrope_section, type(mrope_interleaved), mrope_interleaved, nope)


class _EagerPlan:
    """A validated eager call (Triton backend, no autograd): the v4 launch and the positions' valid range."""

    __slots__ = ("launch", "inplace", "max_offset", "checked")

    def __init__(self, launch, inplace: bool, max_offset: int | None):
        self.launch = launch  # a RopeLaunch, or None when there is nothing to compute (empty tensors)
        self.inplace = inplace
        self.max_offset = max_offset  # host-int offsets must lie in [0, max_offset] (None: no int offset)
        # In place, whether the tensors overlap depends on where they lie, which the signature does not hold: the
        # addresses already checked for this signature
        self.checked = set()

    def accepts(self, positions) -> bool:
        return type(positions) is not int or (self.max_offset is not None and 0 <= positions <= self.max_offset)

    def run(self, q, k, out_q, out_k, cos, sin, positions, cu_seqlens):
        if self.launch is not None:
            is_tensor = isinstance(positions, torch.Tensor)
            self.launch(q, k, out_q, out_k, cos, sin, positions if is_tensor else None, cu_seqlens,
                        0 if is_tensor or positions is None else positions)
        if self.inplace:
            bump_versions(q, k)
        return out_q, out_k

    def __call__(self, q, k, cos, sin, positions, cu_seqlens):
        return self.run(q, k, *_outputs(q, k, self.inplace), cos, sin, positions, cu_seqlens)


def _make_plan(key, q, k, call: RopeCall, inplace: bool, out_q, out_k) -> _EagerPlan:
    """The plan for a call that :func:`~ropekit.validate.prepare` has just validated; ``out_q``/``out_k`` are that
    call's outputs (their strides are the plan's)."""
    q4, k4, oq4, ok4 = _kernel_views(q, k, out_q, out_k, call.layout)
    launch = released(_plan(q4, k4, oq4, ok4, call, inplace))  # the cache must not keep this call's tensors alive
    max_offset = None
    if call.spec.mode == SCALAR_OFFSET and (call.inv_freq is not None or call.nope_floor_scale):
        max_offset = 2**62  # no table to stay inside
    elif call.spec.mode == SCALAR_OFFSET and not call.per_token:
        n_positions = call.spec.max_seqlen if call.layout == "thd" else q.shape[batch_and_seq_axes(call.layout)[1]]
        max_offset = call.cos.shape[0] - n_positions if n_positions > 0 else 2**62
    return plans.put(key, _EagerPlan(launch, inplace, max_offset))


def _check_in_place(q, k, cos, sin, positions, cu_seqlens, table, inv_freq, memo=None) -> None:
    """In place the call writes q and k: neither may share memory with itself, the other or what the call reads."""
    check_overlaps(("q", "k") + (("table", "table") if table is not None else ("cos", "sin")) + (
        "positions", "cu_seqlens", "inv_freq"), (q, k, cos, sin, positions, cu_seqlens, inv_freq), ("q", "k"), memo)


# --------------------------------------------------------------------------------------------------------------------
# The public function.
# --------------------------------------------------------------------------------------------------------------------

def apply_rope(q: torch.Tensor, k: Optional[torch.Tensor] = None, cos: Optional[torch.Tensor] = None,
               sin: Optional[torch.Tensor] = None, *, table=None, inv_freq: Optional[torch.Tensor] = None,
               scale: float = 1.0, positions=None, layout: str = "bshd", interleaved: bool = False,
               rotary_dim: Optional[int] = None, inplace: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
               max_seqlen: Optional[int] = None, per_token: bool = False, conjugate: bool = False,
               eager_rounding: bool = False, backend: Optional[str] = None, mrope_section=None,
               mrope_interleaved: bool = False, nope_temperature=None):
    """Rotate q (and k) by their positions. Returns ``(q_out, k_out)`` (``k_out`` is None when k is None).

    Args:
        q, k: ``layout``-shaped tensors (fp16/bf16/fp32/fp64; any strides). k may have fewer heads (GQA/MQA) or be None.
        cos, sin: half-width tables ``(max_positions, rotary_dim/2)`` (float32 from ``ropekit.cos_sin_table``), or
            with ``per_token=True`` full-width rows in transformers' layout that broadcast to ``(batch, seq,
            rotary_dim)`` (``(tokens, rotary_dim)`` for thd).
        table: a :class:`ropekit.RopeTable` instead of cos/sin (grows for host-known positions).
        inv_freq: instead of cos/sin or a table, the float32 or float64 inverse frequencies ``(rotary_dim/2,)`` (any
            rope type's, e.g. ``ropekit.frequencies``' or a transformers rotary module's ``inv_freq``): the kernel
            computes cos and sin of ``position * inv_freq`` in float64, reduced mod 2π, at every position, with no
            table in memory (docs/api.md#angles-without-a-table). Not with ``per_token`` nor ``backend="cuda"``.
        scale: with ``inv_freq``, multiplies cos and sin: the attention scaling some rope types apply to them
            (transformers' ``attention_scaling``, YaRN's and LongRoPE's mscale). A host float, 1.0 by default.
        positions: None (0..S-1), an int offset, a ``(batch,)`` tensor of per-sequence offsets (decode with a KV
            cache), or position ids that broadcast to ``(batch, seq)`` (``(tokens,)`` for thd); with
            ``mrope_section``, also ``(3, batch, seq)`` (``(3, tokens)`` for thd) temporal, height and width ids.
        layout: "bshd", "sbhd", "bhsd" or "thd" (packed varlen; needs ``cu_seqlens`` and ideally ``max_seqlen``).
        interleaved: GPT-J pairing (2i, 2i+1) instead of NeoX halves (i, i + rotary_dim/2).
        rotary_dim: rotate only the first ``rotary_dim`` channels (default: all that cos/sin cover).
        inplace: write into q and k (no autograd); the tail past rotary_dim is left untouched.
        conjugate: rotate by -θ (the inverse rotation).
        eager_rounding: round like eager PyTorch's ``x * cos + rotate_half(x) * sin`` (each product and the sum
            rounded to q's dtype), bit-compatible with transformers in fp16/bf16; default: one rounding (more exact).
        backend: "triton" (v4; in Triton's interpreter without a GPU), "cuda" (the hand-written CUDA C++ kernel),
            "native" (PyTorch ops, the same semantics), or None: ``ropekit.device.backend_for(q)`` ("triton" on a
            GPU, "native" without one, and for CPU tensors on a machine with a GPU). "triton" and "cuda" need q on the
            device their kernels run on.
        mrope_section: M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): three host ints ``(t, h, w)``, the pairs that follow
            the temporal, height and width position (summing to rotary_dim/2). With ``(3, ...)`` positions each pair
            reads the table (or ``inv_freq``) at its own axis' position, inside the kernel; other position forms are
            text tokens (the three axes equal: the ordinary rotation). docs/api.md#m-rope.
        mrope_interleaved: Qwen3-VL's layout: the axes take turns pair by pair (pair ``i`` follows height when
            ``i % 3 == 1`` and ``i < 3h``, width when ``i % 3 == 2`` and ``i < 3w``, else temporal) instead of
            consecutive sections.
        nope_temperature: ``(floor_scale, attn_scale)``: a Llama 4 NoPE layer (transformers'
            ``attn_temperature_tuning``). Nothing rotates and no cos/sin, table or inv_freq is given; every channel of
            q is multiplied by ``log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1`` at its token's
            position (any position form), and k passes through (copied out of place, untouched in place).

    Raises ``TypeError``/``ValueError`` naming the argument, before anything is written.
    """
    if backend is None:
        backend = _device.backend_for(q)
    nope = check_nope(nope_temperature, backend, per_token, mrope_section)
    if nope is not None:
        if cos is not None or sin is not None or table is not None or inv_freq is not None:
            raise ValueError("nope_temperature: a NoPE layer rotates nothing; pass no cos/sin, table= or inv_freq=")
    elif inv_freq is not None:
        if cos is not None or sin is not None or table is not None:
            raise ValueError("pass either inv_freq= or cos/sin or table=, not more than one")
    elif table is not None:
        if cos is not None or sin is not None:
            raise ValueError("pass either cos/sin or table=, not both")
        cos, sin = table.cos, table.sin
    elif cos is None or sin is None:
        raise TypeError("apply_rope needs cos and sin tables (or table=ropekit.RopeTable(...), or inv_freq=)")
    # Eager, no autograd, Triton: a call with a signature seen before goes straight to its plan (not in check mode,
    # which reads device values every call, nor with debug logging, which reports every launch).
    # (getattr: q and k are not validated yet; a wrong type is reported by prepare below)
    eager = not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)))
    key = None
    if eager and backend == "triton" and not check_mode() and not log.isEnabledFor(logging.DEBUG):
        key = _signature(q, k, cos, sin, positions, layout, interleaved, rotary_dim, inplace, cu_seqlens, max_seqlen,
                         per_token, conjugate, eager_rounding, inv_freq, scale, mrope_section, mrope_interleaved,
                         nope)
        plan = plans.find(key)
        if plan is not None and plan.accepts(positions):
            if inplace:
                _check_in_place(q, k, cos, sin, positions, cu_seqlens, table, inv_freq, plan.checked)
            return plan(q, k, cos if inv_freq is None else inv_freq, sin, positions, cu_seqlens)

    user_cos, user_sin = cos, sin
    cos, sin, spec, rotary_dim = prepare(q, k, cos, sin, positions, layout, rotary_dim, cu_seqlens, max_seqlen,
                                         per_token, eager_rounding, backend, table, interleaved, inv_freq, scale,
                                         mrope_section, mrope_interleaved, nope)
    call = RopeCall(cos, sin, spec, rotary_dim, layout, interleaved, conjugate, per_token, eager_rounding, backend,
                    inv_freq, float(scale), *(nope or (0, 0.0)))
    if inplace:
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            raise ValueError("inplace=True does not support autograd; use inplace=False when q or k requires grad")
        _check_in_place(q, k, user_cos, user_sin, positions, cu_seqlens, table, inv_freq)
    if q.is_meta:
        # shape inference (validated above): the outputs' shapes, strides and dtypes, no data touched
        return _outputs(q, k, inplace)
    if not inplace and not eager:
        if torch.compiler.is_compiling():
            out_q, out_k = _rope_op(*_op_args(q, k, call))
            return out_q, (out_k if k is not None else None)
        return _RopeFunction.apply(q, k, call)
    if key is not None and spec.cu_seqlens is cu_seqlens and (inv_freq is not None or nope is not None or (
            user_cos.stride() == user_sin.stride() and (per_token or (cos is user_cos and sin is user_sin)))):
        # validated: remember the plan (not when prepare grew the table: the grown one is a new signature; nor when
        # it read cos/sin or cu_seqlens through copies, which a later call would not pass; per-token rows never
        # grow, prepare only broadcasts them, which the plan's strides already hold)
        out_q, out_k = _outputs(q, k, inplace)
        return _make_plan(key, q, k, call, inplace, out_q, out_k).run(
            q, k, out_q, out_k, cos if inv_freq is None else inv_freq, sin, positions, cu_seqlens)
    if inplace:
        if torch.compiler.is_compiling():
            _rope_inplace_op(*_op_args(q, k, call))
        else:
            _run(q, k, call, q, k)
            bump_versions(q, k)
        return q, k
    # Eager inference: skip the dispatcher (host time matters for decode).
    return _rotate_new(q, k, call)
