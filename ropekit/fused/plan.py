"""The fused ops' one path: validate once, make a plan, launch; a repeated call signature goes straight to its plan.

Every fused op (``qk_norm_rope``, ``rope_and_cache``, ``mla_rope_and_cache``, and the engines' signatures through
them) keeps its plans in :data:`ropekit.triton.launch.plans`, the cache ``apply_rope`` uses, under a key that starts
with the op's name (:func:`~ropekit.triton.launch.signature`). A plan is made only after the call was validated; a
hit then does what the call's tensors force and nothing else: the key itself (shapes, strides, dtypes and devices),
the overlap check at the tensors' addresses (skipped at addresses the plan has seen), the outputs, and the launch
with their data pointers.
Validation never reads device values outside check mode, so the signature decides it.
"""

from __future__ import annotations

import torch

from .. import device as _device
from ..triton.launch import PlanCache, plans
from .validate import check_mode, check_overlaps

FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

__all__ = ["planned", "keyed", "reads_callers_memory", "with_outputs", "FusedPlan", "plans"]


def planned(tensors: tuple) -> bool:
    """Whether an eager call takes (and leaves) a plan: the Triton backend for its first tensor (``tensors[0]``, q), not
    compiling, not in check mode (which reads device values on every call), and with grad enabled no tensor requiring
    grad (that call is autograd's)."""
    if _device.backend_for(tensors[0]) != "triton" or torch.compiler.is_compiling() or check_mode():
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and isinstance(t, torch.Tensor) and t.requires_grad:
                return False
    return True


def keyed(op: str, tensors: tuple, flags: tuple) -> tuple[tuple, tuple]:
    """A fused call's plan key (:func:`~ropekit.triton.launch.signature`) and where its tensors lie (their data
    pointers, :func:`ropekit.validate.addresses`), in one pass over its tensors: a planned call needs both, and its
    host time is mostly this pass (most of a fused call's optional tensors are None). The addresses are those of every
    tensor the call passes, read or not (a scale the call's format does not read): a call that brings a fresh unread
    tensor each time finds neither its overlap check nor its launch kept, and takes the full path."""
    key, at = [op], []
    for t in tensors:
        if t is None:
            key.append(None)
        elif isinstance(t, torch.Tensor):  # (tensor_key inline: a call per tensor costs more than it saves)
            index = t.get_device()
            key.append((t.shape, t.stride(), t.dtype, index if index >= 0 else t.device))
            at.append(t.data_ptr())
        else:
            key.append((type(t), t))
    key += flags
    key += map(type, flags)
    return tuple(key), tuple(at)


def reads_callers_memory(derived: tuple, given: tuple) -> bool:
    """Whether what validation derived (tables, positions, slots) lies where the caller's own tensors do: the same
    tensor or a view at the same data pointer (its strides follow from the signature). Not so for a grown table, a
    copy or a padded slot mapping, which a later call would not pass: such calls are not planned."""
    for a, b in zip(derived, given):
        if a is not b and (a is None or not isinstance(b, torch.Tensor) or a.data_ptr() != b.data_ptr()):
            return False
    return True


_CALLS_MAX = 64  # address sets a plan keeps (a decode loop cycles through a few)


def with_outputs(at, *outputs):
    """The key a plan keeps a call's launch by (:meth:`FusedPlan.relaunch`): ``at``, the addresses of the call's
    tensors (:meth:`FusedPlan.check`), then its fresh outputs' (None for an absent one); None stays None."""
    return None if at is None else (at, *[None if out is None else out.data_ptr() for out in outputs])


class FusedPlan:
    """A validated fused call: the kernel's launch (None: nothing to compute) and the overlap facts it recorded.

    ``names``/``written``: the call's tensors as :func:`~ropekit.validate.check_overlaps` takes them; ``checked``:
    the addresses already checked for this signature. ``fp8``: the caches hold e4m3 (their scales are read).
    ``calls``: the launches already made, by the addresses of the call's tensors and outputs (:meth:`relaunch`)."""

    __slots__ = ("launch", "names", "written", "checked", "fp8", "calls")

    def __init__(self, launch, names: tuple, written: tuple, fp8: bool = False):
        self.launch, self.names, self.written, self.fp8 = launch, names, written, fp8
        self.checked: set = set()
        self.calls = PlanCache(_CALLS_MAX)

    def check(self, tensors: tuple, at: tuple | None = None) -> tuple | None:
        """The overlap rule on this call's tensors (in ``names``' order), at their addresses; returns those addresses
        (None while torch.compile traces). ``at``: the addresses of the call's tensors as :func:`keyed` gave them (all
        of the call's, which decide where those checked lie), used instead of reading them again."""
        return check_overlaps(self.names, tensors, self.written, self.checked, at)

    def relaunch(self, at) -> bool:
        """Launch this plan's kernel for a call at ``at`` (the addresses of the call's tensors, then of its
        outputs) if a call at those addresses went through :meth:`launch_at` and Triton's launcher before: True,
        and nothing else to do but the outputs. The kernel's arguments are a function of the signature (the plan's)
        and these addresses alone, so the launcher's arguments are taken as they were: the call derives none of its
        values. False otherwise (launch with :meth:`launch_at`)."""
        relaunch = self.calls.get(at)
        return relaunch is not None and relaunch()

    def launch_at(self, at, *values) -> None:
        """The launch with ``values``, remembered under ``at`` for :meth:`relaunch` where the direct launcher took
        it (``at`` None: not remembered)."""
        relaunch = self.launch.bound(*values)
        if at is not None and relaunch is not None:
            self.calls.put(at, relaunch)

    @staticmethod
    def bytes_of(cache):
        """A cache as the kernel writes it: a float8 one (e4m3, e5m2) as its uint8 bytes, whose rounding is the
        kernel's own, identical on GPU and CPU (a ``torch.uint8`` cache already is bytes)."""
        return cache.view(torch.uint8) if cache is not None and cache.dtype in FLOAT8_DTYPES else cache
