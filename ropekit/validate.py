"""Validation of an ``apply_rope`` call: every check on shapes, dtypes, devices and host integers, made before anything
is written, each error naming its argument.

:func:`prepare` turns a call's arguments into what the launch path takes: the tables as the kernel reads them, one
:class:`~ropekit.positions.PositionSpec` and the rotary width. Values inside device tensors (positions beyond the
table, ``cu_seqlens`` that decrease) are checked only in check mode (``ROPEKIT_CHECK=1``): reading them costs a host
sync, which CUDA graphs forbid.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import torch

from . import device as _device
from .layouts import LAYOUTS, batch_and_seq_axes
from .positions import SCALAR_OFFSET, SEQ_OFFSETS, PositionSpec, longest_sequence, resolve_positions

__all__ = ["BACKENDS", "prepare", "check_nope", "check_mode", "check_overlaps", "addresses", "OverlapError",
           "as_integer", "pair_copies", "in_callers_names"]

BACKENDS = ("triton", "cuda", "native")

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_mode() -> bool:
    """Opt-in checks of values inside device tensors (they cost a host sync, which CUDA graphs forbid):
    ``ROPEKIT_CHECK`` set, and neither empty nor ``0``, read on every call."""
    if _ENVIRON is None or os.environ is not _ENVIRONMENT:
        return os.environ.get("ROPEKIT_CHECK", "") not in ("", "0")
    value = _ENVIRON.get(_CHECK_KEY)
    return value is not None and value not in _CHECK_OFF


def _environ_dict() -> tuple:
    """``os.environ``'s own dictionary, its key for ``ROPEKIT_CHECK`` and the values that leave check mode off, as it
    stores them (bytes on POSIX); ``(None, None, None)`` where ``os.environ`` keeps no such dictionary. Every planned
    call reads check mode, and ``os.environ.get`` encodes the name and decodes the value on each read; writes through
    ``os.environ`` (``monkeypatch.setenv`` too) update this dictionary, so a direct read sees them. Read only while
    ``os.environ`` is the mapping it belongs to (a test may replace the mapping)."""
    data, encode_key, encode_value = (getattr(os.environ, name, None) for name in ("_data", "encodekey", "encodevalue"))
    if not isinstance(data, dict) or encode_key is None or encode_value is None:
        return None, None, None
    return data, encode_key("ROPEKIT_CHECK"), frozenset((encode_value(""), encode_value("0")))


_ENVIRONMENT = os.environ
_ENVIRON, _CHECK_KEY, _CHECK_OFF = _environ_dict()


def as_integer(value) -> int | None:
    """``value`` as an int when it is one (numpy's integer types too; a bool is not), else None."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


@contextlib.contextmanager
def in_callers_names(call: str, names: str):
    """Errors raised inside name the rotation's own arguments (q, k, cos/sin, rotary_dim, ...): add which of
    ``call``'s arguments those are (``names``), so that every error tells the caller what they passed."""
    try:
        yield
    except (TypeError, ValueError, RuntimeError) as error:
        raise type(error)(f"{error} [in {call}: {names}]") from error


def pair_copies(rows: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two channels of every pair along the last dimension: halves (NeoX) or even/odd channels (GPT-J)."""
    return (rows[..., 0::2], rows[..., 1::2]) if interleaved else rows.chunk(2, dim=-1)


def _check_tensor(name: str, x, ndim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions for this layout, got shape {tuple(x.shape)}")


def _check_angles(inv_freq, scale, q, backend: str, per_token: bool) -> None:
    """Table-free angles: ``inv_freq`` a float32/float64 vector on q's device, ``scale`` a finite host number."""
    if backend == "cuda":
        raise ValueError("inv_freq (angles computed without a table) is implemented by backend='triton' and 'native' "
                         "only; pass a cos/sin table to backend='cuda'")
    if per_token:
        raise ValueError("inv_freq computes each position's angles; per_token=True takes cos/sin rows instead, "
                         "not both")
    if not isinstance(inv_freq, torch.Tensor):
        raise TypeError(f"inv_freq must be a torch.Tensor, got {type(inv_freq).__name__}")
    if inv_freq.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"inv_freq must be float32 or float64, got {inv_freq.dtype}")
    if inv_freq.ndim != 1 or inv_freq.shape[0] == 0:
        raise ValueError(f"inv_freq must be 1-D (rotary_dim/2,), got shape {tuple(inv_freq.shape)}")
    if inv_freq.device != q.device:
        raise ValueError(f"inv_freq is on {inv_freq.device} but q is on {q.device}")
    _check_scale(scale)


def _check_scale(scale) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a host float, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")


def _check_mrope(mrope_section, mrope_interleaved, rotary_dim: int, backend: str, per_token: bool) -> tuple | None:
    """M-RoPE's switches: ``mrope_section`` three non-negative host ints (pairs per axis) summing to
    ``rotary_dim / 2``, ``mrope_interleaved`` a bool. Returns the sections as a tuple (None without M-RoPE)."""
    if not isinstance(mrope_interleaved, bool):
        raise TypeError(f"mrope_interleaved must be a bool, got {type(mrope_interleaved).__name__}")
    if mrope_section is None:
        if mrope_interleaved:
            raise ValueError("mrope_interleaved=True needs mrope_section (the pairs of each position axis)")
        return None
    try:
        section = tuple(mrope_section)
    except TypeError:
        raise TypeError(f"mrope_section must be a list of three ints (t, h, w), got "
                        f"{type(mrope_section).__name__}") from None
    values = [as_integer(n) for n in section]
    if len(values) != 3 or None in values or min(values) < 0:
        raise ValueError(f"mrope_section must be three non-negative ints (temporal, height, width pairs), got "
                         f"{list(section)}")
    if sum(values) != rotary_dim // 2:
        raise ValueError(f"mrope_section {values} must sum to rotary_dim/2 = {rotary_dim // 2}, got {sum(values)}")
    if rotary_dim // 2 >= 4096:
        raise ValueError(f"mrope_section: M-RoPE takes fewer than 4096 pairs, got rotary_dim {rotary_dim}")
    if backend == "cuda":
        raise ValueError("mrope_section (M-RoPE in the kernel) is implemented by backend='triton' and 'native' only; "
                         "with backend='cuda' pass per-token rows from ropekit.mrope_cos_sin")
    if per_token:
        raise ValueError("mrope_section picks each pair's position from positions; per_token=True takes cos/sin rows "
                         "that already hold the angles, not both")
    return tuple(values)


def check_nope(nope_temperature, backend: str, per_token: bool, mrope_section) -> tuple | None:
    """A Llama 4 NoPE layer's switch: ``nope_temperature`` ``(floor_scale, attn_scale)``, a positive integer (an
    integer-valued float too, as vLLM's config holds it) and a finite host float. Returns them as ``(int, float)``
    (None without the switch)."""
    if nope_temperature is None:
        return None
    try:
        floor_scale, attn_scale = nope_temperature
    except (TypeError, ValueError):
        raise TypeError(f"nope_temperature must be a pair (floor_scale, attn_scale), got "
                        f"{nope_temperature!r}") from None
    whole = as_integer(floor_scale)
    if whole is None and isinstance(floor_scale, float) and floor_scale.is_integer():
        whole = int(floor_scale)
    if whole is None or whole <= 0:
        raise ValueError(f"nope_temperature: floor_scale must be a positive integer, got {floor_scale!r}")
    if isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float)) or not math.isfinite(attn_scale):
        raise ValueError(f"nope_temperature: attn_scale must be a finite host float, got {attn_scale!r}")
    if backend == "cuda":
        raise ValueError("nope_temperature (a NoPE layer) is implemented by backend='triton' and 'native' only")
    if per_token or mrope_section is not None:
        raise ValueError("nope_temperature: a NoPE layer rotates nothing; per_token and mrope_section do not apply")
    return whole, float(attn_scale)


def prepare(q, k, cos, sin, positions, layout, rotary_dim, cu_seqlens, max_seqlen, per_token, eager_rounding,
            backend, table=None, interleaved=False, inv_freq=None, scale=1.0, mrope_section=None,
            mrope_interleaved=False, nope=None):
    """Validate the call; return (cos, sin, spec, rotary_dim): tables as the kernel reads them (None with
    ``inv_freq``, the table-free angles, which the kernel reads as given, and for a NoPE layer, ``nope`` as
    :func:`check_nope` returned it, which reads none), positions (M-RoPE's sections in the position mode,
    ``ropekit.positions.mrope_mode``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if eager_rounding and backend == "cuda":
        raise ValueError("eager_rounding is implemented by backend='triton' and 'native' only")
    varlen = layout == "thd"
    _check_tensor("q", q, 3 if varlen else 4)
    if backend != "native" and not _device.kernels_read(q):
        raise ValueError(f"q is on {q.device}, but backend={backend!r} runs its kernels on the GPU: move q and k to "
                         "the GPU, or pass backend='native' (or None, which takes it for tensors off the GPU)")
    if k is not None:
        _check_tensor("k", k, q.ndim)
        if k.dtype != q.dtype:
            raise TypeError(f"q and k must have the same dtype, got q {q.dtype} and k {k.dtype}")
        if k.device != q.device:
            raise ValueError(f"q and k must be on the same device, got q on {q.device} and k on {k.device}")
        if k.shape[-1] != q.shape[-1]:
            raise ValueError(f"k's head_dim ({k.shape[-1]}) must equal q's head_dim ({q.shape[-1]})")
    angles = inv_freq is not None
    tableless = angles or nope is not None
    if angles:
        _check_angles(inv_freq, scale, q, backend, per_token)
    else:
        _check_scale(scale)
        if scale != 1:
            raise ValueError(f"scale ({scale}) multiplies the angles computed from inv_freq; scale a cos/sin table "
                             "itself")
    for name, t in (("cos", cos), ("sin", sin)) if not tableless else ():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor (or pass table=...), got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if not tableless and cos.shape != sin.shape:
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
        batch_axis, seq_axis = batch_and_seq_axes(layout)
        n_batch, seqlen = q.shape[batch_axis], q.shape[seq_axis]
        if k is not None and (k.shape[batch_axis], k.shape[seq_axis]) != (n_batch, seqlen):
            raise ValueError(f"q and k must share (batch, seq) = {(n_batch, seqlen)} in layout {layout!r}, "
                             f"got k with {(k.shape[batch_axis], k.shape[seq_axis])}")
    if n_batch > 65535 and backend != "native":
        # the kernels (apply_rope's and the fused ops') put the sequences on the grid's third axis: CUDA caps it
        where = "cu_seqlens holds" if varlen else "q's batch holds"
        raise ValueError(f"{where} {n_batch} sequences; the kernels take at most 65535 in one call (the launch "
                         "grid's limit): split the batch, or pass backend='native'")

    head_dim = q.shape[-1]
    if nope is not None:
        if head_dim % 2 or rotary_dim not in (None, head_dim):
            raise ValueError(f"nope_temperature scales the whole head: head_dim ({head_dim}) must be even and "
                             f"rotary_dim None or head_dim, got {rotary_dim}")
        rotary_dim_from_cos = head_dim
    elif angles:
        rotary_dim_from_cos = 2 * inv_freq.shape[0]
    elif per_token:
        if positions is not None:
            raise ValueError("positions must be None with per_token=True: the per-token cos/sin rows already hold "
                             "each token's angles")
        rotary_dim_from_cos = cos.shape[-1]
        if check_mode() and not q.is_meta:
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
    if rotary_dim > rotary_dim_from_cos and angles:
        raise ValueError(f"rotary_dim ({rotary_dim}) needs inv_freq with {rotary_dim // 2} entries, got "
                         f"{inv_freq.shape[0]}")
    if rotary_dim > rotary_dim_from_cos:
        columns = rotary_dim // 2 if not per_token else rotary_dim
        raise ValueError(f"rotary_dim ({rotary_dim}) needs cos/sin with {columns}"
                         f" columns, got {cos.shape[-1]}")

    mrope_section = _check_mrope(mrope_section, mrope_interleaved, rotary_dim, backend, per_token)
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
        if check_mode() and not q.is_meta:
            _check_device_values(spec, 0, seqlen)
    else:
        spec = resolve_positions(batch=n_batch, seqlen=seqlen, positions=positions,
                                 cu_seqlens=cu_seqlens if varlen else None, max_seqlen=max_seqlen, device=q.device,
                                 mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
        if spec.mode == SCALAR_OFFSET:
            # Host-known positions: check (or grow) the table before launching.
            last = spec.offset + (max_seqlen if varlen else seqlen) - 1
            if spec.offset < 0:
                raise ValueError(f"positions (offset) must be >= 0, got {spec.offset}")
            if not tableless and last >= cos.shape[0] and (max_seqlen if varlen else seqlen) > 0:
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
        if check_mode() and not q.is_meta:
            _check_device_values(spec, 2**63 - 1 if tableless else cos.shape[0], seqlen)
    if tableless:
        return None, None, spec, rotary_dim
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
        if not torch.equal(*pair_copies(rows, interleaved)):
            raise ValueError(f"per-token {name} rows must hold the same value for both channels of a pair "
                             f"({'2i and 2i+1' if interleaved else 'i and i + width/2'}); these differ")


class OverlapError(ValueError, RuntimeError):
    """A call that writes memory another of its tensors also holds. A ``ValueError`` like every argument error, and a
    ``RuntimeError`` like PyTorch's own refusal of in-place writes to overlapping memory."""


def _bytes(t: torch.Tensor) -> tuple[int, int, tuple]:
    """A view's bytes: its first and last address and its dimensions as ``(byte stride, size)``, smallest stride
    first, with the bytes of one element as a dimension of stride 1 (so views of any dtypes compare)."""
    size = t.element_size()
    dims = sorted([(stride * size, n) for n, stride in zip(t.shape, t.stride()) if n > 1]
                  + ([(1, size)] if size > 1 else []))
    first = t.data_ptr()
    return first, first + sum((n - 1) * stride for stride, n in dims), tuple(dims)


def _has_internal_overlap(dims: tuple) -> bool:
    """Whether two elements of a view (its ``_bytes`` dims) share a byte: each dimension, by stride, must step past
    everything the smaller ones span (the sufficient condition PyTorch's own checks use, in exact form)."""
    reach = 0  # the largest offset the dims so far span
    for stride, n in dims:
        if stride <= reach:
            return True
        reach += (n - 1) * stride
    return False


def _bytes_meet(a: tuple, b: tuple) -> bool:
    """Whether two views (``_bytes``) share a byte. Exact when one's strides are among the other's (slices of one
    packed qkv projection, k a slice of q's heads, two halves of one cache): a depth-first search over the index
    differences, largest stride first. Otherwise, as PyTorch does with what it cannot prove apart, intersecting
    spans count as overlapping."""
    (a_first, a_last, a_dims), (b_first, b_last, b_dims) = a, b
    if a_last < b_first or b_last < a_first:
        return False
    a_sizes, b_sizes = dict(a_dims), dict(b_dims)
    strides = sorted(a_sizes.keys() | b_sizes.keys(), reverse=True)
    if len(a_sizes) < len(a_dims) or len(b_sizes) < len(b_dims) or not (
            a_sizes.keys() <= b_sizes.keys() or b_sizes.keys() <= a_sizes.keys()) or \
            _has_internal_overlap(a_dims) or _has_internal_overlap(b_dims):
        return True
    # a's element i and b's element j meet iff sum over strides of (i_s - j_s) * stride == b_first - a_first
    dims = [(stride, a_sizes.get(stride, 1), b_sizes.get(stride, 1)) for stride in strides]
    reach = [0] * (len(dims) + 1)  # reach[i]: the largest |residual| dims i.. can still cancel
    for i in range(len(dims) - 1, -1, -1):
        stride, na, nb = dims[i]
        reach[i] = reach[i + 1] + stride * max(na, nb)

    def solve(i: int, residual: int) -> bool:
        if i == len(dims):
            return residual == 0
        stride, na, nb = dims[i]
        low = max(-(nb - 1), -((reach[i + 1] - residual) // stride))  # ceil((residual - reach) / stride)
        high = min(na - 1, (residual + reach[i + 1]) // stride)
        return any(solve(i + 1, residual - c * stride) for c in range(low, high + 1))

    return solve(0, b_first - a_first)


_MEMO_MAX = 64


def addresses(tensors: tuple) -> tuple:
    """The data pointers of the tensors among ``tensors`` (None and non-tensors skipped), in order: what a call's
    memory placement is, beside its signature (the overlap memo's key, and the fused plans' launches by address)."""
    # (None first: isinstance against torch.Tensor is slow for a non-tensor, and most optional arguments are None)
    return tuple([t.data_ptr() for t in tensors if t is not None and isinstance(t, torch.Tensor)])


def check_overlaps(names: tuple, tensors: tuple, written: tuple, memo: set | None = None,
                   at: tuple | None = None) -> tuple | None:
    """The overlap rule of every op, checked before anything is written. ``tensors`` (None and non-tensors are
    skipped) are the call's, under the caller's ``names``; those named in ``written`` are written, the others read.
    A written tensor must not overlap itself (two of its elements at one address) nor share a byte with any other
    tensor of the call, written or read, of any dtype; exact for views with the same strides, so slices of one packed
    qkv projection pass (see ``_bytes_meet``). Raises :class:`OverlapError` naming both.

    ``memo``: the addresses already checked for one call signature (shapes, strides, dtypes: a plan's key), which
    decide the answer; a call at the same addresses skips the check. Returns those addresses (:func:`addresses`),
    or None without a memo. ``at``: the memo's key when the caller has it (the addresses of every tensor of the call,
    a superset of these), instead of :func:`addresses` of ``tensors``. Skipped while torch.compile traces: fake
    tensors have no addresses, so inside a compiled graph overlapping arguments are not detected."""
    if torch.compiler.is_compiling():
        return None
    if memo is not None:
        if at is None:
            at = addresses(tensors)
        if at in memo:
            return at
    views = [(name, _bytes(t), name in written) for name, t in zip(names, tensors)
             if isinstance(t, torch.Tensor) and not t.is_meta and t.numel()]
    for i, (name, view, writes) in enumerate(views):
        if writes and _has_internal_overlap(view[2]):
            raise OverlapError(_OVERLAP.format(name=name))
        for other, other_view, other_writes in views[i + 1:]:
            if (writes or other_writes) and _bytes_meet(view, other_view):
                a, b = (name, other) if writes else (other, name)
                what = "writes both" if writes and other_writes else f"writes {a} and reads {b}"
                raise OverlapError(f"unsupported operation: {a} and {b} share memory (some of their bytes are a "
                                   f"single memory location), and the call {what}. Please clone() one of them.")
    if memo is None:
        return None
    if len(memo) >= _MEMO_MAX:
        memo.clear()
    memo.add(at)
    return at


_OVERLAP = ("unsupported operation: more than one element of the written-to tensor {name} refers to a single "
            "memory location. Please clone() the tensor before performing the operation (or use inplace=False).")
