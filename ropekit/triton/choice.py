"""Launch choices: the performance model's configuration, refined by a bounded autotune cached on disk.

:func:`choose_rope` and :func:`choose_fused` answer, for a call's shape on a device, in this order:

1. this process's memory (a dict hit);
2. the disk cache, a JSON file in the user's cache directory (``ROPEKIT_CACHE_DIR``, else
   ``$XDG_CACHE_HOME/ropekit``, else ``~/.cache/ropekit``), keyed by the GPU's name and driver-visible properties,
   ropekit's version and the shape's bucket (:func:`rope_bucket`, :func:`fused_bucket`);
3. the autotune: when the caller supplies ``bench`` (``bench(config) -> seconds``, one launch of ``config`` on
   tensors of the bucket's shape) and :func:`tuning_allowed`, each of the model's few candidates
   (:func:`~ropekit.triton.model.rope_candidates`) is timed once, the fastest is kept in memory and on disk;
4. otherwise the model's choice (:func:`~ropekit.triton.model.model_rope`), kept nowhere, so that a later call
   outside CUDA-graph capture or a torch.compile trace tunes the bucket.

Under Triton's interpreter the configurations are fixed (the largest tiles the shape allows: every program costs
Python time on a CPU), and nothing is timed or stored. ``ROPEKIT_AUTOTUNE=0`` turns the autotune off: the model's
choice, or what the disk cache already holds. Once a bucket is on disk its choice is the same in every process.
A corrupt or read-only cache is ignored (the model's choice then), never an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from .. import device as _device
from .configs import FlatConfig, FusedConfig, FusedShape, RopeShape, TileConfig, next_pow2
from .groups import Dependency
from .model import (DeviceFacts, fits_in_l2, flat_meets_littles_law, fused_candidate_space,
                    fused_candidates, fused_meets_littles_law, grid_dependency, model_fused, model_rope,
                    prefill_past_l2, rope_candidate_space, rope_candidates)

__all__ = ["DeviceFacts", "device_facts", "launch_dependency", "measure_copy_gbps", "rope_bucket", "fused_bucket",
           "choose_rope", "choose_fused", "tuning_allowed", "time_launch", "cache_path", "ASSUMED_LATENCY_NS"]

log = logging.getLogger("ropekit")

# The loaded DRAM latency the model assumes on every GPU: the order of an HBM latency under load (the course's copy
# sweep fits it on a device: docs/tuning.md#how-the-library-chooses). Not measured per GPU.
ASSUMED_LATENCY_NS = 600.0
_ASSUMED_LATENCY_SOURCE = "assumed: the order of an HBM latency under load, not measured on this GPU"

# Thread blocks one SM holds at most, by compute capability where it differs from 32 (NVIDIA's published limits).
_PROGRAMS_PER_SM = {(7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24, (12, 0): 24}

_CACHE_FORMAT = 1
_CONFIG_TYPES = {cls.__name__: cls for cls in (TileConfig, FlatConfig, FusedConfig)}


# --------------------------------------------------------------------------------------------------------------------
# The device's facts.
# --------------------------------------------------------------------------------------------------------------------

_facts: dict[int, DeviceFacts] = {}
_lock = threading.Lock()


def _device_index(device) -> int:
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    return device.index if device.index is not None else torch.cuda.current_device()


def _properties_key(name: str, capability: tuple, n_sms: int, memory_bytes: int) -> str:
    return f"{name}|sm_{capability[0]}{capability[1]}|{n_sms} SMs|{memory_bytes} B"


def device_facts(device=None) -> DeviceFacts:
    """The facts of a CUDA device (default: the current one), cached for the process.

    SMs, L2 size, registers and threads come from ``torch.cuda.get_device_properties``. The copy bandwidth is
    measured once per GPU with a device copy (:func:`measure_copy_gbps`) and kept in the disk cache; where timing is
    not allowed (:func:`tuning_allowed`) it is the peak that the memory clock and bus width give, labelled so in
    ``bandwidth_source``, and measured on a later call. The latency is :data:`ASSUMED_LATENCY_NS`. Under
    ``ROPEKIT_PDL=0`` and on ROCm builds the facts say kernels are launched plainly (``programmatic_launch``).
    """
    facts = _measured_facts(_device_index(device))
    return facts if _programmatic_launches() else dataclasses.replace(facts, programmatic_launch=False)


def _measured_facts(index: int) -> DeviceFacts:
    cached = _facts.get(index)
    if cached is not None:
        return cached
    props = torch.cuda.get_device_properties(index)
    name = getattr(props, "name", "unknown GPU")
    capability = (getattr(props, "major", 0), getattr(props, "minor", 0))
    n_sms = getattr(props, "multi_processor_count", 0) or 1
    memory_bytes = getattr(props, "total_memory", 0)
    threads = getattr(props, "max_threads_per_multi_processor", 0) or 2048
    registers = getattr(props, "regs_per_multiprocessor", 0) or getattr(props, "registers_per_multiprocessor", 0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0)
    key = _properties_key(name, capability, n_sms, memory_bytes)
    gbps, source = _copy_bandwidth(index, key, props)
    facts = DeviceFacts(name=name, n_sms=n_sms, ceiling_gbps=gbps, latency_ns=ASSUMED_LATENCY_NS,
                        latency_source=_ASSUMED_LATENCY_SOURCE, max_warps_per_sm=max(1, threads // 32),
                        max_programs_per_sm=_PROGRAMS_PER_SM.get(capability, 32),
                        registers_per_sm=registers or 65536, l2_bytes=l2_bytes or DeviceFacts.l2_bytes,
                        capability=capability,
                        bandwidth_source=source, memory_bytes=memory_bytes,
                        shared_bytes_per_program=_shared_bytes_per_program(props))
    if source.startswith("measured") or not _inside_capture_or_compile():
        _facts[index] = facts  # an estimate made inside capture or compile is measured again later
    return facts


def _shared_bytes_per_program(props) -> int:
    """Shared memory one program may hold: the opt-in limit where torch reports it (CUDA), else the plain per-block
    one (ROCm reports no opt-in), else the model's default."""
    return getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0) or \
        DeviceFacts.shared_bytes_per_program


def _copy_bandwidth(index: int, key: str, props) -> tuple[float, str]:
    entry = _disk().get(f"{key}|copy bandwidth")
    if isinstance(entry, dict) and isinstance(entry.get("gbps"), (int, float)) and entry["gbps"] > 0:
        return float(entry["gbps"]), "measured by a device copy (disk cache)"
    if tuning_allowed():
        gbps = measure_copy_gbps(index)
        _store(f"{key}|copy bandwidth", {"gbps": gbps})
        return gbps, "measured by a device copy"
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return clock_khz * 1e3 * 2 * bus_bits / 8 / 1e9, "estimated: the peak of the memory clock and bus width"
    return 3000.0, "assumed: no measurement and no memory clock"


def measure_copy_gbps(device=None, n_bytes: int = 256 * 2**20) -> float:
    """The copy bandwidth of a CUDA device in GB/s (bytes read + written a second): ``n_bytes`` copied on the device,
    timed by :func:`time_launch`."""
    device = torch.device("cuda", _device_index(device))
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_launch(lambda: dst.copy_(src), warmup=3, reps=10, device=device)
    return 2 * n_bytes / seconds / 1e9


# --------------------------------------------------------------------------------------------------------------------
# Buckets, the switch, the timer.
# --------------------------------------------------------------------------------------------------------------------

def rope_bucket(shape: RopeShape) -> RopeShape:
    """The shape a RoPE choice is made and cached for: the token count rounded up to a power of two, everything
    else exact. It is also the shape the autotune times."""
    return shape._replace(n_tokens=next_pow2(shape.n_tokens))


def fused_bucket(shape: FusedShape) -> FusedShape:
    """The shape a fused choice is made and cached for: the token count rounded up to a power of two."""
    return shape._replace(n_tokens=next_pow2(shape.n_tokens))


def tuning_allowed() -> bool:
    """Whether the autotune (or the bandwidth measurement) may time launches now: not turned off
    (``ROPEKIT_AUTOTUNE=0``), not under Triton's interpreter, not inside a torch.compile trace, not inside CUDA-graph
    capture on the current stream."""
    if os.environ.get("ROPEKIT_AUTOTUNE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return not _device.INTERPRET and not _inside_capture_or_compile()


def _inside_capture_or_compile() -> bool:
    if torch.compiler.is_compiling():
        return True
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a build without CUDA
        return False


def time_launch(fn, *, warmup: int = 2, reps: int = 5, device=None) -> float:
    """Seconds one call of ``fn`` takes on the device: ``warmup`` calls, then the median of ``reps`` calls each timed
    with CUDA events on the current stream (without CUDA, ``time.perf_counter``). ``device``: the CUDA device ``fn``
    launches on, made current meanwhile (:func:`ropekit.device.on_device`; default: the current one)."""
    with _device.on_device(device):
        return _time_launch(fn, warmup, reps)


def _time_launch(fn, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    if torch.cuda.is_available():
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


# --------------------------------------------------------------------------------------------------------------------
# The disk cache.
# --------------------------------------------------------------------------------------------------------------------

def cache_path() -> Path:
    """The autotune cache file: ``$ROPEKIT_CACHE_DIR/autotune.json``, else under ``$XDG_CACHE_HOME/ropekit`` or
    ``~/.cache/ropekit``."""
    root = os.environ.get("ROPEKIT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "ropekit")
    return Path(root) / "autotune.json"


_disk_state: dict = {"path": None, "entries": {}}


def _read_disk(path: Path) -> dict:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict) or document.get("format") != _CACHE_FORMAT:
        return {}
    entries = document.get("entries")
    return entries if isinstance(entries, dict) else {}


def _disk(reload: bool = False) -> dict:
    """The disk cache's entries, read once a process (again when ``reload`` or when the cache path changed)."""
    path = cache_path()
    if reload or _disk_state["path"] != path:
        _disk_state.update(path=path, entries=_read_disk(path))
    return _disk_state["entries"]


def _store(key: str, value) -> None:
    """Add one entry: merged with what another process may have written meanwhile, written to a temporary file and
    moved into place (readers see the old file or the new one). Failures leave the cache as it was."""
    with _lock:
        entries = dict(_disk(reload=True))
        entries[key] = value
        _disk_state["entries"] = entries
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autotune.", suffix=".tmp")
            try:
                with os.fdopen(handle, "w") as out:
                    json.dump({"format": _CACHE_FORMAT, "entries": entries}, out, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as error:
            log.debug("ropekit: the autotune cache %s is not writable (%s); choices stay in memory", path, error)


def _entry_key(facts: DeviceFacts, op: str, bucket) -> str:
    import ropekit

    device = _properties_key(facts.name, facts.capability, facts.n_sms, facts.memory_bytes)
    return f"{device}|ropekit {ropekit.__version__}|{op}|{','.join(str(int(v)) for v in bucket)}"


def _decode(entry, space: list):
    """A cached configuration, if it is one the kernels accept for the bucket (a stale or corrupt entry is not)."""
    try:
        config = _CONFIG_TYPES[entry["type"]](**entry["config"])
    except (KeyError, TypeError, ValueError):
        return None
    return config if config in space else None


# --------------------------------------------------------------------------------------------------------------------
# Choosing.
# --------------------------------------------------------------------------------------------------------------------

_chosen: dict = {}


def _choose(op: str, bucket, device, bench, model, candidates, space, worth_timing=None, per_call=None):
    """``per_call(facts, bucket)``: whether the model's answer reads the call's own kernel (its registers). Where it
    does and the bucket is not worth timing, that answer is the call's: no answer kept for the bucket (in memory or
    on disk) stands in for it, and it is not kept, since another call of the bucket may compile to other registers
    (a page table's addressing, a norm's place)."""
    facts = device if isinstance(device, DeviceFacts) else device_facts(device)
    never_timed = worth_timing is not None and not worth_timing(facts, bucket)
    if never_timed and per_call is not None and per_call(facts, bucket):
        return model(facts, bucket)
    if never_timed:
        bench = None
    memory_key = (facts, op, bucket)
    config = _chosen.get(memory_key)
    if config is not None:
        return config
    key = _entry_key(facts, op, bucket)
    config = _decode(_disk().get(key), space(bucket))
    if config is None and bench is not None and tuning_allowed():
        config = _decode(_disk(reload=True).get(key), space(bucket))  # another process may have tuned it meanwhile
        if config is None:
            config = _tune(bench, candidates(facts, bucket))
            if config is not None:
                _store(key, {"type": type(config).__name__, "config": config._asdict()})
    if config is None:
        config = model(facts, bucket)
        if not never_timed:  # the autotune may still decide this bucket later (outside a capture, say)
            return config
    _chosen[memory_key] = config  # a bucket the clock never judges keeps its answer: no lookup on later plans
    return config


_MARGIN = 0.99  # a later candidate must be this much faster than the best so far: the clock's own spread is ~1%


def _tune(bench, candidates: list):
    """The fastest candidate, where a later one (the model's choice comes first) must beat the best so far by more
    than the clock's spread; None when none ran."""
    best, best_seconds = None, float("inf")
    for config in candidates:
        try:
            seconds = float(bench(config))
        except Exception as error:  # a candidate that fails to compile or launch here is not chosen
            log.debug("ropekit: autotune candidate %s failed: %s", config, error)
            continue
        if seconds < best_seconds * _MARGIN:
            best, best_seconds = config, seconds
    return best


def _programmatic_launches() -> bool:
    """Whether CUDA launches may be programmatic: not on a ROCm build (its GPUs report compute capabilities of 9 too,
    without programmatic launches), not with ``ROPEKIT_PDL=0``."""
    return torch.version.hip is None and \
        os.environ.get("ROPEKIT_PDL", "1").strip().lower() not in ("0", "false", "off", "no")


def launch_dependency(device, grid: tuple, num_warps: int) -> int:
    """How a launch of ``grid`` on ``device`` follows the grid before it (:class:`~ropekit.triton.groups.Dependency`):
    the model's :func:`~ropekit.triton.model.grid_dependency` on the device's facts (NONE where they say kernels are
    launched plainly: ``ROPEKIT_PDL=0``, a ROCm build), NONE under the interpreter and on any other device."""
    if _device.INTERPRET or torch.device(device).type != "cuda":
        return Dependency.NONE
    programs = 1
    for extent in grid:
        programs *= extent
    return grid_dependency(device_facts(device), programs, num_warps)


def choose_rope(shape: RopeShape, device=None, bench=None) -> TileConfig | FlatConfig:
    """The configuration of a RoPE launch of ``shape`` on ``device`` (a CUDA device, its index, or a
    :class:`DeviceFacts` to choose for a GPU described by its facts; default: the current CUDA device).

    ``bench(config) -> seconds`` times one launch of ``config`` on tensors of :func:`rope_bucket`'s shape; given
    and allowed (:func:`tuning_allowed`), a bucket seen for the first time is tuned, at most one ``bench`` call a
    candidate. Under Triton's interpreter (on the process's own device): the largest tile the shape allows, at most
    16 tokens x 8 heads, 4 warps.
    """
    if _device.INTERPRET and not isinstance(device, DeviceFacts):
        heads = max(shape.n_heads_q, shape.n_heads_k)
        return TileConfig(min(next_pow2(shape.n_tokens), 16), min(next_pow2(heads), 8), 4)
    return _choose("rope", rope_bucket(shape), device, bench, model_rope, rope_candidates, rope_candidate_space,
                   worth_timing=_worth_timing)


def _worth_timing(facts: DeviceFacts, bucket: RopeShape) -> bool:
    """Whether the autotune's clock can improve on the model for this bucket: only calls past the L2 (one that the
    L2 serves lasts a few microseconds, mostly its launch chain, which the event clock of one launch cannot tell
    apart), only where the fresh tensors ``bench`` times make the same kind of call: contiguous, out of place, NeoX
    pairs, a table (``flat_ok``), and only where the model is unsure: its flat block, even at 8 vectors a thread,
    keeps less in flight than Little's law asks (:func:`~ropekit.triton.model.flat_meets_littles_law`). Where it
    keeps enough (the H100 and the H200), the candidates differ by no more than the clock's own errors, and graph
    replay measured the model's block among the fastest flat blocks swept (docs/tuning.md#flat-path). A
    bucket not worth timing takes what the disk cache holds, else the model's choice."""
    return bucket.flat_ok and not fits_in_l2(facts, bucket) and not flat_meets_littles_law(facts, bucket)


def choose_fused(shape: FusedShape, device=None, bench=None, registers=None) -> FusedConfig:
    """The configuration of a fused launch of ``shape`` on ``device``; as :func:`choose_rope`. ``registers(config)``
    gives the registers a thread of the compiled kernel holds for a configuration (compiling it, not running it):
    given, outside CUDA-graph capture and a torch.compile trace, the model counts the programs an SM holds from it
    (:func:`~ropekit.triton.model.model_fused`). Under Triton's interpreter: at most 16 tokens x 8 heads, 4 warps."""
    if _device.INTERPRET and not isinstance(device, DeviceFacts):
        return FusedConfig(min(next_pow2(shape.n_tokens), 16), min(next_pow2(shape.n_heads), 8), 4)
    if registers is not None and _inside_capture_or_compile():
        registers = None

    def worth_timing(facts: DeviceFacts, bucket: FusedShape) -> bool:
        # only where the model is unsure: its tile, counted from the compiled kernel's registers, keeps less in flight
        # than Little's law asks, or the registers are not known. Where it keeps enough, the candidates differ by a
        # few per cent at most, the size of the single-launch clock's errors (docs/tuning.md).
        return _fused_worth_timing(facts, bucket) and not (
            registers is not None and fused_meets_littles_law(facts, bucket, registers))
    return _choose("fused", fused_bucket(shape), device, bench,
                   lambda facts, bucket: model_fused(facts, bucket, registers),
                   lambda facts, bucket: fused_candidates(facts, bucket, registers), fused_candidate_space,
                   worth_timing=worth_timing,
                   per_call=lambda facts, bucket: registers is not None and _fused_worth_timing(facts, bucket))


def _fused_worth_timing(facts: DeviceFacts, bucket: FusedShape) -> bool:
    """Whether the autotune's clock may improve on the model for a fused bucket: a forward prefill past the L2 only
    (:func:`choose_fused` narrows it to those whose tile keeps too little in flight). A decode step is its launch
    chain, which the event clock of one launch cannot tell apart; the backward keeps the model's walk of token
    blocks."""
    return prefill_past_l2(facts, bucket)
