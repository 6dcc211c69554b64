"""The public entry point: ``apply_rope`` — validation, the ``torch.library`` custom ops, autograd.

Data flows one way: the user's call -> ``_prepare`` (every check, before any write) -> one launcher (Triton v4 or CUDA)
-> one kernel. Layouts become strides here, once; the kernels only see ``(batch, seq, heads, head_dim)`` views.

Four ways in, one kernel:

* eager inference (no grad, not compiling): the launcher is called directly — no dispatcher on the hot path —
  and with the Triton backend a repeated call signature reuses its validated plan (``_EagerPlan``): a decode step
  skips validation and launch derivation;
* eager autograd: ``_RopeFunction``, a plain ``autograd.Function`` around the same launches (its backward is the
  rotation by -θ, i.e. the same kernel with ``conjugate`` flipped);
* ``torch.compile``: the functional custom op ``ropekit::rope`` (fake impl for tracing; the same backward registered
  with ``torch.library``);
* ``inplace=True``: the mutating op ``ropekit::rope_`` when compiling, the launcher otherwise (no autograd).
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from . import device as _device  # noqa: F401  (interpreter switch before triton is imported)
from .positions import (POSITION_IDS, SCALAR_OFFSET, SEQ_OFFSETS, PositionSpec, longest_sequence,
                        resolve_positions)
from .layouts import LAYOUTS, TO_BSHD
from .triton.launch import plan_v4, plans, rope_v4

__all__ = ["apply_rope", "LAYOUTS", "BACKENDS"]

log = logging.getLogger("ropekit")

BACKENDS = ("triton", "cuda")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_mode() -> bool:
    """Opt-in checks of values inside device tensors (they cost a host sync, which CUDA graphs forbid)."""
    return os.environ.get("ROPEKIT_CHECK", "") not in ("", "0")


def _launcher(backend: str):
    if backend == "triton":
        return rope_v4
    from .cuda import rope_cuda  # built on first use; raises a clear error when no GPU / nvcc

    return rope_cuda


# --------------------------------------------------------------------------------------------------------------------
# Validation: everything about shapes, dtypes, devices and host integers, before anything is written.
# --------------------------------------------------------------------------------------------------------------------

def _check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions for this layout, got shape {tuple(x.shape)}")


def _prepare(q, k, cos, sin, positions, layout, rotary_dim, cu_seqlens, max_seqlen, per_token, eager_rounding,
             backend, table=None, interleaved=False):
    """Validate the call; return (cos, sin, spec, rotary_dim): tables as the kernel reads them, positions."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if eager_rounding and backend != "triton":
        raise ValueError("eager_rounding is implemented by backend='triton' only")
    varlen = layout == "thd"
    _check_tensor("q", q, 3 if varlen else 4)
    if k is not None:
        _check_tensor("k", k, q.ndim)
        if k.dtype != q.dtype:
            raise TypeError(f"q and k must have the same dtype, got q {q.dtype} and k {k.dtype}")
        if k.device != q.device:
            raise ValueError(f"q and k must be on the same device, got q on {q.device} and k on {k.device}")
        if k.shape[-1] != q.shape[-1]:
            raise ValueError(f"k's head_dim ({k.shape[-1]}) must equal q's head_dim ({q.shape[-1]})")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor (or pass table=...), got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")

    if varlen:
        if cu_seqlens is None:
            raise ValueError("layout 'thd' needs cu_seqlens (cumulative sequence lengths, shape (n_seqs + 1,))")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError("cu_seqlens must be an int32 or int64 tensor")
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 1:
            raise ValueError(f"cu_seqlens must be 1-D with n_seqs + 1 entries, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.device != q.device:
            raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}")
        if not cu_seqlens.is_contiguous():
            # the kernel reads cu_seqlens as a contiguous vector: a strided view is read by its logical values
            cu_seqlens = cu_seqlens.contiguous()
        if k is not None and k.shape[0] != q.shape[0]:
            raise ValueError(f"q and k must hold the same tokens, got {q.shape[0]} and {k.shape[0]}")
        if max_seqlen is None and cu_seqlens.is_meta:
            raise ValueError("max_seqlen is required with meta tensors (it cannot be read from a meta cu_seqlens)")
        if max_seqlen is None:
            # A host sync: pass max_seqlen (a host int) to keep the call capturable in a CUDA graph.
            max_seqlen = longest_sequence(cu_seqlens)
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
            raise TypeError(f"max_seqlen must be a non-negative host int, got {max_seqlen!r}")
        n_batch, seqlen = cu_seqlens.shape[0] - 1, q.shape[0]
    else:
        if cu_seqlens is not None:
            raise ValueError(f"cu_seqlens is only for layout 'thd', got layout {layout!r}")
        batch_axis, seq_axis = TO_BSHD[layout][:2]
        n_batch, seqlen = q.shape[batch_axis], q.shape[seq_axis]
        if k is not None and (k.shape[batch_axis], k.shape[seq_axis]) != (n_batch, seqlen):
            raise ValueError(f"q and k must share (batch, seq) = {(n_batch, seqlen)} in layout {layout!r}, "
                             f"got k with {(k.shape[batch_axis], k.shape[seq_axis])}")

    head_dim = q.shape[-1]
    if per_token:
        if positions is not None:
            raise ValueError("positions must be None with per_token=True: the per-token cos/sin rows already hold "
                             "each token's angles")
        rotary_dim_from_cos = cos.shape[-1]
        if _check_mode() and not q.is_meta:
            _check_row_halves(cos, sin, interleaved)  # the rows as given, before they broadcast to the tokens
    else:
        if cos.ndim != 2:
            raise ValueError(f"cos/sin tables must be 2-D (max_positions, rotary_dim/2), got shape {tuple(cos.shape)}"
                             " (pass per_token=True for per-token cos/sin rows in transformers' layout)")
        rotary_dim_from_cos = 2 * cos.shape[-1]
    if rotary_dim is None:
        rotary_dim = rotary_dim_from_cos
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
    if per_token and rotary_dim != rotary_dim_from_cos:
        raise ValueError(f"rotary_dim ({rotary_dim}) must equal the width of the per-token cos/sin rows "
                         f"({rotary_dim_from_cos}): a row's two halves pair channel i with i + width/2, so rotating "
                         "fewer channels with the same rows is not a rotation; slice the rows to rotary_dim instead")
    if rotary_dim > rotary_dim_from_cos:
        raise ValueError(f"rotary_dim ({rotary_dim}) needs cos/sin with {rotary_dim // 2 if not per_token else rotary_dim}"
                         f" columns, got {cos.shape[-1]}")

    if per_token:
        # Full-width rows per token, broadcast to the token shape without copying.
        token_shape = (seqlen,) if varlen else (n_batch, seqlen)
        try:
            cos = cos.expand(*token_shape, cos.shape[-1])
            sin = sin.expand(*token_shape, sin.shape[-1])
        except RuntimeError:
            raise ValueError(f"per-token cos/sin of shape {tuple(cos.shape)} do not broadcast to the tokens "
                             f"{token_shape} + (rotary_dim,)") from None
        spec = PositionSpec(SCALAR_OFFSET, 0, None, cu_seqlens, max_seqlen if varlen else None)
        if _check_mode() and not q.is_meta:
            _check_device_values(spec, 0, seqlen)
    else:
        spec = resolve_positions(batch=n_batch, seqlen=seqlen, positions=positions,
                                 cu_seqlens=cu_seqlens if varlen else None, max_seqlen=max_seqlen, device=q.device)
        if spec.mode == SCALAR_OFFSET:
            # Host-known positions: check (or grow) the table before launching.
            last = spec.offset + (max_seqlen if varlen else seqlen) - 1
            if spec.offset < 0:
                raise ValueError(f"positions (offset) must be >= 0, got {spec.offset}")
            if last >= cos.shape[0] and (max_seqlen if varlen else seqlen) > 0:
                if table is not None:
                    table.ensure(last + 1)
                    cos, sin = table.cos, table.sin
                else:
                    raise ValueError(f"positions reach {last} but the cos/sin table has {cos.shape[0]} rows; pass a "
                                     "longer table, or a ropekit.RopeTable / RotaryEmbedding that can grow")
        elif table is not None:
            # Positions in a device tensor are never read by the host (no sync). What the host does know is the
            # sequence length: a sequence of n tokens at offsets >= 0, or with position ids 0..n-1, reaches n - 1.
            table.ensure(max_seqlen if varlen else seqlen)
            cos, sin = table.cos, table.sin
        if _check_mode() and not q.is_meta:
            _check_device_values(spec, cos.shape[0], seqlen)
    if cos.stride() != sin.stride():
        # The kernel walks cos and sin with one set of strides; tables that differ (a column slice of a wider
        # buffer, say) are read through contiguous copies.
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin, spec, rotary_dim


def _check_device_values(spec: PositionSpec, table_len: int, n_tokens: int) -> None:
    """ROPEKIT_CHECK=1: values inside device tensors (a host sync; never inside CUDA-graph capture)."""
    if spec.cu_seqlens is not None:
        cu = spec.cu_seqlens.cpu()
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != n_tokens:
            raise ValueError(f"cu_seqlens must start at 0, never decrease and end at the token count {n_tokens}, "
                             f"got {cu.tolist()}")
        if cu.numel() > 1 and spec.max_seqlen < int((cu[1:] - cu[:-1]).max()):
            raise ValueError(f"max_seqlen ({spec.max_seqlen}) is shorter than the longest sequence")
    if spec.tensor is not None:
        pos = spec.tensor.cpu().to(torch.int64)  # positions near 2**31 plus a sequence length overflow int32
        lengths = ((spec.cu_seqlens[1:] - spec.cu_seqlens[:-1]).cpu() if spec.cu_seqlens is not None
                   else torch.full_like(pos, n_tokens))
        last = pos + lengths - 1 if spec.mode == SEQ_OFFSETS else pos
        if bool((pos < 0).any()):
            raise ValueError(f"positions must be >= 0, got {int(pos.min())}")
        if last.numel() and int(last.max()) >= table_len:
            raise ValueError(f"positions reach {int(last.max())} but the cos/sin table has {table_len} rows")


def _check_row_halves(cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> None:
    """ROPEKIT_CHECK=1: per-token rows hold one angle per pair (both halves equal), so that they are a rotation."""
    for name, rows in (("cos", cos), ("sin", sin)):
        first, second = (rows[..., 0::2], rows[..., 1::2]) if interleaved else rows.chunk(2, dim=-1)
        if not torch.equal(first, second):
            raise ValueError(f"per-token {name} rows must hold the same value for both channels of a pair "
                             f"({'2i and 2i+1' if interleaved else 'i and i + width/2'}); these differ")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets a view touches, relative to its storage."""
    lo = hi = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if size > 1:
            if stride > 0:
                hi += (size - 1) * stride
            else:
                lo += (size - 1) * stride
    return lo, hi


def _has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of the view may share memory: its dims, sorted by stride, must each step past
    everything the smaller ones span (the sufficient condition PyTorch's own checks use, in exact form)."""
    if t.numel() == 0:
        return False
    dims = sorted((abs(stride), size) for size, stride in zip(t.shape, t.stride()) if size > 1)
    reach = 0  # the largest offset the dims so far span
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _views_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views share an element. Exact for views with the same strides (slices of one packed qkv
    projection, k a slice of q's heads): a depth-first search over the index differences, largest stride first."""
    if a.is_meta or a.numel() == 0 or b.numel() == 0 or \
            a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() \
            or a.element_size() != b.element_size():
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    if a_hi < b_lo or b_hi < a_lo:
        return False
    if _has_internal_overlap(a) or _has_internal_overlap(b):
        return True
    if a.stride() != b.stride():
        return _offsets_meet(a, b)
    # a's element i and b's element j coincide iff sum (i_d - j_d) * stride_d == b_offset - a_offset
    dims = sorted(((abs(st), a.shape[d], b.shape[d], st < 0) for d, st in enumerate(a.stride())
                   if max(a.shape[d], b.shape[d]) > 1), reverse=True)
    reach = [0] * (len(dims) + 1)  # reach[i]: the largest |residual| dims i.. can still cancel
    for i in range(len(dims) - 1, -1, -1):
        stride, na, nb, _ = dims[i]
        reach[i] = reach[i + 1] + stride * max(na, nb)

    def solve(i: int, residual: int) -> bool:
        if i == len(dims):
            return residual == 0
        stride, na, nb, negative = dims[i]
        # coefficient c of |stride|: (i_d - j_d), or its negation for a negative stride
        low, high = (-(na - 1), nb - 1) if negative else (-(nb - 1), na - 1)
        low = max(low, -((reach[i + 1] - residual) // stride))  # ceil((residual - reach) / stride)
        high = min(high, (residual + reach[i + 1]) // stride)
        return any(solve(i + 1, residual - c * stride) for c in range(low, high + 1))

    return solve(0, b.storage_offset() - a.storage_offset())


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """Every element's offset into the storage (host arithmetic on the view's metadata; no data is read)."""
    offsets = torch.full((), t.storage_offset(), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets[..., None] + torch.arange(size, dtype=torch.int64) * stride
    return offsets.flatten()


_ENUMERATE_MAX = 1 << 22


def _offsets_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Views with different strides whose ranges meet: compare their element offsets, up to a size where that is
    cheap; beyond it, like PyTorch's own checks when the answer is too hard, assume they do not."""
    if a.numel() > _ENUMERATE_MAX or b.numel() > _ENUMERATE_MAX:
        return False
    return bool(torch.isin(_element_offsets(a), _element_offsets(b)).any())


_OVERLAP = ("unsupported operation: more than one element of the written-to tensor {name} refers to a single "
            "memory location. Please clone() the tensor before performing the operation (or use inplace=False).")


def _check_inplace_targets(q: torch.Tensor, k: Optional[torch.Tensor]) -> None:
    """In place writes q and k: like PyTorch's in-place ops, refuse a written-to tensor that overlaps itself or the
    other one (the rotation of one element would read a value another program already rotated)."""
    for name, t in (("q", q), ("k", k)):
        if t is not None and _has_internal_overlap(t):
            raise RuntimeError(_OVERLAP.format(name=name))
    if k is not None and _views_overlap(q, k):
        raise RuntimeError("unsupported operation: some elements of q and k refer to a single memory location, and "
                           "inplace=True writes both. Please clone() one of them (or use inplace=False).")


def _bump_versions(q: torch.Tensor, k: Optional[torch.Tensor]) -> None:
    """Tell autograd that q and k changed (as every in-place PyTorch op does): a saved tensor rotated in place then
    fails backward loudly instead of giving a wrong gradient. The custom op's dispatch does this by itself."""
    for t in (q, k):
        if t is not None and not t.is_inference():
            torch.autograd.graph.increment_version(t)


# --------------------------------------------------------------------------------------------------------------------
# Launch: one function both the custom ops and the eager fast path call.
# --------------------------------------------------------------------------------------------------------------------

def _new_output(x: torch.Tensor) -> torch.Tensor:
    # The output is contiguous in the caller's layout, whatever the input's strides (documented in docs/api.md).
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _kernel_views(q, k, out_q, out_k, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, layout):
    """The kernels' ``(batch, seq, heads, head_dim)`` views (3-D for thd) and the position spec."""
    if layout == "thd":
        return q, k, out_q, out_k, PositionSpec(pos_mode, position_offset, positions, cu_seqlens, max_seqlen)
    if layout == "bshd":  # no views to build: the hot path of decode
        return q, k, out_q, out_k, PositionSpec(pos_mode, position_offset, positions)
    order = TO_BSHD[layout]
    return (q.permute(order), None if k is None else k.permute(order), out_q.permute(order),
            None if out_k is None else out_k.permute(order), PositionSpec(pos_mode, position_offset, positions))


def _launch(q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim, layout,
            interleaved, conjugate, per_token, eager_rounding, backend, out_q, out_k):
    """Run the kernel for already-validated arguments; q/k/out are in the caller's layout."""
    # per-token cos/sin arrive already broadcast to the token shape (by _prepare, before any op or autograd saw them)
    q4, k4, oq4, ok4, spec = _kernel_views(q, k, out_q, out_k, positions, pos_mode, cu_seqlens, position_offset,
                                           max_seqlen, layout)
    _launcher(backend)(q4, k4, cos, sin, out_q=oq4, out_k=ok4, positions=spec, rotary_dim=rotary_dim,
                       interleaved=interleaved, conjugate=conjugate, cos_per_token=per_token,
                       copy_tail=out_q is not q,  # (by identity: two empty tensors share data pointer 0)
                       **({"eager_rounding": True} if eager_rounding else {}))


def _outputs(q, k, inplace: bool):
    """Where a call writes: q and k themselves, or fresh outputs (None for an absent k)."""
    if inplace:
        return q, k
    return _new_output(q), (_new_output(k) if k is not None else None)


def _rotate_new(q, k, *args):
    """Out of place: fresh outputs, then the kernel. ``args`` are the op's after k."""
    out_q, out_k = _outputs(q, k, False)
    _launch(q, k, *args, out_q, out_k)
    return out_q, out_k


def _save_inputs(ctx, inputs) -> None:
    """What the backward needs of the op's inputs: the tables and positions (tensors), the rest as they are."""
    _, k, cos, sin, positions, pos_mode, cu_seqlens, *rest = inputs
    ctx.save_for_backward(cos, sin, positions, cu_seqlens)
    ctx.has_k = k is not None
    ctx.args = (pos_mode, *rest)


def _backward_inputs(ctx, grad_q, grad_k) -> tuple:
    """The op's inputs for the vector-Jacobian product: the gradients, rotated by -θ.

    The rotation is orthogonal, so its VJP is the rotation by -θ, i.e. the same kernel with CONJUGATE flipped.
    Incoming gradients may be non-contiguous or even zero-stride (loss = out.sum()): the kernel reads any strides.
    """
    cos, sin, positions, cu_seqlens = ctx.saved_tensors
    (pos_mode, position_offset, max_seqlen, rotary_dim, layout, interleaved, conjugate, per_token, eager_rounding,
     backend) = ctx.args
    return (grad_q, grad_k if ctx.has_k else None, cos, sin, positions, pos_mode, cu_seqlens, position_offset,
            max_seqlen, rotary_dim, layout, interleaved, not conjugate, per_token, eager_rounding, backend)


@torch.library.custom_op("ropekit::rope", mutates_args=())
def _rope_op(q: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
             positions: Optional[torch.Tensor], pos_mode: int, cu_seqlens: Optional[torch.Tensor],
             position_offset: int, max_seqlen: int, rotary_dim: int, layout: str, interleaved: bool,
             conjugate: bool, per_token: bool, eager_rounding: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    out_q, out_k = _rotate_new(q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen,
                               rotary_dim, layout, interleaved, conjugate, per_token, eager_rounding, backend)
    return out_q, (out_k if out_k is not None else q.new_empty(0))  # a custom op returns tensors only


@_rope_op.register_fake
def _rope_op_fake(q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim,
                  layout, interleaved, conjugate, per_token, eager_rounding, backend):
    return _new_output(q), (_new_output(k) if k is not None else q.new_empty(0))


def _rope_backward(ctx, grad_q, grad_k):
    dq, dk = _rope_op(*_backward_inputs(ctx, grad_q, grad_k))
    return (dq, dk if ctx.has_k else None) + (None,) * 14


_rope_op.register_autograd(_rope_backward, setup_context=lambda ctx, inputs, output: _save_inputs(ctx, inputs))


class _RopeFunction(torch.autograd.Function):
    """The eager autograd path: the same launches as ``ropekit::rope`` and its registered backward, recorded by a
    plain ``autograd.Function``. The custom op's Python dispatch costs hundreds of microseconds of host time per call
    (docs/benchmarks.md, the ``ropekit-autograd`` rows); torch.compile still sees the custom op."""

    @staticmethod
    def forward(ctx, *inputs):
        _save_inputs(ctx, inputs)
        return _rotate_new(*inputs)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        # through apply() again, so double backward works
        return _RopeFunction.apply(*_backward_inputs(ctx, grad_q, grad_k)) + (None,) * 14


@torch.library.custom_op("ropekit::rope_", mutates_args=("q", "k"))
def _rope_inplace_op(q: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                     positions: Optional[torch.Tensor], pos_mode: int, cu_seqlens: Optional[torch.Tensor],
                     position_offset: int, max_seqlen: int, rotary_dim: int, layout: str, interleaved: bool, conjugate: bool,
                     per_token: bool, eager_rounding: bool, backend: str) -> None:
    _launch(q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim, layout, interleaved,
            conjugate, per_token, eager_rounding, backend, q, k)


@_rope_inplace_op.register_fake
def _rope_inplace_fake(q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim,
                       layout, interleaved, conjugate, per_token, eager_rounding, backend):
    return None


# --------------------------------------------------------------------------------------------------------------------
# The eager fast path: a repeated call skips validation and launch derivation.
# --------------------------------------------------------------------------------------------------------------------

def _tensor_key(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _signature(q, k, cos, sin, positions, layout, interleaved, rotary_dim, inplace, cu_seqlens, max_seqlen, per_token,
               conjugate, eager_rounding) -> tuple | None:
    """Everything that validation and the launch derive from, or None for a call that is not cached.

    A host-int position offset enters by its type only (its range is checked on every call, see ``_EagerPlan``);
    tensors by shape, strides, dtype and device, never by value, since validation never reads device values (that is
    ``ROPEKIT_CHECK``'s job, which bypasses this cache).
    """
    if positions is None or type(positions) is int:
        pos_key = type(positions)
    elif isinstance(positions, torch.Tensor):
        pos_key = _tensor_key(positions)
    else:
        return None
    if layout == "thd" and max_seqlen is None:
        return None  # _prepare derives it with a host sync: not something to skip
    for t in (q, k, cos, sin, cu_seqlens):
        if t is not None and not isinstance(t, torch.Tensor):
            return None
    # types beside values: True == 1 as dict keys, but not as arguments
    return (_tensor_key(q), _tensor_key(k), _tensor_key(cos), _tensor_key(sin), pos_key, layout, type(interleaved),
            interleaved, type(rotary_dim), rotary_dim, inplace, _tensor_key(cu_seqlens), type(max_seqlen), max_seqlen,
            per_token, type(conjugate), conjugate, eager_rounding)


class _EagerPlan:
    """A validated eager call (Triton backend, no autograd): the v4 launch and the positions' valid range."""

    __slots__ = ("launch", "inplace", "max_offset", "k_delta", "near")

    def __init__(self, launch, inplace: bool, max_offset: int | None, q=None, k=None):
        self.launch = launch  # a V4Launch, or None when there is nothing to compute (empty tensors)
        self.inplace = inplace
        self.max_offset = max_offset  # host-int offsets must lie in [0, max_offset] (None: no int offset)
        # In place, whether q and k overlap depends on where k lies relative to q, which the signature does not
        # hold: the plan serves k at the validated distance from q, or far enough that their bytes cannot meet.
        self.k_delta = self.near = None
        if inplace and k is not None:
            self.k_delta = k.data_ptr() - q.data_ptr()
            self.near = sum(hi - lo + 1 for lo, hi in (_span(q), _span(k))) * q.element_size()

    def accepts(self, positions, q, k) -> bool:
        if self.k_delta is not None:
            delta = k.data_ptr() - q.data_ptr()
            if delta != self.k_delta and abs(delta) < self.near and \
                    q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr():
                return False
        return type(positions) is not int or (self.max_offset is not None and 0 <= positions <= self.max_offset)

    def run(self, q, k, out_q, out_k, cos, sin, positions, cu_seqlens):
        if self.launch is not None:
            is_tensor = isinstance(positions, torch.Tensor)
            self.launch(q, k, out_q, out_k, cos, sin, positions if is_tensor else None, cu_seqlens,
                        0 if is_tensor or positions is None else positions)
        if self.inplace:
            _bump_versions(q, k)
        return out_q, out_k

    def __call__(self, q, k, cos, sin, positions, cu_seqlens):
        return self.run(q, k, *_outputs(q, k, self.inplace), cos, sin, positions, cu_seqlens)


def _make_plan(key, q, k, cos, sin, positions, pos_mode, cu_seqlens, position_offset, max_seqlen, rotary_dim,
               layout, interleaved, conjugate, per_token, eager_rounding, backend, inplace, out_q, out_k) -> _EagerPlan:
    """The plan for a call that ``_prepare`` has just validated; ``out_q``/``out_k`` are that call's outputs (their
    strides are the plan's)."""
    q4, k4, oq4, ok4, spec = _kernel_views(q, k, out_q, out_k, positions, pos_mode, cu_seqlens, position_offset,
                                           max_seqlen, layout)
    launch = plan_v4(q4, k4, cos, sin, out_q=oq4, out_k=ok4, positions=spec, rotary_dim=rotary_dim,
                     interleaved=interleaved, conjugate=conjugate, cos_per_token=per_token, copy_tail=not inplace,
                     eager_rounding=eager_rounding)
    max_offset = None
    if pos_mode == SCALAR_OFFSET and not per_token:
        n_positions = max_seqlen if layout == "thd" else q.shape[TO_BSHD[layout][1]]
        max_offset = cos.shape[0] - n_positions if n_positions > 0 else 2**62
    return plans.put(key, _EagerPlan(launch, inplace, max_offset, q, k))


# --------------------------------------------------------------------------------------------------------------------
# The public function.
# --------------------------------------------------------------------------------------------------------------------

def apply_rope(q: torch.Tensor, k: Optional[torch.Tensor] = None, cos: Optional[torch.Tensor] = None,
               sin: Optional[torch.Tensor] = None, *, table=None, positions=None, layout: str = "bshd",
               interleaved: bool = False, rotary_dim: Optional[int] = None, inplace: bool = False,
               cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None, per_token: bool = False,
               conjugate: bool = False, eager_rounding: bool = False, backend: str = "triton"):
    """Rotate q (and k) by their positions. Returns ``(q_out, k_out)`` (``k_out`` is None when k is None).

    Args:
        q, k: ``layout``-shaped tensors (fp16/bf16/fp32/fp64; any strides). k may have fewer heads (GQA/MQA) or be None.
        cos, sin: half-width tables ``(max_positions, rotary_dim/2)`` (float32 from ``ropekit.cos_sin_table``), or
            with ``per_token=True`` full-width rows in transformers' layout that broadcast to ``(batch, seq,
            rotary_dim)`` (``(tokens, rotary_dim)`` for thd).
        table: a :class:`ropekit.RopeTable` instead of cos/sin (grows for host-known positions).
        positions: None (0..S-1), an int offset, a ``(batch,)`` tensor of per-sequence offsets (decode with a KV
            cache), or position ids that broadcast to ``(batch, seq)`` (``(tokens,)`` for thd).
        layout: "bshd", "sbhd", "bhsd" or "thd" (packed varlen; needs ``cu_seqlens`` and ideally ``max_seqlen``).
        interleaved: GPT-J pairing (2i, 2i+1) instead of NeoX halves (i, i + rotary_dim/2).
        rotary_dim: rotate only the first ``rotary_dim`` channels (default: all that cos/sin cover).
        inplace: write into q and k (no autograd); the tail past rotary_dim is left untouched.
        conjugate: rotate by -θ (the inverse rotation).
        eager_rounding: round like eager PyTorch's ``x * cos + rotate_half(x) * sin`` (each product and the sum
            rounded to q's dtype), bit-compatible with transformers in fp16/bf16; default: one rounding (more exact).
        backend: "triton" (v4) or "cuda" (the hand-written CUDA C++ kernel).

    Raises ``TypeError``/``ValueError`` naming the argument, before anything is written.
    """
    if table is not None:
        if cos is not None or sin is not None:
            raise ValueError("pass either cos/sin or table=, not both")
        cos, sin = table.cos, table.sin
    elif cos is None or sin is None:
        raise TypeError("apply_rope needs cos and sin tables (or table=ropekit.RopeTable(...))")
    # Eager, no autograd, Triton: a call with a signature seen before goes straight to its plan (not in check mode,
    # which reads device values every call, nor with debug logging, which reports every launch).
    # (getattr: q and k are not validated yet; a wrong type is reported by _prepare below)
    eager = not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)))
    key = None
    if eager and backend == "triton" and not _check_mode() and not log.isEnabledFor(logging.DEBUG):
        key = _signature(q, k, cos, sin, positions, layout, interleaved, rotary_dim, inplace, cu_seqlens, max_seqlen,
                         per_token, conjugate, eager_rounding)
        plan = plans.get(key) if key is not None else None
        if plan is not None and plan.accepts(positions, q, k):
            return plan(q, k, cos, sin, positions, cu_seqlens)

    user_cos, user_sin = cos, sin
    cos, sin, spec, rotary_dim = _prepare(q, k, cos, sin, positions, layout, rotary_dim, cu_seqlens, max_seqlen,
                                          per_token, eager_rounding, backend, table, interleaved)
    args = (cos, sin, spec.tensor, spec.mode, spec.cu_seqlens, spec.offset, spec.max_seqlen or 0, rotary_dim, layout,
            interleaved, conjugate, per_token, eager_rounding, backend)
    if inplace:
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            raise ValueError("inplace=True does not support autograd; use inplace=False when q or k requires grad")
        _check_inplace_targets(q, k)
    if q.is_meta:
        # shape inference (validated above): the outputs' shapes, strides and dtypes, no data touched
        return _outputs(q, k, inplace)
    if not inplace and not eager:
        if torch.compiler.is_compiling():
            out_q, out_k = _rope_op(q, k, *args)
            return out_q, (out_k if k is not None else None)
        return _RopeFunction.apply(q, k, *args)
    if key is not None and spec.cu_seqlens is cu_seqlens and user_cos.stride() == user_sin.stride() and (
            per_token or (cos is user_cos and sin is user_sin)):
        # validated: remember the plan (not when _prepare grew the table: the grown one is a new signature; nor when
        # it read cos/sin or cu_seqlens through copies, which a later call would not pass; per-token rows never
        # grow, _prepare only broadcasts them, which the plan's strides already hold)
        out_q, out_k = _outputs(q, k, inplace)
        plan = _make_plan(key, q, k, *args, inplace, out_q, out_k)
        return plan.run(q, k, out_q, out_k, cos, sin, positions, cu_seqlens)
    if inplace:
        if torch.compiler.is_compiling():
            _rope_inplace_op(q, k, *args)
        else:
            _launch(q, k, *args, q, k)
            _bump_versions(q, k)
        return q, k
    # Eager inference: skip the dispatcher (host time matters for decode).
    return _rotate_new(q, k, *args)
