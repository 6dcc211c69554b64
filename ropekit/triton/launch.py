"""Plans and launches, for every kernel: a plan is made once per call signature, a launch passes only pointers.

Data reaches a kernel through three steps, each a name here:

* the launch choice: :func:`rope_config` (a :class:`~ropekit.triton.configs.TileConfig` or
  :class:`~ropekit.triton.configs.FlatConfig`, from ``ropekit.triton.choice``);
* a plan: :func:`plan_rope` makes a :class:`RopeLaunch`, everything a launch derives from shapes, strides, dtypes and
  switches (which kernel, its grid, its arguments by name), made once per call signature and kept in :data:`plans`
  by the ops' front doors (``ropekit.api``, ``ropekit.fused``);
* the launch: a :class:`KernelLaunch` called with the tensors of this call (their data pointers may change) and the
  position offset, through the direct launch that calls Triton's compiled runner (:func:`_call_compiled`: the one
  place that touches Triton's and torch's private launch surface).

:func:`rope_v4` does all three for one call. It trusts its caller (``ropekit.api`` validates). A tool that measures
another configuration passes ``config=`` to :func:`rope_v4` or :func:`plan_rope`; :func:`recorded_launches` lists
the launches a workload would make without running them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import device as _device
from ..positions import POSITION_IDS, PositionSpec
from . import choice
from .configs import FlatConfig, RopeShape, TileConfig, cdiv, flat_half_width, flat_rows, next_pow2
from .groups import Head, PositionForm, Types
from .v4 import QKTile, Rotation, rope_v4_kernel
from .v4_flat import rope_flat_kernel

__all__ = ["KernelLaunch", "PlanCache", "plans", "LaunchRecord", "recorded_launches", "rope_config", "plan_rope",
           "RopeLaunch", "rope_v4", "forced_config", "TileConfig", "FlatConfig", "released", "signature",
           "tensor_key"]

log = logging.getLogger("ropekit")


# --------------------------------------------------------------------------------------------------------------------
# A launch: one kernel, fully specialised but for the tensors of a call.
# --------------------------------------------------------------------------------------------------------------------

_signatures: dict = {}


def _signature(kernel) -> tuple:
    """(every parameter name in order, the names of the ``tl.constexpr`` ones) of a kernel, read once from its
    signature (under the interpreter too)."""
    signature = _signatures.get(kernel)
    if signature is None:
        parameters = inspect.signature(kernel.fn).parameters
        signature = _signatures[kernel] = (tuple(parameters), frozenset(
            name for name, p in parameters.items() if "constexpr" in str(p.annotation)))
    return signature


def _constexprs(kernel) -> frozenset:
    return _signature(kernel)[1]


def _addresses(values) -> tuple:
    """The per-call values as the compiled launcher takes them: a tensor as its data pointer (an int), None and ints
    as they are. Triton's launcher takes a pointer argument's int as the address; given the tensor, it calls
    ``data_ptr()`` and asks the driver about the pointer (``cuPointerGetAttribute``), per tensor and call
    (docs/tuning.md#direct-launch). Given an int it checks nothing: that every tensor lies on the launch's GPU is
    validation's check (a plan's key holds each tensor's device)."""
    return tuple([value if value is None or type(value) is int else value.data_ptr() for value in values])


def _specialisation(addresses: tuple) -> tuple:
    """What Triton specialises a launch on among the values that change from call to call (:func:`_addresses`): a
    pointer's 16-byte alignment, an integer's being 1, divisible by 16, within 32 bits (dtypes and everything else
    are the plan's). One form for both: a launch's key (:attr:`KernelLaunch.key`, which the shared runner cache
    adds) marks each per-call slot as a tensor's (by its dtype) or an integer's (None), so equal keys beside equal
    forms mean equal specialisations; a pointer is never 1 nor within 32 bits (but null, which only splits a key).
    One comprehension, no call a value: a decode step's host time is in such loops."""
    return tuple([None if value is None else (value == 1, value % 16 == 0, -2**31 <= value < 2**31)
                  for value in addresses])


def _static(value):
    """A launch argument as a key: tensors by dtype (their addresses change from call to call), tuples leaf by
    leaf."""
    if isinstance(value, tuple):
        return tuple(map(_static, value))
    return value.dtype if isinstance(value, torch.Tensor) else value


def _path(per_call) -> tuple:
    """A per-call entry as a path: a parameter's name, or (name, index, ...) for a value inside a tuple argument."""
    return (per_call,) if isinstance(per_call, str) else tuple(per_call)


def _with_values(names: tuple, arguments: dict, paths: tuple, marker) -> list:
    """The arguments in ``names``' order, with ``marker(i)`` put where per-call value ``i`` goes (tuples rebuilt
    around them); arguments holding no per-call value are kept as they are."""
    inside: dict = {}
    for i, path in enumerate(paths):
        inside.setdefault(path[0], []).append((path[1:], i))

    def place(value, entries):
        if entries == [((), entries[0][1])]:
            return marker(entries[0][1])
        items = list(value)
        for index in {rest[0] for rest, _ in entries}:
            items[index] = place(items[index], [(rest[1:], i) for rest, i in entries if rest[0] == index])
        return tuple(items)
    return [place(arguments[n], inside[n]) if n in inside else arguments[n] for n in names]


class _PerCall:
    """Where per-call value ``index`` goes, while an assembler's expression is written."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _assembler(arguments: list, n_values: int, defaults: tuple):
    """A function of the per-call values (as positional arguments; absent trailing ones are ``defaults``) that returns
    the runner's arguments: ``arguments`` (marked with :class:`_PerCall` where each value goes) with the values in
    place. Per-call values may sit inside tuple arguments (a tensor beside its strides), so each call rebuilds those
    tuples; the function is one tuple expression, written out once per argument structure and compiled, because a
    loop that rebuilds them costs about a microsecond a decode call more (docs/tuning.md#direct-launch)."""
    constants: list = []

    def items(values) -> str:
        """The values as the items of a tuple display: per-call values by name, tuples holding one rebuilt, the
        others read from ``c``; a long run of them spliced in as one prebuilt tuple (a splice costs more than a few
        reads)."""
        parts, run = [], []

        def flush():
            if len(run) >= 4:
                constants.append(tuple(run))
                parts.append(f"*c[{len(constants) - 1}]")
            for value in run if len(run) < 4 else ():
                constants.append(value)
                parts.append(f"c[{len(constants) - 1}]")
            run.clear()
        for value in values:
            if _holds_per_call(value):
                flush()
                parts.append(f"v{value.index}" if isinstance(value, _PerCall) else "(" + items(value) + ")")
            else:
                run.append(value)
        flush()
        return "".join(part + ", " for part in parts)
    body = items(arguments)
    parameters = ", ".join(f"v{i}=d[{i}]" for i in range(n_values))
    return _factory(f"lambda c, d: lambda {parameters}: ({body})")(tuple(constants), defaults)


def _holds_per_call(value) -> bool:
    return isinstance(value, _PerCall) or (isinstance(value, tuple) and any(map(_holds_per_call, value)))


@functools.lru_cache(maxsize=256)
def _factory(source: str):
    return eval(source)  # noqa: S307 (the source is written by _assembler from argument structures, not from data)


class KernelLaunch:
    """One kernel launch with everything fixed but the values named in ``per_call``: ``kernel[grid](**arguments,
    num_warps=num_warps)`` with ``per_call``'s values given at each call, in that order. A ``per_call`` entry names a
    parameter, or a value inside a tuple argument by the parameter's name and the index in it (``("q", 0)``: the
    tensor of the (tensor, strides) pair ``q``). A call may give fewer values than ``per_call`` names: the rest are
    the plan's.

    Triton's JIT entry point re-derives the specialisation of every argument in Python on every call, which is most of
    a decode step's host time (docs/tuning.md#direct-launch). After the first launch of a given specialisation of the
    per-call values, the compiled kernel's runner is kept here and called directly with the arguments in the kernel's
    own order, which this class reads from the kernel's signature: no host code knows where a parameter sits.
    """

    __slots__ = ("kernel", "grid", "num_warps", "arguments", "per_call", "runtime", "everything", "key", "runners",
                 "options", "prepared", "dtypes", "device")

    def __init__(self, kernel, grid: tuple, num_warps: int, per_call: tuple, arguments: dict):
        # the grid as three extents: a compiled runner reads grid[0], grid[1] and grid[2] (the JIT entry pads them)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.kernel, self.num_warps, self.per_call = kernel, num_warps, per_call
        self.arguments = arguments
        # Triton's launch options: a kernel whose DEPENDENCY waits for the grid before it is launched programmatically
        # (groups.Dependency), which the compiled runner then does by itself
        self.options = {"num_warps": num_warps}
        if arguments.get("DEPENDENCY"):
            self.options["launch_pdl"] = True
        names, constexprs = _signature(kernel)
        paths = tuple(map(_path, per_call))
        defaults = tuple(_at(arguments, path) for path in paths)
        # the dtype the kernel reads each per-call tensor as (None: not a tensor)
        self.dtypes = tuple(value.dtype if isinstance(value, torch.Tensor) else None for value in defaults)
        marked = _with_values(names, arguments, paths, _PerCall)
        # The compiled runner takes the non-constexpr arguments (Triton 3.6), or every argument (later versions): an
        # assembler for each
        self.everything = _assembler(marked, len(paths), defaults)
        self.runtime = _assembler([a for n, a in zip(names, marked) if n not in constexprs], len(paths), defaults)
        # what Triton specialises on, but the per-call values' addresses and integer classes: launches with equal
        # keys share compiled runners, so a launch planned afresh (autograd's backward, an uncached call) still takes
        # the direct path. A per-call tensor enters by its dtype: a launch is called with tensors of its plan's dtypes;
        # a per-call value that is not a tensor (the position offset) by nothing (its class is the call's
        # specialisation). The device too (a launch's tensors share one, which validation checks): a runner is loaded
        # on one device's context. A call may pass a tensor of another dtype of the same element size (a float8
        # cache the plan reads as bytes): the launcher takes its address, and :meth:`named` views it as the plan's.
        device = next((value.device for value in defaults if isinstance(value, torch.Tensor)), None)
        # the GPU the launch runs on (None: not a CUDA launch): made current while it launches, if it is not
        self.device = device.index if device is not None and device.type == "cuda" else None
        self.key = (kernel, grid, num_warps, device) + _static(tuple(_with_values(
            names, arguments, paths,
            lambda i: defaults[i].dtype if isinstance(defaults[i], torch.Tensor) else None)))
        # this launch's runners by the per-call values' specialisation: a call finds its runner without hashing the
        # key, a tuple of every static argument
        self.runners: dict = {}
        # the launcher's arguments by the per-call values' addresses (:func:`_run_direct`)
        self.prepared = PlanCache(_PREPARED_MAX)

    @property
    def constexprs(self) -> dict:
        constexprs = _constexprs(self.kernel)
        return {n: v for n, v in self.arguments.items() if n in constexprs}

    def named(self, values) -> dict:
        """The launch's arguments by name, with ``values`` for the per-call ones, each tensor as the dtype the plan
        reads it as (what Triton's entry point and the interpreter specialise on; the launcher reads addresses)."""
        values = [value.view(dtype) if dtype is not None and value is not None and value.dtype != dtype else value
                  for value, dtype in zip(values, self.dtypes)]
        return dict(zip(_signature(self.kernel)[0], self.everything(*values)))

    def released(self) -> "KernelLaunch":
        """The same launch holding none of the tensors it was planned with: each per-call tensor an empty one of its
        dtype and device (what the launch's key and Triton's specialisation read of it). For a launch kept in a
        cache: a cached plan must not keep the planning call's memory or autograd graph alive. Called with every
        per-call value, as the cache's callers call it, it launches the same kernel."""
        names = _signature(self.kernel)[0]
        paths = tuple(map(_path, self.per_call))

        def empty(i):
            value = _at(self.arguments, paths[i])
            return torch.empty(0, dtype=value.dtype, device=value.device) if isinstance(value, torch.Tensor) else value
        arguments = dict(zip(names, _with_values(names, self.arguments, paths, empty)))
        return KernelLaunch(self.kernel, self.grid, self.num_warps, self.per_call, arguments)

    def registers(self, values) -> int | None:
        """Registers a thread of the compiled kernel holds, for ``values`` as a call passes them: the kernel compiled
        for this launch's specialisation and loaded on the device, not run (Triton caches it for the launch). None
        under the interpreter, which compiles nothing, and where the kernel does not compile or load (too much
        shared memory, say): its launch would fail the same way."""
        if _device.INTERPRET:
            return None
        key = (self.key, _specialisation(_addresses(values)))
        if key not in _registers:
            if len(_registers) > 4096:
                _registers.clear()
            try:
                with _device.on_device(self.device):  # compiled for, and loaded on, the launch's own GPU
                    compiled = self.kernel.warmup(**self.named(values), grid=self.grid, **self.options)
                    compiled = compiled.result() if hasattr(compiled, "result") else compiled  # asynchronous
                    compiled[self.grid]  # loads the binary on the device, which reports its register count
                _registers[key] = compiled.n_regs or None
            except Exception as error:  # noqa: BLE001 (a tile the model would only try: the rule's stands)
                log.debug("ropekit: no register count for %s: %s", self.kernel.__name__, error)
                _registers[key] = None
        return _registers[key]

    def __call__(self, *values) -> None:
        _launch(self, values)

    def bound(self, *values):
        """Launch with ``values``, and return this launch bound to their addresses: a function of no arguments that
        launches it again there and returns True, or returns False having launched nothing (a launch hook is
        installed, the interpreter runs the kernels, or :func:`recorded_launches` holds the launches back: launch
        the full way instead). None where the launch kept no launcher's arguments for these addresses (the first
        launch of a specialisation, which compiles; the interpreter; a launch without Triton's launcher). For a
        plan that keeps its calls by address (``ropekit.fused.plan.FusedPlan``): it holds addresses, no tensor."""
        prepared = _launch(self, values)
        if prepared is None or _current_stream is None:
            return None
        grid, device = self.grid, self.device

        def relaunch() -> bool:
            if _device.INTERPRET or _launch_hooks() or _launch is not _run_direct:
                return False
            _run_prepared(grid, prepared, device)
            return True
        return relaunch


def _at(arguments: dict, path: tuple):
    value = arguments[path[0]]
    for index in path[1:]:
        value = value[index]
    return value


def _run_direct(launch: KernelLaunch, values: tuple) -> tuple | None:
    """Launch through the direct-launch cache (the interpreter: through Triton's entry point, one launch at a time).

    The launcher's arguments are a function of the plan and the per-call values' addresses alone (a tensor enters
    by its data pointer, its dtype and strides are the plan's), so a call at addresses this launch has seen (a decode
    step's tensors, which the caching allocator hands out again) takes them as they were built: no specialisation,
    no assembly. A call at new addresses finds its runner by their specialisation. Returns the arguments kept for
    these addresses (what :meth:`KernelLaunch.bound` binds), or None where none are (the interpreter, the first
    launch of a specialisation, which compiles through the JIT entry point, a launch without Triton's launcher)."""
    if _device.INTERPRET:
        with _device.INTERPRETER_LOCK:
            launch.kernel[launch.grid](**launch.named(values), **launch.options)
        return None
    addresses = _addresses(values)
    prepared = launch.prepared.get(addresses)
    if prepared is not None and _current_stream is not None and not _launch_hooks():
        _run_prepared(launch.grid, prepared, launch.device)
        return prepared
    if launch.device is not None and launch.device != _get_device():
        # Triton compiles, loads and launches on the current device: the launch's own GPU is made current
        with torch.cuda.device(launch.device):
            return _run_direct(launch, values)
    specialisation = _specialisation(addresses)
    entry = launch.runners.get(specialisation)
    if entry is None:
        key = (launch.key, specialisation)
        entry = _runners.get(key)
        if entry is None:
            compiled = launch.kernel[launch.grid](**launch.named(values), **launch.options)
            if len(_runners) > 4096:
                _runners.clear()
            _runners[key] = _entry(compiled, launch.grid)
            return None
        launch.runners[specialisation] = entry
    prepared = _call_compiled(launch, entry, values, addresses)
    if prepared is not None:
        launch.prepared.put(addresses, prepared)
    return prepared


_PREPARED_MAX = 64  # address sets a launch keeps (a decode loop cycles through a few)


def _run_prepared(grid: tuple, prepared: tuple, device: int) -> None:
    """Call the launcher with arguments kept by address (``KernelLaunch.prepared``: the launcher, the function loaded
    on ``device``, the packed metadata, the arguments) on ``device``'s current stream, no hooks
    (:func:`_call_compiled`). The driver launches a function in the current device's context: ``device`` is made
    current first where another is (a model spread over GPUs, :func:`ropekit.device.on_device`)."""
    if device != _get_device():
        with torch.cuda.device(device):
            _run_prepared(grid, prepared, device)
        return
    run, function, metadata, args = prepared
    run(grid[0], grid[1], grid[2], _stream_of(device), function, metadata, None, None, None, *args)


_runners: dict = {}  # compiled runners by (KernelLaunch.key, the per-call values' specialisation)
_registers: dict = {}  # their registers a thread, by the same key


_launch = _run_direct


def launching_directly() -> bool:
    """Whether a launch now really runs its kernel (not inside :func:`recorded_launches`): only then may the autotune
    time launches."""
    return _launch is _run_direct


def _stream_getter():
    """The current CUDA stream as Triton's launcher takes it, read the way Triton reads it (None: let Triton do it)."""
    if _stream_of is None:
        return None
    return lambda: _stream_of(_get_device())


# a device's current stream (None in a torch build without CUDA) and the current device's index, as Triton's launcher
# reads them
_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_current_stream = _stream_getter()


def _entry(compiled, grid: tuple) -> list:
    """A direct-launch cache entry for a compiled kernel: [its runner ``compiled[grid]``, the argument convention
    (None until the first call learns it), its launcher as (``compiled.run``, the loaded function, the packed
    metadata), or None where the compiled kernel lacks them]."""
    runner = compiled[grid]  # loads the kernel, which sets the launcher's handles
    try:
        launcher = (compiled.run, compiled.function, compiled.packed_metadata)
    except AttributeError:
        launcher = None
    return [runner, None, launcher]


_KNOBS = getattr(triton, "knobs", None)
_RUNTIME = getattr(_KNOBS, "runtime", None)  # one object for the process (Triton 3.6-3.9); hooks are added to it
_HOOK_CHAIN = getattr(_KNOBS, "HookChain", None)


def _launch_hooks() -> bool:
    """Whether launch hooks are installed (a profiler's, say): Triton's runner builds their metadata and calls them,
    the launcher alone does not. Triton 3.6-3.9 keep them as ``HookChain`` lists; anything else counts as
    installed."""
    for hook in (getattr(_RUNTIME, "launch_enter_hook", None), getattr(_RUNTIME, "launch_exit_hook", None)):
        if hook is not None and (_HOOK_CHAIN is None or not isinstance(hook, _HOOK_CHAIN) or hook.calls):
            return True
    return False


def _call_compiled(launch: KernelLaunch, entry: list, values: tuple, addresses: tuple) -> tuple | None:
    """Call a compiled kernel's launcher, or its runner (``compiled[grid]``), directly: the one place that relies on
    surfaces Triton and torch do not document.

    * The argument convention: Triton versions differ in whether the runner takes the constexpr arguments (3.6 does
      not, later versions do). ``entry[1]`` remembers it once learnt: a wrong count is rejected by the launcher's
      argument parser before anything runs, so trying both is safe. Should neither work, the launch goes through
      the JIT entry point from then on (``"jit"``: correct, only slower).
    * The stream: handed over as the current stream read through ``torch._C``, the way Triton reads it, which skips
      the runner's own device and stream lookups (``_current_stream`` is None where torch lacks those).
    * The launcher: with no launch hooks installed, ``compiled.run`` (Triton 3.6-3.9: grid, stream, function,
      packed metadata, launch metadata, enter and exit hooks, then the arguments), given no metadata and no hooks.
      The runner would build the hooks' metadata and pass the hook chains, which the launcher calls even when empty:
      Python time on every launch (measured: docs/tuning.md#direct-launch). The launcher takes the tensors as
      ``addresses``, their data pointers, read once for the specialisation; the runner, which hands its arguments to the
      hooks, takes the tensors.

    Returns the launcher's arguments as :attr:`KernelLaunch.prepared` keeps them (the launcher, the loaded function,
    the packed metadata, the arguments), or None where the launch went through the runner without a launcher or
    through the JIT entry point.
    """
    runner, with_constexprs, launcher = entry
    if with_constexprs is None:
        for convention in (True, False):
            try:
                prepared = _call_compiled(launch, [runner, convention, launcher], values, addresses)
            except TypeError:
                continue
            entry[1] = convention
            return prepared
        entry[1] = with_constexprs = "jit"
    if with_constexprs == "jit":
        launch.kernel[launch.grid](**launch.named(values), **launch.options)
        return None
    assemble = launch.everything if with_constexprs else launch.runtime
    if _current_stream is None:
        runner(*assemble(*values))
        return None
    if launcher is None:
        runner(*assemble(*values), stream=_current_stream())
        return None
    prepared = (*launcher, assemble(*addresses))
    if _launch_hooks():
        runner(*assemble(*values), stream=_current_stream())
    else:
        _run_prepared(launch.grid, prepared, launch.device)
    return prepared


class LaunchRecord(NamedTuple):
    """One launch that :func:`recorded_launches` held back: the kernel and its arguments by name."""

    kernel: object
    grid: tuple
    arguments: dict  # every argument by parameter name, the call's tensors included
    num_warps: int
    constexprs: frozenset  # the names of the compile-time arguments among them


@contextlib.contextmanager
def recorded_launches():
    """Inside the block no kernel runs: every launch, however it is reached (``apply_rope`` with the Triton backend,
    autograd, the fused ops, a plan), is appended to the list this yields as a :class:`LaunchRecord`. For tools that
    count the kernel variants a workload compiles without running it; the direct-launch cache learns nothing
    meanwhile. Plans are forgotten on entry and on exit."""
    global _launch
    records: list = []
    real = _launch

    def record(launch, values):
        records.append(LaunchRecord(launch.kernel, launch.grid, launch.named(values), launch.num_warps,
                                   _constexprs(launch.kernel)))

    _launch = record
    plans.clear()
    try:
        yield records
    finally:
        _launch = real
        plans.clear()


class PlanCache(dict):
    """Plans by call signature (bounded): the one plan cache every op's front door uses (docs/tuning.md#plan-cache).
    ``get`` is ``dict.get``, for keys known to hash; :meth:`find` is the lookup of a key that may hold an unhashable
    argument (one validation refuses), which has no plan. Either way the eager hot path pays one hash of the key and
    a dictionary lookup. :meth:`put` forgets everything once it is full, and keeps no plan for an unhashable key.
    Each op keys its plans by a tuple that starts with the op's name (:func:`signature`). The launches kept by
    address (:attr:`KernelLaunch.prepared`, ``FusedPlan.calls``) are the same bounded dictionary, smaller."""

    def __init__(self, max_plans: int):
        super().__init__()
        self.max_plans = max_plans

    def find(self, key):
        try:
            return self.get(key)
        except TypeError:
            return None

    def put(self, key, plan):
        if len(self) >= self.max_plans:
            self.clear()
        try:
            self[key] = plan
        except TypeError:
            pass
        return plan


plans = PlanCache(1024)


def tensor_key(t: torch.Tensor | None) -> tuple | None:
    """A tensor as a plan's key holds it (None as None): shape, strides, dtype and device. The device as its index
    where it has one, else as itself (a CPU tensor and a meta one both have index -1): an int hashes and compares for
    about half a ``torch.device``'s cost, and a call's key holds one per tensor. Keys assume one indexed device type
    in a process (CUDA's: an XPU's or an MPS device's index would read as the GPU's of the same number).
    :func:`signature` and ``fused.plan.keyed`` write this tuple out inline (a call per tensor costs more than it
    saves there); ``tests/test_relaunch.py`` holds the three equal."""
    if t is None:
        return None
    index = t.get_device()
    return t.shape, t.stride(), t.dtype, index if index >= 0 else t.device


def signature(op: str, tensors: tuple, flags: tuple) -> tuple:
    """A plan's key: the op's name, every tensor by :func:`tensor_key` (None as itself, anything else by type and
    value), every host argument by type and value (True == 1 as dict keys, but not as arguments). Not hashed here:
    the plan cache's lookup (:meth:`PlanCache.find`) is the one hash a call pays (a key with an unhashable argument
    finds no plan there, and validation says what is wrong with it)."""
    # (None first: most of a fused call's optional tensors are None, and isinstance against torch.Tensor is slow
    # for a non-tensor; tensor_key inline)
    return (op, *[None if t is None else
                  (t.shape, t.stride(), t.dtype, index if (index := t.get_device()) >= 0 else t.device)
                  if isinstance(t, torch.Tensor) else (type(t), t) for t in tensors], *flags, *map(type, flags))


# --------------------------------------------------------------------------------------------------------------------
# RoPE: the tile and the flat kernel behind one launcher.
# --------------------------------------------------------------------------------------------------------------------

_forced: TileConfig | FlatConfig | None = None


@contextlib.contextmanager
def forced_config(config: TileConfig | FlatConfig | None):
    """Every RoPE launch planned inside the block uses ``config`` (None: the usual choice), whichever way it is
    reached (``apply_rope``, the module, autograd); a :class:`FlatConfig` where the flat kernel cannot run the call
    leaves that call to the usual choice. For tools and tests that measure or check configurations through the
    public API; a direct :func:`rope_v4` call takes ``config=`` instead. Plans are forgotten on entry and on exit,
    so no plan made under one configuration serves a call under another."""
    global _forced
    saved, _forced = _forced, config
    plans.clear()
    try:
        yield
    finally:
        _forced = saved
        plans.clear()


def rope_config(shape: RopeShape, device=None) -> TileConfig | FlatConfig:
    """The launch choice for a call of this shape on ``device`` (``ropekit.triton.choice``: the performance model,
    refined by a measured autotune cached on disk; fixed tiles under the interpreter)."""
    if _forced is not None and (type(_forced) is TileConfig or shape.flat_ok):
        return _forced
    # Timed only where launches really run on a GPU: not inside recorded_launches, not for tensors planned on another
    # device (meta tensors: the current GPU's choice, untimed)
    if torch.device(device).type != "cuda" or not launching_directly():
        return choice.choose_rope(shape, None if torch.device(device).type != "cuda" else device)
    return choice.choose_rope(shape, device, bench=lambda config: _bench_rope(shape, device, config))


def _bench_rope(shape: RopeShape, device, config) -> float:
    """Seconds one launch of ``config`` takes on fresh random tensors of the shape's bucket (contiguous q and k, a
    table of positions 0..seq-1): what the autotune times. The choice times only such calls (contiguous, out of place,
    NeoX pairs, a table), so the benchmark call is the real one."""
    shape = choice.rope_bucket(shape)
    dtype = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[shape.element_size]
    q = torch.randn(1, shape.n_tokens, shape.n_heads_q, shape.head_dim, device=device, dtype=dtype)
    k = (torch.randn(1, shape.n_tokens, shape.n_heads_k, shape.head_dim, device=device, dtype=dtype)
         if shape.n_heads_k else None)
    cos = torch.randn(shape.n_tokens, shape.rotary_dim // 2, device=device)
    sin = torch.randn_like(cos)
    out_q, out_k = torch.empty_like(q), (torch.empty_like(k) if k is not None else None)
    launch = plan_rope(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=PositionSpec(0, 0, None, None, None),
                       rotary_dim=shape.rotary_dim, config=config)
    return choice.time_launch(lambda: launch(q, k, out_q, out_k, cos, sin, None, None, 0), device=device)


def released(launch):
    """What a plan cache keeps of a planned launch (a :class:`KernelLaunch` or :class:`RopeLaunch`): the same launch
    holding none of its planning call's tensors (``launch.released()``), or None for none (nothing to compute)."""
    return None if launch is None else launch.released()


class RopeLaunch(NamedTuple):
    """A planned RoPE launch: the kernel's launch, and how the call's tensors map onto its per-call arguments."""

    launch: KernelLaunch
    config: TileConfig | FlatConfig
    in_place: bool
    shape: RopeShape  # what the launch choice saw

    def released(self) -> "RopeLaunch":
        """The same plan holding none of its planning call's tensors (:meth:`KernelLaunch.released`): what the plan
        cache keeps."""
        return self._replace(launch=self.launch.released())

    def __call__(self, q, k, out_q, out_k, cos, sin, positions, cu_seqlens, position_offset: int) -> None:
        """q/k/out/cos/sin/positions/cu_seqlens: the tensors the plan was made for, or any with the same shapes,
        strides and dtypes (views count: only their data pointers are read); k, positions and cu_seqlens may be
        None when the plan was made without them. A plan made with ``inv_freq`` takes that vector as ``cos`` (sin:
        None). A plan made in place writes through q and k."""
        k = k if k is not None else q  # the kernel's HAS_K skips it
        if self.in_place:
            self.launch(q, k, cos, sin, positions, cu_seqlens, position_offset + 1)
        elif type(self.config) is FlatConfig:
            self.launch(q, k, out_q, out_k if out_k is not None else out_q, cos, sin, positions, position_offset + 1)
        else:
            self.launch(q, k, out_q, out_k if out_k is not None else out_q, cos, sin, positions, cu_seqlens,
                        position_offset + 1)


def rope_v4(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
            out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
            interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
            copy_tail: bool = True, eager_rounding: bool = False, inv_freq: torch.Tensor | None = None,
            scale: float = 1.0, nope: tuple | None = None, config: TileConfig | FlatConfig | None = None) -> None:
    """Launch v4. q/k/out are 4-D ``(batch, seq, heads, head_dim)`` views with any strides, or 3-D ``(tokens, heads,
    head_dim)`` when ``positions.is_varlen``. cos/sin: ``(table_len, rotary_dim/2)`` tables, or with
    ``cos_per_token`` full-width rows ``(batch, seq, rotary_dim)`` (``(tokens, rotary_dim)`` for varlen), or None
    with ``inv_freq``: the ``(>= rotary_dim/2,)`` float32/float64 inverse frequencies, cos/sin computed in the kernel
    at each position and multiplied by ``scale`` (the tile kernel only). ``nope``: ``(floor_scale, attn_scale)`` of a
    Llama 4 NoPE layer: nothing rotates, q is multiplied by its token's attention temperature over the whole head and
    k is copied (not touched in place); cos and sin are None.

    The launcher trusts its caller (``ropekit.api`` validates); it only normalises shapes and plans the launch.
    ``config`` forces a configuration instead of :func:`rope_config`'s (tuning and reliability tools); a
    :class:`FlatConfig` where the flat kernel cannot run the call is refused.
    """
    plan = plan_rope(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=positions, rotary_dim=rotary_dim,
                     interleaved=interleaved, conjugate=conjugate, cos_per_token=cos_per_token, copy_tail=copy_tail,
                     eager_rounding=eager_rounding, inv_freq=inv_freq, scale=scale, nope=nope, config=config)
    if plan is not None:
        plan(q, k, out_q, out_k, cos if inv_freq is None else inv_freq, sin, positions.tensor, positions.cu_seqlens,
             positions.offset)


@functools.lru_cache(maxsize=4096)
def _fits_int32(*shapes_and_strides) -> bool:
    """Whether every in-kernel offset (relative to each view's own data pointer) stays below 2**31."""
    return all(sum((n - 1) * abs(st) for n, st in zip(shape, strides) if n > 0) < 2**31
               for shape, strides in zip(shapes_and_strides[::2], shapes_and_strides[1::2]))


_MATH_DTYPE = {torch.float64: tl.float64}
_FLAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _same_view(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``out`` is ``x`` itself: same memory, shape and strides."""
    return out.data_ptr() == x.data_ptr() and out.stride() == x.stride() and out.shape == x.shape


def _in_place(q: torch.Tensor, out_q: torch.Tensor, k: torch.Tensor | None, out_k: torch.Tensor | None) -> bool:
    """Whether the call writes its inputs: each of q and k that holds elements is its own output. An empty tensor
    decides nothing: its data pointer may read 0 whatever it views, as an empty output's does."""
    held = [(x, out) for x, out in ((q, out_q), (k, out_k)) if x is not None and x.numel()]
    return bool(held) and all(_same_view(x, out) for x, out in held)


def _flat_applies(q, k, out_q, out_k, contiguous: bool, positions: PositionSpec, rotary_dim: int,
                  interleaved: bool, cos_per_token: bool, eager_rounding: bool) -> bool:
    """Whether the flat kernel can run these tensors: contiguous (batch, seq, heads, head_dim) q, k and outputs
    (``contiguous``: the caller's check of all four), the whole head rotated with NeoX pairs, positions from the
    table (not varlen, not M-RoPE, not per-token rows), one rounding in fp32 math, and out of place. The kernel
    would be correct in place (a pair is loaded and stored by one thread), but there it measured level with the
    streaming tile, which keeps in-place calls (docs/tuning.md#flat-path)."""
    return (not positions.is_varlen and not positions.is_mrope and not cos_per_token and not eager_rounding
            and not interleaved and q.dtype in _FLAT_DTYPES
            and rotary_dim == q.shape[-1] and q.ndim == 4 and out_q.data_ptr() != q.data_ptr()
            and (k is None or out_k.data_ptr() != k.data_ptr()) and contiguous)


def _position_strides(positions: PositionSpec) -> tuple:
    """(sequence, token) strides of the positions tensor: per-sequence offsets ``(batch,)`` step by sequence, 1-D
    position ids (varlen) by packed token, 2-D ids by both; (1, 1) without a tensor (not read). M-RoPE's ids add
    the axis stride: (sequence, token, axis) of ``(3, batch, seq)``, or of ``(3, tokens)`` packed (no sequence)."""
    t = positions.tensor
    if t is None:
        return 1, 1
    if positions.is_mrope:
        return (t.stride(1), t.stride(2), t.stride(0)) if t.ndim == 3 else (0, t.stride(1), t.stride(0))
    if t.ndim == 2:
        return t.stride(0), t.stride(1)
    return (0, t.stride(0)) if positions.mode == POSITION_IDS else (t.stride(0), 1)


def plan_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
              out_q: torch.Tensor, out_k: torch.Tensor | None, positions: PositionSpec, rotary_dim: int,
              interleaved: bool = False, conjugate: bool = False, cos_per_token: bool = False,
              copy_tail: bool = True, eager_rounding: bool = False, inv_freq: torch.Tensor | None = None,
              scale: float = 1.0, nope: tuple | None = None,
              config: TileConfig | FlatConfig | None = None) -> RopeLaunch | None:
    """The :class:`RopeLaunch` for :func:`rope_v4`'s arguments (None when there is nothing to do)."""
    angles = inv_freq is not None
    if nope is not None and _in_place(q, out_q, k, out_k):
        k, out_k = None, None  # a NoPE layer leaves k as it is: in place nothing touches it
    if angles:
        cos, sin = inv_freq, None  # the kernel reads the frequencies where a table would be
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
    head_dim, n_heads_q = q.shape[-1], q.shape[2]
    n_heads_k = k.shape[2] if k is not None else 0
    if n_batch == 0 or seqlen == 0 or (q.numel() == 0 and (k is None or k.numel() == 0)):
        return None
    if n_batch > 65535:
        # sequences sit on the grid's third axis, which CUDA caps at 65535
        raise ValueError(f"v4 handles at most 65535 sequences per launch (grid axis 2), got {n_batch}")
    contiguous = all(t.is_contiguous() for t in (q, k, out_q, out_k) if t is not None)
    in_place = _in_place(q, out_q, k, out_k)
    # the flat kernel reads tables only
    flat_ok = not angles and nope is None and _flat_applies(q, k, out_q, out_k, contiguous, positions, rotary_dim,
                                                            interleaved, cos_per_token, eager_rounding)
    shape = RopeShape(n_batch * seqlen, n_heads_q, n_heads_k, head_dim, rotary_dim, q.element_size(), cos_per_token,
                      flat_ok, k is None or k.shape == q.shape, positions.is_varlen,
                      angles or nope is not None or positions.is_mrope)
    if config is None:
        config = rope_config(shape, q.device)
    elif type(config) is FlatConfig and not flat_ok:
        raise ValueError("a FlatConfig was given for a call the flat kernel cannot run (it needs contiguous, "
                         "out-of-place NeoX tensors rotated over the whole head, positions from a table)")
    k_args = k if k is not None else q
    out_k_args = out_k if out_k is not None else out_q
    index_dtype = tl.int32 if _fits_int32(*(part for t in (q, k_args, out_q, out_k_args, cos, sin, positions.tensor)
                                            if t is not None for part in (t.shape, t.stride()))) else tl.int64
    # Integer arguments a launch does not read are passed as 1, which Triton specialises into a constant (1 is not
    # passed at all), and absent tensors as None: graph replay pays for every byte of arguments
    # (docs/tuning.md#lean-launch).
    if type(config) is FlatConfig:
        return _plan_flat(shape, q, k, out_q, out_k, cos, sin, positions, config, n_batch, seqlen, n_heads_q,
                          n_heads_k, index_dtype, conjugate)
    return _plan_tile(shape, q, k, out_q, out_k, cos, sin, positions, config, n_batch, seqlen, n_heads_q,
                      n_heads_k, rotary_dim, interleaved, conjugate, cos_per_token, eager_rounding, in_place,
                      contiguous, index_dtype, angles, scale, nope)


def _plan_tile(shape, q, k, out_q, out_k, cos, sin, positions, config: TileConfig, n_batch, seqlen, n_heads_q,
               n_heads_k, rotary_dim, interleaved, conjugate, cos_per_token, eager_rounding, in_place, contiguous,
               index_dtype, angles=False, scale=1.0, nope=None) -> RopeLaunch:
    head_dim = q.shape[-1]
    block_h = config.block_h
    if config.fused_qk:
        # the q and k tiles cover every head: one program per token block
        block_h = max(block_h, next_pow2(n_heads_q))
        n_head_blocks = 1
    else:
        n_head_blocks = cdiv(n_heads_q, block_h) + cdiv(n_heads_k, block_h)
    if config.heads_inner:
        grid = (cdiv(seqlen, config.block_s) * n_head_blocks, 1, n_batch)
    else:
        grid = (cdiv(seqlen, config.block_s), n_head_blocks, n_batch)
    # DENSE: contiguous q, k and outputs, and a contiguous table of rotary_dim / 2 columns (or contiguous
    # frequencies); the kernel derives their strides (docs/tuning.md#dense-strides)
    if nope is not None:
        dense = contiguous
    elif angles:
        dense = contiguous and cos.is_contiguous()
    else:
        dense = contiguous and (cos_per_token or (cos.is_contiguous() and sin.is_contiguous()
                                                  and cos.shape[1] == rotary_dim // 2))
    if nope is not None:
        cos_strides, table_len = (1, 1, 1), 1  # nothing read
    elif angles:
        cos_strides = (1, 1, 1) if dense else (1, 1, cos.stride(0))  # the frequencies: columns only
        table_len = 1  # not read
    elif cos_per_token:
        cos_strides = (0 if positions.is_varlen else cos.stride(0), cos.stride(1), cos.stride(2))
        table_len = 1  # not read
    else:
        cos_strides = (1, 1, 1) if dense else (1, cos.stride(0), cos.stride(1))  # a table has no batch axis
        table_len = cos.shape[0]
    k_args = k if k is not None else q
    unread = (1, 1, 1, 1)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("ropekit triton v4: tile kernel, grid=%s %s q=%s k=%s dtype=%s rotary_dim=%d interleaved=%s "
                  "conjugate=%s pos_mode=%d varlen=%s cos_per_token=%s angles=%s", grid, config, tuple(q.shape),
                  None if k is None else tuple(k.shape), q.dtype, rotary_dim, interleaved, conjugate, positions.mode,
                  positions.is_varlen, cos_per_token, angles)
    arguments = dict(
        q=(q, unread if dense else tuple(q.stride())), k=(k_args, unread if dense else tuple(k_args.stride())),
        out_q=(None, unread) if in_place else (out_q, unread if dense else tuple(out_q.stride())),
        out_k=(None, unread) if in_place else (
            out_k, unread if dense else tuple((out_k if out_k is not None else out_q).stride())),
        angles=(cos, sin, cos_strides),
        positions=(positions.tensor, _position_strides(positions), positions.cu_seqlens, positions.offset + 1),
        # varlen tiles bound their rows by the packed token count (1 elsewhere: not read)
        sizes=(seqlen, n_heads_q, n_heads_k, table_len, q.shape[1] if positions.is_varlen else 1),
        HEAD=Head(rotary_dim, head_dim, next_pow2(rotary_dim // 2), next_pow2(max(head_dim - rotary_dim, 1)),
                  interleaved),
        TILE=QKTile(config.block_s, block_h, next_pow2(n_heads_k) if config.fused_qk else 1, config.fused_qk,
                    config.heads_inner and not config.fused_qk),
        POSITION=PositionForm(positions.mode, positions.is_varlen, cos_per_token, angles,
                              float(scale) if angles else 1.0),
        HAS_K=k is not None,
        ROTATION=Rotation(conjugate, 0 if nope is None else int(nope[0]), 0.0 if nope is None else float(nope[1]),
                          eager_rounding),
        TYPES=Types(_MATH_DTYPE.get(q.dtype, tl.float32), index_dtype, "evict_first" if config.evict_first else ""),
        DENSE=dense, IN_PLACE=in_place, DEPENDENCY=choice.launch_dependency(q.device, grid, config.num_warps))
    per_call = ((("q", 0), ("k", 0)) + (() if in_place else (("out_q", 0), ("out_k", 0)))
                + (("angles", 0), ("angles", 1), ("positions", 0), ("positions", 2), ("positions", 3)))
    return RopeLaunch(KernelLaunch(rope_v4_kernel, grid, config.num_warps, per_call, arguments), config, in_place,
                      shape)


def _plan_flat(shape, q, k, out_q, out_k, cos, sin, positions, config: FlatConfig, n_batch, seqlen, n_heads_q,
               n_heads_k, index_dtype, conjugate) -> RopeLaunch:
    head_dim = q.shape[-1]
    n_tokens = n_batch * seqlen
    paired = config.paired and (k is None or k.shape == q.shape)
    # a program takes whole head vectors, as many as its block's elements hold (at least one), each half padded to
    # a power of two; one grid axis: the blocks of q, then of k (n_q_blocks tells the kernel where k begins), or of
    # q and k together
    rows = flat_rows(config.block, head_dim)
    n_q_blocks = cdiv(n_tokens * n_heads_q, rows)
    grid = (n_q_blocks + (0 if paired else cdiv(n_tokens * n_heads_k, rows)), 1, 1)
    if index_dtype == tl.int32 and max(q.numel(), k.numel() if k is not None else 0) + rows * head_dim >= 2**31:
        index_dtype = tl.int64  # a block's last row
    if log.isEnabledFor(logging.DEBUG):
        log.debug("ropekit triton v4: flat kernel, grid=%s %s q=%s k=%s dtype=%s conjugate=%s pos_mode=%d", grid,
                  config, tuple(q.shape), None if k is None else tuple(k.shape), q.dtype, conjugate, positions.mode)
    k_args = k if k is not None else q
    arguments = dict(
        Q=q, K=k_args, OUT_Q=out_q, OUT_K=out_k if out_k is not None else out_q,
        COS=cos, SIN=sin, cos_strides=(cos.stride(0), cos.stride(1)),
        POSITIONS=positions.tensor, position_strides=_position_strides(positions),
        position_offset=positions.offset + 1,
        sizes=(n_tokens, seqlen, n_heads_q, n_heads_k, cos.shape[0], n_q_blocks),
        HEAD_DIM=head_dim, HALF_WIDTH=flat_half_width(head_dim), ROWS=rows, PAIRED=paired, HAS_K=k is not None,
        POS_MODE=positions.mode,
        CONJUGATE=conjugate, EVICT="evict_first" if config.streaming else "", INDEX_DTYPE=index_dtype,
        DEPENDENCY=choice.launch_dependency(q.device, grid, config.num_warps))
    per_call = ("Q", "K", "OUT_Q", "OUT_K", "COS", "SIN", "POSITIONS", "position_offset")
    return RopeLaunch(KernelLaunch(rope_flat_kernel, grid, config.num_warps, per_call, arguments), config, False,
                      shape)
