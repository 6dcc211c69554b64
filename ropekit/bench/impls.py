"""Every implementation the benchmark times, each behind one small adapter.

An adapter says whether it can run a case (``supports``: None, or the reason it cannot) and turns one buffer set into
a zero-argument callable (``build``) that does exactly what a user of that library would call, with everything a user
would compute once per model step (per-token cos/sin rows, views) prepared outside it. ``Prepared.outputs`` turns the
callable's result into ``(q_out, k_out)`` in the case's layout for the correctness check.

Kinds: ``ladder`` (ropekit's Triton v1..v4 launchers, called directly), ``ropekit`` (the public API), ``peer``
(what a user would otherwise pick: eager PyTorch, torch.compile, Liger-Kernel, flash-attention). "Ratio to the fastest
peer" is taken over the ``peer`` kind only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from ..layouts import to_bshd
from .cases import Case
from .inputs import CaseData, Tables
from .peers import Peer, load_flash_attn, load_liger

__all__ = ["Prepared", "Impl", "IMPL_NAMES", "PEER_NAMES", "ROPEKIT_NAMES", "make_impls", "hf_formula"]

FORWARD, BACKWARD = "forward", "backward"


@dataclass
class Prepared:
    fn: Callable[[], object]  # the timed call
    outputs: Callable[[object], tuple]  # fn's result -> (q_out, k_out) in the case's layout
    graph_safe: bool = True  # may be captured in a CUDA graph
    inplace: bool = False  # writes into its inputs (decides the bytes of partial rotary)


def to_hf(x: torch.Tensor, layout: str) -> torch.Tensor:
    """transformers' (batch, heads, seq, head_dim) view, as Liger takes it (thd: one packed sequence)."""
    if layout == "thd":
        return x.unsqueeze(0).transpose(1, 2)
    return to_bshd(x, layout).transpose(1, 2)


def from_hf(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "thd":
        return x.transpose(1, 2).squeeze(0)
    return to_bshd(x.transpose(1, 2), layout)


def _with_grad(fn):
    def call():
        with torch.enable_grad():
            return fn()
    return call


def _leaves(data: CaseData):
    return data.q.detach().requires_grad_(True), data.k.detach().requires_grad_(True)


def _autograd_backward(forward: Callable, data: CaseData) -> Prepared:
    """Time ``torch.autograd.grad`` through a graph recorded once (retain_graph: the graph is replayed every call)."""
    q_leaf, k_leaf = _leaves(data)
    with torch.enable_grad():
        out_q, out_k = forward(q_leaf, k_leaf)
    fn = functools.partial(torch.autograd.grad, (out_q, out_k), (q_leaf, k_leaf), (data.grad_q, data.grad_k),
                           retain_graph=True)
    # a CUDA graph captures the backward when the forward ran on the capturing stream (the runner's side stream)
    return Prepared(fn, lambda r: (r[0], r[1]))


class Impl:
    name = ""
    label = ""
    kind = "peer"
    directions = (FORWARD, BACKWARD)
    # Exceptions by which this implementation declines an input it does not support (checked before any write):
    # the runner reports those as "skipped" with the message, any other exception as an error.
    declines_with: tuple[type[BaseException], ...] = ()

    def available(self) -> str | None:
        """None, or why this implementation cannot run at all in this process."""
        return None

    def supports(self, case: Case, direction: str) -> str | None:
        if direction not in self.directions:
            return "no backward pass" if direction == BACKWARD else f"no {direction} pass"
        return self._supports(case, direction)

    def _supports(self, case: Case, direction: str) -> str | None:
        return None

    def build(self, case: Case, tables: Tables, data: CaseData, direction: str) -> Prepared:
        raise NotImplementedError

    def info(self) -> dict:
        return {}


# --------------------------------------------------------------------------------------------------------------------
# ropekit's Triton ladder, launchers called directly
# --------------------------------------------------------------------------------------------------------------------

class TritonLadder(Impl):
    """v1..v3: one tensor per launch, NeoX, whole head, positions 0..S-1 (v1: contiguous bshd only)."""

    kind = "ladder"
    directions = (FORWARD,)
    declines_with = (ValueError, TypeError, NotImplementedError)  # each rung's launcher names what it lacks

    def __init__(self, version: int):
        self.version = version
        self.name = f"triton-v{version}"
        self.label = f"ropekit Triton v{version} (launcher)"
        self._launcher = None

    def available(self) -> str | None:
        try:
            module = importlib.import_module(f"ropekit.triton.v{self.version}")
            self._launcher = getattr(module, f"rope_v{self.version}")
        except (ImportError, AttributeError) as error:
            return f"ropekit.triton.v{self.version}.rope_v{self.version} not importable ({error})"
        return None

    def _supports(self, case, direction):
        if case.interleaved:
            return "NeoX pairing only"
        if case.partial:
            return "whole-head rotation only"
        if case.positions != "none" or case.layout == "thd":
            return "positions 0..S-1 only"
        if self.version == 1 and case.dtype != torch.float32:
            return "float32 only (half precision arrives in v2)"
        if self.version == 1 and not (case.layout == "bshd" or case.batch == 1):
            return "contiguous (batch, seq, heads, head_dim) only"
        return None  # anything else the launcher declines with a ValueError naming the argument

    def build(self, case, tables, data, direction):
        q4, k4 = to_bshd(data.q, case.layout), to_bshd(data.k, case.layout)
        if self.version == 1:
            q4, k4 = q4.contiguous(), k4.contiguous()  # sbhd with batch 1 is contiguous bshd already: no copy
        cos, sin = tables.cos_half[: case.seqlen], tables.sin_half[: case.seqlen]  # rows 0..S-1 (contiguous)
        # Outputs preallocated (as for triton-v4: these rows time kernels) and poisoned, so unwritten elements show.
        out_q, out_k = torch.full_like(q4, float("nan")), torch.full_like(k4, float("nan"))
        launch = self._launcher

        def fn():
            launch(q4, cos, sin, out=out_q)
            launch(k4, cos, sin, out=out_k)
        return Prepared(fn, lambda _: (to_bshd(out_q, case.layout), to_bshd(out_k, case.layout)))


class TritonV4(Impl):
    """The v4 launcher with preallocated outputs: the kernel without the API's validation and allocation."""

    name = "triton-v4"
    label = "ropekit Triton v4 (launcher, preallocated out)"
    kind = "ladder"

    def _supports(self, case, direction):
        return None

    def build(self, case, tables, data, direction):
        from ..positions import resolve_positions
        from ..triton.launch import rope_v4

        backward = direction == BACKWARD
        x_q, x_k = (data.grad_q, data.grad_k) if backward else (data.q, data.k)
        inplace = bool(case.inplace) and not backward
        out_q, out_k = (x_q, x_k) if inplace else (torch.full_like(x_q, float("nan")),
                                                   torch.full_like(x_k, float("nan")))
        if case.layout == "thd":
            batch, seqlen = case.batch, case.n_tokens
        else:
            batch, seqlen = case.batch, case.seqlen
        spec = resolve_positions(batch=batch, seqlen=seqlen, positions=tables.offsets,
                                 cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen, device=x_q.device)
        fn = functools.partial(
            rope_v4, to_bshd(x_q, case.layout), to_bshd(x_k, case.layout), tables.cos_half, tables.sin_half,
            out_q=to_bshd(out_q, case.layout), out_k=to_bshd(out_k, case.layout), positions=spec,
            rotary_dim=case.rotary, interleaved=case.interleaved, conjugate=backward, copy_tail=not inplace)
        return Prepared(fn, lambda _: (out_q, out_k), inplace=inplace)


# --------------------------------------------------------------------------------------------------------------------
# The public API
# --------------------------------------------------------------------------------------------------------------------

class RopekitAPI(Impl):
    """``ropekit.apply_rope``: validation + (eager) the launcher, (autograd) the custom op."""

    kind = "ropekit"

    def __init__(self, name: str, label: str, *, backend: str = "triton", inplace: bool = False,
                 record_autograd: bool = False, follow_case_mode: bool = False):
        self.name, self.label = name, label
        self.backend = backend
        self.inplace = inplace
        self.record_autograd = record_autograd  # forward with q/k requiring grad (the custom op + autograd record)
        self.follow_case_mode = follow_case_mode  # one entry that runs in place exactly when the case asks for it
        self.directions = (FORWARD,) if (inplace or record_autograd) else (FORWARD, BACKWARD)
        # the CUDA backend may decline varlen thd with a NotImplementedError (clarifications: "CUDA variant")
        self.declines_with = (NotImplementedError,) if backend == "cuda" else ()
        self._probe_error = None
        self._probed = False

    def available(self) -> str | None:
        if self.backend == "triton":
            return None
        if not self._probed:
            self._probed = True
            self._probe_error = _probe_cuda_backend()
        return self._probe_error

    def _mode(self, case) -> bool:
        return bool(case.inplace) if self.follow_case_mode else self.inplace

    def _supports(self, case, direction):
        if case.group == "sweep" and (self.inplace or self.record_autograd):
            return "an API variant of the same kernel; the sweep times the default call"
        if case.inplace is not None and self._mode(case) != case.inplace:
            return "in place only" if self._mode(case) else "out of place only"
        return None

    def _kwargs(self, case, tables):
        return dict(positions=tables.offsets, layout=case.layout, interleaved=case.interleaved,
                    rotary_dim=case.rotary, cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen,
                    backend=self.backend)

    def build(self, case, tables, data, direction):
        from ..api import apply_rope

        kwargs = self._kwargs(case, tables)
        cos, sin = tables.cos_half, tables.sin_half
        if direction == BACKWARD:
            return _autograd_backward(lambda q, k: apply_rope(q, k, cos, sin, **kwargs), data)
        if self.record_autograd:
            q_leaf, k_leaf = _leaves(data)
            fn = _with_grad(functools.partial(apply_rope, q_leaf, k_leaf, cos, sin, **kwargs))
            # what this row is about is the host cost of the custom op + autograd record: eager and do_bench clocks
            return Prepared(fn, lambda r: (r[0].detach(), r[1].detach()), graph_safe=False)
        inplace = self._mode(case)
        fn = functools.partial(apply_rope, data.q, data.k, cos, sin, inplace=inplace, **kwargs)
        return Prepared(fn, lambda r: (r[0], r[1]), inplace=inplace)


class RopekitRows(RopekitAPI):
    """``apply_rope(per_token=True, inplace=True)`` on the inputs Liger gets: per-token cos/sin rows in q's dtype
    (transformers' layout, gathered by position before the call) instead of the table and positions. The same
    contract as Liger's call, so the two rows compare like with like; the ``ropekit`` rows also look positions up."""

    def __init__(self):
        super().__init__("ropekit-rows", "ropekit.apply_rope(per_token=True, inplace=True): Liger's inputs",
                         inplace=True)

    def build(self, case, tables, data, direction):
        from ..api import apply_rope

        fn = functools.partial(apply_rope, data.q, data.k, tables.cos_rows, tables.sin_rows, per_token=True,
                               inplace=True, layout=case.layout, interleaved=case.interleaved,
                               cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen)
        return Prepared(fn, lambda r: (r[0], r[1]), inplace=True)


def _probe_cuda_backend() -> str | None:
    """Build ropekit's CUDA extension (first use compiles it) and run it once on a tiny input."""
    try:
        from .. import device
        if device.DEVICE != "cuda":
            return "no CUDA device"
        from ..api import apply_rope
        from ..frequencies import cos_sin_table

        q = torch.randn(1, 4, 2, 64, device="cuda", dtype=torch.float16)
        k = torch.randn(1, 4, 1, 64, device="cuda", dtype=torch.float16)
        cos, sin = cos_sin_table(8, 64, device="cuda")
        apply_rope(q, k, cos, sin, backend="cuda")
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001  (a failed build is "not available", with its reason)
        message = str(error).strip().splitlines()
        return f"ropekit.cuda unavailable: {type(error).__name__}: {message[-1] if message else ''}"[:400]
    return None


# --------------------------------------------------------------------------------------------------------------------
# Peers: eager PyTorch (transformers' formula), torch.compile of it, Liger-Kernel, flash-attention
# --------------------------------------------------------------------------------------------------------------------

def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_every_two(x):
    # GPT-J's pairing: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def hf_formula(rotary_dim: int, head_dim: int, interleaved: bool, unsqueeze_dim: int):
    """transformers' ``apply_rotary_pos_emb`` (Llama; GPT-J's ``rotate_every_two`` when interleaved; partial rotary
    as GPT-NeoX/Phi write it), with full-width per-token cos/sin rows missing the head axis."""
    rotate = _rotate_every_two if interleaved else _rotate_half

    if rotary_dim < head_dim:
        def apply_rotary_pos_emb(q, k, cos, sin):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
            k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
            q_embed = torch.cat(((q_rot * cos) + (rotate(q_rot) * sin), q_pass), dim=-1)
            k_embed = torch.cat(((k_rot * cos) + (rotate(k_rot) * sin), k_pass), dim=-1)
            return q_embed, k_embed
    else:
        def apply_rotary_pos_emb(q, k, cos, sin):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            q_embed = (q * cos) + (rotate(q) * sin)
            k_embed = (k * cos) + (rotate(k) * sin)
            return q_embed, k_embed
    return apply_rotary_pos_emb


def _head_axis(layout: str) -> int:
    return 1 if layout == "thd" else 2


class TorchEager(Impl):
    name = "torch-eager"
    label = "eager PyTorch (transformers' formula)"

    def _supports(self, case, direction):
        if case.inplace:
            return "out of place only (transformers' formula)"
        return None

    def _formula(self, case):
        return hf_formula(case.rotary, case.head_dim, case.interleaved, _head_axis(case.layout))

    def build(self, case, tables, data, direction):
        formula = self._formula(case)
        cos, sin = tables.cos_rows, tables.sin_rows
        if direction == BACKWARD:
            return _autograd_backward(lambda q, k: formula(q, k, cos, sin), data)
        return Prepared(functools.partial(formula, data.q, data.k, cos, sin), lambda r: (r[0], r[1]))


class TorchCompile(TorchEager):
    """``torch.compile(fullgraph=True)`` of the same formula: static shapes per main case (dynamo is reset between
    cases, as a model compiled for one shape), ``dynamic=True`` across the sweep (one compile for the whole grid)."""

    name = "torch-compile"
    label = "torch.compile of the eager formula"

    def __init__(self):
        self._compiled = {}

    def _formula(self, case):
        dynamic = case.group == "sweep"
        key = f"sweep/{case.layout}/{case.rotary}/{case.head_dim}/{case.interleaved}" if dynamic else case.name
        if key not in self._compiled:
            staying_in_sweep = dynamic and self._compiled and all(k.startswith("sweep/") for k in self._compiled)
            if not staying_in_sweep:
                torch._dynamo.reset()  # forget other cases' graphs: no recompile limit, no stale specialisation
                self._compiled.clear()
            _raise_recompile_limit()
            self._compiled[key] = torch.compile(super()._formula(case), dynamic=dynamic, fullgraph=True)
        return self._compiled[key]


def _raise_recompile_limit():
    import torch._dynamo.config as config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))


class PeerImpl(Impl):
    """A peer loaded lazily from the peers folder: unavailable (with the loader's reason) when it is not there."""

    loader = None  # a function (peers_directory) -> Peer
    required = ()  # attribute names the peer module must have
    missing = ""  # the reason given when one of them is absent

    def __init__(self, peer: Peer | None = None, peers_directory=None):
        self._peer = peer
        self._dir = peers_directory

    @property
    def peer(self) -> Peer:
        if self._peer is None:
            self._peer = type(self).loader(self._dir)
        return self._peer

    def available(self):
        if self.peer.reason:
            return self.peer.reason
        if not all(hasattr(self.peer.module, name) for name in self.required):
            return self.missing
        return None

    def info(self):
        return dict(self.peer.info)


class Liger(PeerImpl):
    name = "liger"
    label = "Liger-Kernel (LigerRopeFunction)"
    loader = staticmethod(load_liger)
    required = ("LigerRopeFunction", "rope_backward")
    missing = "liger_kernel.ops.rope has no LigerRopeFunction / rope_backward"

    def _supports(self, case, direction):
        if case.interleaved:
            return "NeoX pairing only"
        if case.partial and case.inplace is False:
            return "in place only (moves only the rotary part, unlike this out-of-place case)"
        if case.partial and not _accepts_rotary_dim(self.peer.module):
            return "this Liger version has no partial rotary"
        return None

    def _rows(self, case, tables):
        # Liger takes (1 or batch, seq, R) rows; sbhd rows (s, 1, R) are the same memory as (1, s, R).
        cos, sin = tables.cos_rows, tables.sin_rows
        if case.layout == "sbhd":
            return cos.transpose(0, 1), sin.transpose(0, 1)
        if case.layout == "thd":
            return cos.unsqueeze(0), sin.unsqueeze(0)
        return cos, sin

    def build(self, case, tables, data, direction):
        module = self.peer.module
        cos, sin = self._rows(case, tables)
        outputs = lambda r: (from_hf(r[0], case.layout), from_hf(r[1], case.layout))  # noqa: E731
        # Liger rotates the storage of transformers' (b, h, s, d) view in place when that storage is contiguous bshd;
        # otherwise (sbhd with batch > 1) it rotates a contiguous copy.
        inplace = case.layout != "sbhd" or case.batch == 1
        if direction == BACKWARD:
            fn = functools.partial(module.rope_backward, to_hf(data.grad_q, case.layout),
                                   to_hf(data.grad_k, case.layout), cos, sin)
            return Prepared(fn, outputs, inplace=inplace)
        fn = functools.partial(module.LigerRopeFunction.apply, to_hf(data.q, case.layout), to_hf(data.k, case.layout),
                               cos, sin)
        return Prepared(fn, outputs, inplace=inplace)


def _accepts_rotary_dim(module) -> bool:
    try:
        return "rotary_dim" in inspect.signature(module.rope_forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False


class FlashAttn(PeerImpl):
    name = "flash-attn"
    label = "flash-attention Triton apply_rotary (file from .peers)"
    loader = staticmethod(load_flash_attn)
    required = ("apply_rotary",)
    missing = "the flash-attention file has no apply_rotary"

    def build(self, case, tables, data, direction):
        apply_rotary = self.peer.module.apply_rotary
        backward = direction == BACKWARD
        x_q, x_k = (data.grad_q, data.grad_k) if backward else (data.q, data.k)
        inplace = bool(case.inplace) and not backward
        kwargs = dict(seqlen_offsets=tables.offsets if tables.offsets is not None else 0,
                      cu_seqlens=tables.cu_seqlens, max_seqlen=tables.max_seqlen, interleaved=case.interleaved,
                      inplace=inplace, conjugate=backward)
        q4, k4 = to_bshd(x_q, case.layout), to_bshd(x_k, case.layout)
        cos, sin = tables.cos_half, tables.sin_half

        def fn():  # flash-attention's apply_rotary takes one tensor: q, then k
            return apply_rotary(q4, cos, sin, **kwargs), apply_rotary(k4, cos, sin, **kwargs)
        return Prepared(fn, lambda r: (to_bshd(r[0], case.layout), to_bshd(r[1], case.layout)), inplace=inplace)


# --------------------------------------------------------------------------------------------------------------------

def make_impls(peers_directory=None) -> list[Impl]:
    """Every implementation, in table order (the ladder, ropekit's API, then the peers)."""
    return [
        TritonLadder(1), TritonLadder(2), TritonLadder(3), TritonV4(),
        RopekitAPI("ropekit", "ropekit.apply_rope (Triton v4)"),
        RopekitAPI("ropekit-inplace", "ropekit.apply_rope(inplace=True)", inplace=True),
        RopekitRows(),
        RopekitAPI("ropekit-autograd", "ropekit.apply_rope, q/k requiring grad (custom op)", record_autograd=True),
        RopekitAPI("ropekit-cuda", "ropekit.apply_rope(backend='cuda')", backend="cuda", follow_case_mode=True),
        TorchEager(), TorchCompile(),
        Liger(peers_directory=peers_directory), FlashAttn(peers_directory=peers_directory),
    ]


IMPL_NAMES = tuple(impl.name for impl in make_impls())
PEER_NAMES = tuple(impl.name for impl in make_impls() if impl.kind == "peer")
ROPEKIT_NAMES = ("ropekit", "ropekit-inplace", "ropekit-rows")  # "ropekit's best path" in the targets table
