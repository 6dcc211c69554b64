"""Launching v4: the launch table, plans, and the direct-launch fast path.

Data reaches the kernel through three steps, each a name here:

* :func:`launch_config` — the launch table: block sizes and switches for a shape (:class:`LaunchConfig`);
* :func:`plan_v4` — a :class:`V4Launch`: everything a launch derives from shapes, strides, dtypes and switches (grid,
  integer arguments, constexprs), made once per call signature and kept in :data:`plans` by ``ropekit.api``;
* :meth:`V4Launch.__call__` — the launch itself: the tensors' data pointers and the position offset, through the
  direct-launch cache that calls Triton's compiled runner (``_call_compiled``: the one place that touches Triton's
  and torch's private launch surface).

:func:`rope_v4` does all three for one call. It trusts its caller (``ropekit.api`` validates). Tools that measure
other launch configurations pass ``config=`` to :func:`rope_v4`, or wrap public calls in :func:`forced_config`;
:func:`recorded_launches` lists the launches a workload would make without running them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import NamedTuple

import torch
import triton.language as tl

from .. import device as _device
from ..positions import POSITION_IDS, PositionSpec
from .v4 import rope_v4_kernel

__all__ = ["LaunchConfig", "launch_config", "FLAT_PATH", "forced_config", "rope_v4", "plan_v4", "V4Launch",
           "PlanCache", "plans", "LaunchRecord", "recorded_launches"]

log = logging.getLogger("ropekit")


# --------------------------------------------------------------------------------------------------------------------
# The launch table.
# --------------------------------------------------------------------------------------------------------------------

class LaunchConfig(NamedTuple):
    """How v4 covers a call: the tile, or the flat path where the call allows it (docs/tuning.md#launch-table)."""

    block_s: int  # tokens per program
    block_h: int  # heads per program (with fused_qk: the q tile, at least q's head count)
    num_warps: int
    fused_qk: bool = False  # one program takes all heads of q and of k for its tokens (cos/sin fetched once)
    evict_first: bool = False  # streaming cache hint on q/k loads and stores
    # elements a program of the flat path (``ropekit.triton.v4_flat``) when q, k and the outputs are contiguous and
    # rotate over the whole head with table positions (0: tiles always), and its warps
    flat: int = 0
    flat_warps: int = 8
    # the flat path takes the same block of q and of k in one program (when they have the same shape)
    flat_paired: bool = False
    # the streaming cache hint on the flat path's q/k loads and stores (the tiles follow evict_first)
    flat_streaming: bool = True


def _next_pow2(n: int) -> int:
    # plain Python on the host path: triton.next_power_of_2 / triton.cdiv are constexpr functions in some Triton
    # versions and cost microseconds per call from host code
    return 1 << (max(n, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=4096)
def _fits_int32(*shapes_and_strides) -> bool:
    """Whether every in-kernel offset (relative to each view's own data pointer) stays below 2**31."""
    return all(sum((n - 1) * abs(st) for n, st in zip(shape, strides) if n > 0) < 2**31
               for shape, strides in zip(shapes_and_strides[::2], shapes_and_strides[1::2]))


# The flat path for prefill-sized work, by (element size, whether k has q's shape): LaunchConfig fields
# (docs/tuning.md#flat-path). 16-bit: blocks of 2048 elements of q, then of k, no cache hint (the compiler's order of
# an element's load and its partner's decides which hint a line gets; docs/tuning.md#eviction-hints). fp32 with k of
# q's shape: blocks of 512 elements of q and k together (paired). fp32 otherwise (GQA, k absent): blocks of 1024
# elements of q, then of k; 512 would leave a thread two 8-byte accesses of a single stream.
_FLAT_16BIT = dict(flat=2048, flat_warps=8, flat_streaming=False)
FLAT_PATH = {(2, True): _FLAT_16BIT, (2, False): _FLAT_16BIT,
             (4, True): dict(flat=512, flat_warps=8, flat_paired=True, flat_streaming=False),
             (4, False): dict(flat=1024, flat_warps=8, flat_streaming=False)}

# Largest fused tile (BLOCK_S tokens x all q and k heads x head_dim, padded) kept in registers: 32 values a thread
# at 32 warps. Beyond it (very many or very wide heads) a program takes one head block of q or of k.
_FUSED_TILE_MAX = 32768


@functools.lru_cache(maxsize=1024)
def launch_config(n_tokens: int, n_heads_q: int, n_heads_k: int, head_dim: int, rotary_dim: int,
                  cos_per_token: bool = False, element_size: int = 2,
                  interpreted: bool | None = None) -> LaunchConfig:
    """The launch table: block sizes for a call's shape, chosen by measurement on an H100
    (docs/tuning.md#launch-table).

    * Prefill-sized work (4096 tokens or more) in fp16/bf16/fp32 takes the flat path where the call allows it (NeoX,
      contiguous, out of place; :data:`FLAT_PATH`).
    * Otherwise two tokens per program holding every q and k head (``fused_qk``: all loads issued before any store,
      cos/sin fetched once per token), streaming cache hint, 16 warps, or 32 when a thread would hold more than 48
      bytes of the tile at 16 warps (fewer registers a thread, full occupancy).
    * Small prefills want a few heads per program (fewer, fuller programs); with per-token cos/sin rows one token
      and every head. A decode step takes one token x 8 heads.
    * Under the interpreter every program costs Python overhead, so tiles are as large as the shape allows.

    ``interpreted``: whose table to read, the interpreter's (True) or a GPU's (False, on any machine: for tools that
    model or count the GPU's launches); None: this process's (``ropekit.device.INTERPRET``).
    """
    n_heads = max(n_heads_q, n_heads_k)
    if _device.INTERPRET if interpreted is None else interpreted:
        return LaunchConfig(min(_next_pow2(n_tokens), 16), min(_next_pow2(n_heads), 8), 4)
    if n_tokens >= 4096:
        per_token = (_next_pow2(n_heads_q) + (_next_pow2(n_heads_k) if n_heads_k else 0)) * _next_pow2(head_dim)
        if 2 * per_token <= _FUSED_TILE_MAX:
            bytes_per_thread_at_16_warps = 2 * per_token * element_size // (16 * 32)
            return LaunchConfig(2, 1, 32 if bytes_per_thread_at_16_warps > 48 else 16, fused_qk=True,
                                evict_first=True, **FLAT_PATH.get((element_size, n_heads_k == n_heads_q), {}))
        if per_token <= _FUSED_TILE_MAX:
            return LaunchConfig(1, 1, 16, fused_qk=True, evict_first=True)
        return LaunchConfig(16, 1, 8, evict_first=True)
    if n_tokens > 128:
        if cos_per_token:
            return LaunchConfig(1, min(_next_pow2(n_heads), 32), 4)
        return LaunchConfig(2, min(_next_pow2(n_heads), 16), 4)
    return LaunchConfig(1, min(_next_pow2(n_heads), 8), 4)


_forced: LaunchConfig | None = None


@contextlib.contextmanager
def forced_config(config: LaunchConfig | None):
    """Every v4 launch inside the block uses ``config`` instead of :func:`launch_config` (None: the table), whichever
    way it is reached (``apply_rope``, the module, autograd). For tools that measure or stress launch configurations
    through the public API; a direct :func:`rope_v4` call takes ``config=`` instead. Plans are forgotten on entry and
    on exit, so no plan made under one configuration serves a call under another."""
    global _forced
    saved = _forced
    _forced = config
    plans.clear()
    try:
        yield
    finally:
        _forced = saved
        plans.clear()


# --------------------------------------------------------------------------------------------------------------------
# Launching: the direct-launch cache and Triton's compiled runner.
# --------------------------------------------------------------------------------------------------------------------

# Triton's JIT entry point re-derives the specialisation of every argument in Python on every call, which is most of
# a decode step's host time (docs/tuning.md#direct-launch). After the first launch of a given specialisation the
# compiled kernel's runner is kept and called directly. The key holds everything Triton specialises on: the static
# part of a launch (grid, integer arguments but the position offset, constexprs, warps, pointer dtypes:
# ``V4Launch.key``), the 16-byte alignment of the pointers, and the specialisation class of the position offset,
# which changes every decode step.
_direct_launchers: dict = {}
_OFFSET_ARG = 5  # index of the position offset (passed + 1) among the integer arguments
_N_POINTERS = 8  # the kernel's tensor arguments come first


def _int_class(value: int) -> tuple:
    return (value == 1, value % 16 == 0, -2**31 <= value < 2**31)


def _static_key(grid, ints, constexprs, num_warps, dtypes) -> tuple:
    return (grid, num_warps, tuple(constexprs.values()), ints[:_OFFSET_ARG], ints[_OFFSET_ARG + 1:], dtypes)


def _launch(grid, pointers, ints, constexprs, num_warps, static_key):
    """Launch ``rope_v4_kernel`` through the direct-launch cache. ``static_key``: ``V4Launch.key``."""
    if _device.INTERPRET:
        with _device.INTERPRETER_LOCK:
            rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
        return
    aligned = 0  # bit i: pointer i is 16-byte aligned (Triton specialises on it)
    for pointer in pointers:
        aligned = (aligned << 1) | (pointer is not None and pointer.data_ptr() % 16 == 0)
    key = (static_key, _int_class(ints[_OFFSET_ARG]), aligned)
    entry = _direct_launchers.get(key)
    if entry is None:
        compiled = rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
        if len(_direct_launchers) > 4096:
            _direct_launchers.clear()
        _direct_launchers[key] = [compiled[grid], None]  # the argument convention is learnt on the next call
        return
    _call_compiled(entry, grid, pointers, ints, constexprs, num_warps)


class LaunchRecord(NamedTuple):
    """One launch that :func:`recorded_launches` held back: the kernel's arguments as the launch would pass them."""

    grid: tuple
    pointers: tuple  # tensors, or None where the argument is absent
    ints: tuple  # by the kernel's parameter order (see :meth:`V4Launch.arguments` for names)
    constexprs: dict
    num_warps: int


_gpu_table = False  # inside recorded_launches(gpu_table=True): plans read a GPU's launch table


@contextlib.contextmanager
def recorded_launches(gpu_table: bool = False):
    """Inside the block no v4 kernel runs: every launch, however it is reached (``apply_rope`` with the Triton
    backend, autograd, a plan), is appended to the list this yields as a :class:`LaunchRecord`. For tools that count
    the kernel variants a workload compiles without running it; the direct-launch cache learns nothing meanwhile.
    ``gpu_table``: plan with a GPU's launch table even under the interpreter (what a GPU would compile). Plans are
    forgotten on entry and on exit, so no plan made under one table serves a call under the other."""
    global _launch, _gpu_table
    records: list = []
    real, saved_table = _launch, _gpu_table

    def record(grid, pointers, ints, constexprs, num_warps, static_key):
        records.append(LaunchRecord(grid, tuple(pointers), tuple(ints), dict(constexprs), num_warps))

    _launch, _gpu_table = record, gpu_table
    plans.clear()
    try:
        yield records
    finally:
        _launch, _gpu_table = real, saved_table
        plans.clear()


def _stream_getter():
    """The current CUDA stream as Triton's launcher takes it, read the way Triton reads it (None: let Triton do it)."""
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    get_device = getattr(torch._C, "_cuda_getDevice", None)
    if raw_stream is None or get_device is None:
        return None
    return lambda: raw_stream(get_device())


_current_stream = _stream_getter()


def _call_compiled(entry: list, grid, pointers, ints, constexprs, num_warps) -> None:
    """Call a compiled kernel's runner (``compiled[grid]``) directly: the one place that relies on surfaces Triton and
    torch do not document.

    * The argument convention: Triton versions differ in whether the runner takes the constexpr arguments (3.6 does
      not, later versions do). ``entry[1]`` remembers it once learnt: a wrong count is rejected by the runner's
      argument parser before anything runs, so trying both is safe. Should neither work, the launch goes through
      the JIT entry point from then on (``"jit"``: correct, only slower).
    * The stream: the runner is handed the current stream read through ``torch._C``, the way Triton reads it, which
      skips the runner's own device and stream lookups (``_current_stream`` is None where torch lacks those).
    """
    runner, with_constexprs = entry
    if with_constexprs is None:
        for convention in (True, False):
            try:
                _call_compiled([runner, convention], grid, pointers, ints, constexprs, num_warps)
            except TypeError:
                continue
            entry[1] = convention
            return
        entry[1] = with_constexprs = "jit"
    if with_constexprs == "jit":
        rope_v4_kernel[grid](*pointers, *ints, **constexprs, num_warps=num_warps)
        return
    args = (*pointers, *ints, *constexprs.values()) if with_constexprs else (*pointers, *ints)
    if _current_stream is None:
        runner(*args)
    else:
        runner(*args, stream=_current_stream())


# --------------------------------------------------------------------------------------------------------------------
# Plans.
# --------------------------------------------------------------------------------------------------------------------

class V4Launch:
    """One fully specialised launch of v4: everything :func:`rope_v4` derives from shapes, strides, dtypes and
    switches. Calling it with the tensors (whose data pointers may change from call to call) and the position offset
    launches the kernel; ``ropekit.api`` keeps one per call signature in :data:`plans`, so a repeated eager call (a
    decode step) skips validation and this derivation."""

    __slots__ = ("grid", "ints_head", "ints_tail", "constexprs", "num_warps", "key", "in_place")

    def __init__(self, grid, ints, constexprs, num_warps, dtypes):
        self.grid, self.constexprs, self.num_warps = grid, constexprs, num_warps
        self.in_place = constexprs["IN_PLACE"]
        self.ints_head, self.ints_tail = ints[:_OFFSET_ARG], ints[_OFFSET_ARG + 1:]
        self.key = _static_key(grid, ints, constexprs, num_warps, dtypes)

    @staticmethod
    def pointers(q, k, out_q, out_k, cos, sin, positions, cu_seqlens, in_place: bool = False) -> tuple:
        """The kernel's eight pointer arguments; an absent k is stood in for by q (the kernel's HAS_K skips it),
        absent positions and cu_seqlens are None (constants to Triton: not passed), and so are the outputs of an
        in-place launch (the kernel writes through q and k)."""
        if in_place:
            return q, k if k is not None else q, None, None, cos, sin, positions, cu_seqlens
        return (q, k if k is not None else q, out_q, out_k if out_k is not None else out_q, cos, sin, positions,
                cu_seqlens)

    def arguments(self, position_offset: int = 0) -> dict:
        """The integer arguments a launch at ``position_offset`` passes, by the kernel's parameter names (for tools and
        tests that inspect a plan; 1 means Triton's constant, not passed)."""
        ints = (*self.ints_head, position_offset + 1, *self.ints_tail)
        return dict(zip(rope_v4_kernel.arg_names[_N_POINTERS:_N_POINTERS + len(ints)], ints))

    def __call__(self, q, k, out_q, out_k, cos, sin, positions, cu_seqlens, position_offset: int) -> None:
        """q/k/out/cos/sin/positions/cu_seqlens: the tensors the plan was made for, or any with the same shapes,
        strides and dtypes (views count: only their data pointers are read); k, positions and cu_seqlens may be
        None when the plan was made without them. A plan made in place (outputs that are q and k) writes through q
        and k whatever outputs it is given."""
        _launch(self.grid, self.pointers(q, k, out_q, out_k, cos, sin, positions, cu_seqlens, self.in_place),
                (*self.ints_head, position_offset + 1, *self.ints_tail), self.constexprs, self.num_warps, self.key)


class PlanCache(dict):
    """Plans by call signature (bounded): the launcher layer's one plan cache (docs/tuning.md#plan-cache). ``get`` is
    ``dict.get`` (the eager hot path pays a dictionary lookup and nothing more); :meth:`put` forgets everything once it
    is full."""

    def __init__(self, max_plans: int):
        super().__init__()
        self.max_plans = max_plans

    def put(self, key, plan):
        if len(self) >= self.max_plans:
            self.clear()
        self[key] = plan
        return plan


plans = PlanCache(1024)

_MATH_DTYPE = {torch.float64: tl.float64}


def rope_v4(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
            out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
            interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
            copy_tail: bool = True, eager_rounding: bool = False, config: LaunchConfig | None = None) -> None:
    """Launch v4. q/k/out are 4-D ``(batch, seq, heads, head_dim)`` views with any strides, or 3-D ``(tokens, heads,
    head_dim)`` when ``positions.is_varlen``. cos/sin: ``(table_len, rotary_dim/2)`` tables, or with
    ``cos_per_token`` full-width rows ``(batch, seq, rotary_dim)`` (``(tokens, rotary_dim)`` for varlen).

    The launcher trusts its caller (``ropekit.api`` validates); it only normalises shapes and picks block sizes.
    ``config`` forces a :class:`LaunchConfig` instead of :func:`launch_config`'s (tuning and reliability tools).
    """
    plan = plan_v4(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=positions, rotary_dim=rotary_dim,
                   interleaved=interleaved, conjugate=conjugate, cos_per_token=cos_per_token, copy_tail=copy_tail,
                   eager_rounding=eager_rounding, config=config)
    if plan is not None:
        plan(q, k, out_q, out_k, cos, sin, positions.tensor, positions.cu_seqlens, positions.offset)
def plan_v4(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
            out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
            interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
            copy_tail: bool = True, eager_rounding: bool = False,
            config: LaunchConfig | None = None) -> V4Launch | None:
    """The :class:`V4Launch` for :func:`rope_v4`'s arguments (None when there is nothing to do)."""
    if positions.is_varlen:
        q, out_q = q.unsqueeze(0), out_q.unsqueeze(0)
        if k is not None:
            k, out_k = k.unsqueeze(0), out_k.unsqueeze(0)
        n_batch = positions.cu_seqlens.shape[0] - 1
        seqlen = positions.max_seqlen
        if cos_per_token:
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    else:
        n_batch, seqlen = q.shape[0], q.shape[1]
    head_dim = q.shape[-1]
    n_heads_q = q.shape[2]
    n_heads_k = k.shape[2] if k is not None else 0
    n_tokens = n_batch * seqlen
    if config is None:
        config = _forced if _forced is not None else launch_config(
            n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token, q.element_size(),
            False if _gpu_table else None)
    contiguous = all(t.is_contiguous() for t in (q, k, out_q, out_k) if t is not None)
    in_place = _same_view(q, out_q) and (k is None or _same_view(k, out_k))
    flat = config.flat if _flat_applies(q, k, out_q, out_k, contiguous, positions, rotary_dim, interleaved,
                                        cos_per_token, eager_rounding) else 0
    block_h = config.block_h
    paired = bool(flat) and config.flat_paired and (k is None or k.shape == q.shape)
    if flat:
        # one grid axis: the flat path's blocks of q, then of k (n_head_blocks_q tells the kernel where k begins),
        # or blocks of q and k together
        n_head_blocks_q = _cdiv(n_tokens * n_heads_q * head_dim, flat)
        grid = (n_head_blocks_q + (0 if paired else _cdiv(n_tokens * n_heads_k * head_dim, flat)), 1, 1)
    else:
        if config.fused_qk:
            # the q and k tiles cover every head: one program per token block
            block_h = max(block_h, _next_pow2(n_heads_q))
            n_head_blocks_q, n_head_blocks_k = 1, 0
        else:
            n_head_blocks_q, n_head_blocks_k = _cdiv(n_heads_q, block_h), _cdiv(n_heads_k, block_h)
        grid = (_cdiv(seqlen, config.block_s), n_head_blocks_q + n_head_blocks_k, n_batch)
    if grid[0] == 0 or n_batch == 0 or (q.numel() == 0 and (k is None or k.numel() == 0)):
        return None
    if n_batch > 65535:
        # sequences sit on the grid's third axis, which CUDA caps at 65535
        raise ValueError(f"v4 handles at most 65535 sequences per launch (grid axis 2), got {n_batch}")
    # Integer arguments a launch does not read are passed as 1, which Triton specialises into a constant (1 is not
    # passed at all), and absent tensors as None: graph replay pays for every byte of arguments
    # (docs/tuning.md#lean-launch).
    # DENSE: contiguous q, k and outputs, and a contiguous table of rotary_dim / 2 columns; the kernel derives
    # their strides (docs/tuning.md#dense-strides).
    dense = contiguous and (cos_per_token or (cos.is_contiguous() and sin.is_contiguous()
                                              and cos.shape[1] == rotary_dim // 2))
    if cos_per_token:
        cos_strides = (0 if positions.is_varlen else cos.stride(0), cos.stride(1), cos.stride(2))
        table_len = 1  # not read
    else:
        cos_strides = (1, 1, 1) if dense else (1, cos.stride(0), cos.stride(1))  # a table has no batch axis
        table_len = cos.shape[0]
    pos_tensor = positions.tensor
    if pos_tensor is None:
        pos_strides = (1, 1)
    elif pos_tensor.ndim == 1:
        # per-sequence offsets (batch,) are indexed by sequence, varlen position ids (tokens,) by packed token
        pos_strides = (0, pos_tensor.stride(0)) if positions.mode == POSITION_IDS else (pos_tensor.stride(0), 1)
    else:
        pos_strides = (pos_tensor.stride(0), pos_tensor.stride(1))
    k_args = k if k is not None else q
    out_k_args = out_k if out_k is not None else out_q
    if log.isEnabledFor(logging.DEBUG):
        log.debug("ropekit triton v4: grid=%s BLOCK_S=%d BLOCK_H=%d warps=%d fused_qk=%s q=%s k=%s dtype=%s "
                  "rotary_dim=%d interleaved=%s conjugate=%s pos_mode=%d varlen=%s cos_per_token=%s", grid,
                  config.block_s, block_h, config.num_warps, config.fused_qk, tuple(q.shape),
                  None if k is None else tuple(k.shape), q.dtype, rotary_dim, interleaved, conjugate, positions.mode,
                  positions.is_varlen, cos_per_token)
    if dense:
        tensor_strides = (1,) * 16
    elif in_place:
        tensor_strides = (*q.stride(), *k_args.stride(), *(1,) * 8)  # the kernel takes the inputs' strides
    else:
        tensor_strides = (*q.stride(), *k_args.stride(), *out_q.stride(), *out_k_args.stride())
    # the tiles derive where k's head blocks begin; the flat path's blocks count elements; varlen tiles bound their
    # rows by the packed token count (1 elsewhere: not read)
    n_rows = n_tokens if flat else (q.shape[1] if positions.is_varlen else 1)
    ints = (seqlen, n_heads_q, n_heads_k, n_head_blocks_q if flat else 1, table_len, positions.offset + 1,
            *tensor_strides, *cos_strides, *pos_strides, n_rows)
    constexprs = dict(
        ROTARY_DIM=rotary_dim, HEAD_DIM=head_dim,
        BLOCK_S=config.block_s, BLOCK_H=block_h, BLOCK_HK=_next_pow2(n_heads_k) if config.fused_qk else 1,
        BLOCK_HALF=_next_pow2(rotary_dim // 2),
        BLOCK_TAIL=_next_pow2(max(head_dim - rotary_dim, 1)),
        INTERLEAVED=interleaved, CONJUGATE=conjugate, POS_MODE=positions.mode, IS_VARLEN=positions.is_varlen,
        # in place the tail channels are already where they belong
        COS_PER_TOKEN=cos_per_token, COPY_TAIL=copy_tail and rotary_dim < head_dim and not in_place,
        HAS_K=k is not None,
        MATH_DTYPE=_MATH_DTYPE.get(q.dtype, tl.float32), EAGER_ROUNDING=eager_rounding,
        FUSED_QK=config.fused_qk, FLAT=flat, FLAT_PAIRED=paired, DENSE=dense, IN_PLACE=in_place,
        EVICT="evict_first" if (config.flat_streaming if flat else config.evict_first) else "",
        # 32-bit address arithmetic is fewer instructions; int64 as soon as an offset into any tensor the kernel
        # indexes with it could overflow: q, k, the outputs, per-token cos/sin rows and position ids
        # (docs/tuning.md#index-dtype)
        INDEX_DTYPE=tl.int32 if _fits_int32(q.shape, q.stride(), k_args.shape, k_args.stride(), out_q.shape,
                                            out_q.stride(), out_k_args.shape, out_k_args.stride(), cos.shape,
                                            cos.stride(), sin.shape, sin.stride(),
                                            *((pos_tensor.shape, pos_tensor.stride()) if pos_tensor is not None
                                              else ()))
        and (not flat or max(q.numel(), k_args.numel()) + flat < 2**31) else tl.int64,  # flat: a block's last lane
    )
    if flat:
        log.debug("ropekit triton v4: flat path, %d elements a program%s, %d warps", flat,
                  " of q and of k" if paired else "", config.flat_warps)
    dtypes = tuple(getattr(p, "dtype", None) for p in V4Launch.pointers(q, k, out_q, out_k, cos, sin, pos_tensor,
                                                                          positions.cu_seqlens, in_place))
    return V4Launch(grid, ints, constexprs, config.flat_warps if flat else config.num_warps, dtypes)


_FLAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _same_view(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``out`` is ``x`` itself (an in-place call): same memory, shape and strides."""
    return out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.shape == x.shape


def _flat_applies(q, k, out_q, out_k, contiguous: bool, positions: PositionSpec, rotary_dim: int,
                  interleaved: bool, cos_per_token: bool, eager_rounding: bool) -> bool:
    """Whether the flat path can run these tensors: contiguous (batch, seq, heads, head_dim) q, k and outputs
    (``contiguous``: the caller's check of all four), the whole head rotated with NeoX pairs, positions from the
    table (not varlen, not per-token rows), one rounding in fp32 math, and out of place: in place, a lane would
    overwrite an element another warp may still have to read as its partner."""
    return (not positions.is_varlen and not cos_per_token and not eager_rounding and not interleaved
            and q.dtype in _FLAT_DTYPES
            and rotary_dim == q.shape[-1] and q.ndim == 4 and out_q.data_ptr() != q.data_ptr()
            and (k is None or out_k.data_ptr() != k.data_ptr()) and contiguous)