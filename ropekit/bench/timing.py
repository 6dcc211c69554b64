"""How time is measured on the GPU: the copy ceiling, do_bench medians, CUDA-graph replays and eager wall clock.

Three clocks, because they answer three questions:

* ``do_bench_us`` — Triton's ``do_bench`` median: device time of one call, measured with events; do_bench zeroes a
  256 MB buffer before every call, so inputs come from DRAM (and a slow host wrapper can show up as a gap).
* ``graph_us`` — the calls captured back to back in one CUDA graph and replayed: device time without launch gaps.
  The runner captures every implementation's graph of a case first and then replays them in interleaved rounds
  (``capture``, ``replay_rounds``), so that every implementation is timed over the same stretch of the run.
  Given one buffer set the same inputs are read every call (small cases: **L2-resident**); given several, the captured
  calls rotate through them so that the inputs come from **DRAM** (sets totalling more than 4x the L2 cache).
* ``eager_us`` — wall clock over N back-to-back Python calls with one synchronisation at the end, divided by N
  (host overhead included; the clarifications' definition). do_bench's flush would hide the host time.

Everything here needs a CUDA device; the rest of the harness can be exercised on the CPU with a fake timer.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch

__all__ = ["Settings", "QUICK", "GpuTimer", "DryRunTimer", "CapturedGraph", "copy_ceiling", "median_and_spread",
           "back_to_back_us", "cuda_healthy"]

CEILING_BYTES = 1 << 30  # the copy ceiling copies this many bytes (and reads as many): far beyond any L2


@dataclass(frozen=True)
class Settings:
    warmup_ms: float = 10.0  # do_bench warm-up (milliseconds, as do_bench takes them)
    rep_ms: float = 50.0  # do_bench repetition time
    graph_ms: float = 40.0  # replay time per graph measurement
    graph_rounds: int = 5  # the replays of a case's graphs, interleaved over this many rounds (replay_rounds)
    graph_target_us: float = 300.0  # device time captured in one graph (calls back to back)
    max_calls_per_graph: int = 512
    eager_ms: float = 40.0  # wall time per eager measurement, split over rounds
    eager_rounds: int = 5
    dram_factor: float = 4.0  # DRAM timings rotate over buffer sets totalling > dram_factor x L2
    sweep_warmup_ms: float = 5.0
    sweep_rep_ms: float = 20.0
    ceiling_bytes: int = CEILING_BYTES  # the copy ceiling copies this many bytes (and reads as many)
    ceiling_rep_ms: float = 200.0
    time_budget_s: float = 540.0  # stop starting new measurements after this (0: no limit); outputs still written

    def to_json(self) -> dict:
        return asdict(self)


QUICK = replace(Settings(), warmup_ms=2.0, rep_ms=8.0, graph_ms=8.0, eager_ms=8.0, eager_rounds=3,
                sweep_warmup_ms=1.0, sweep_rep_ms=4.0, ceiling_bytes=1 << 28, ceiling_rep_ms=30.0,
                time_budget_s=300.0, graph_rounds=3)


def copy_ceiling(nbytes: int = CEILING_BYTES, rep_ms: float = 200.0) -> dict:
    """Bytes read + written per second by a device-to-device copy of ``nbytes`` (do_bench median).

    The one definition of "the copy ceiling" that every percentage in the benchmarks and the tools divides by: a
    copy large enough to leave the L2 out of it, timed with events so that no launch gap counts.
    """
    from triton.testing import do_bench

    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=rep_ms, return_mode="median")
    torch.cuda.synchronize()
    return {"gbps": 2 * nbytes / (ms * 1e-3) / 1e9, "time_us": ms * 1e3, "bytes_read": nbytes,
            "bytes_written": nbytes,
            "method": f"torch copy_ of {nbytes / 2**20:.0f} MiB on the device, do_bench median (rep {rep_ms:g} ms)"}


def median_and_spread(samples: list[float]) -> tuple[float, float]:
    """Median, and the spread (80th - 20th percentile) / median."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    if len(ordered) < 3 or median <= 0:
        return median, 0.0
    low = ordered[int(0.2 * (len(ordered) - 1))]
    high = ordered[int(math.ceil(0.8 * (len(ordered) - 1)))]
    return median, (high - low) / median


def back_to_back_us(fn, calls: int, sync) -> float:
    """µs a call: the wall clock of ``calls`` back-to-back calls of ``fn`` with one ``sync()`` at the end (and one
    before the start), over ``calls``. Host time included: the eager clock of the clarifications. The caller warms
    ``fn`` up first and keeps the garbage collector out of the loop (``gc.disable``, as timeit does)."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


class GpuTimer:
    """The real clocks (CUDA only)."""

    def __init__(self, settings: Settings):
        self.settings = settings

    @staticmethod
    def l2_bytes() -> tuple[int, str]:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        size = getattr(props, "L2_cache_size", 0)
        if size:
            return int(size), "device properties"
        return 50 * 2**20, "assumed 50 MiB (torch does not report the L2 size)"

    def copy_ceiling(self) -> dict:
        """The device's copy ceiling at this timer's settings (:func:`copy_ceiling`)."""
        return copy_ceiling(self.settings.ceiling_bytes, self.settings.ceiling_rep_ms)

    def do_bench_us(self, fn, warmup_ms: float, rep_ms: float) -> float:
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3

    def graph_us(self, fns: list, estimate_us: float) -> tuple[float, float, int]:
        """(median µs per call, spread, calls per graph) over replays of a graph of back-to-back calls.

        The calls cycle through ``fns`` (one per buffer set), so a graph touches every set at least once.
        ``estimate_us`` sizes the graph (``graph_target_us`` of device work, at most ``max_calls_per_graph`` calls):
        the runner passes the case's bytes over the copy ceiling, the same for every implementation of a case, so
        that no implementation's graph is shortened by its own host overhead (a graph of a few calls pays the
        graph launch's own latency per call; from about 128 calls on, the time per call is flat:
        docs/tuning.md#benchmark-harness).
        """
        graph = self.capture(fns, estimate_us)
        return self.replay_rounds([graph])[0]

    def capture(self, fns: list, estimate_us: float) -> "CapturedGraph":
        """Capture the graph that :meth:`graph_us` times (on the caller's stream when it is a side stream), warm it
        up with three replays, and return it for :meth:`replay_rounds`."""
        s = self.settings
        n_sets = len(fns)
        estimate_us = max(estimate_us, 0.5)
        repeats = max(1, math.ceil(s.graph_target_us / (estimate_us * n_sets)))
        calls = n_sets * repeats
        if calls > s.max_calls_per_graph:
            calls = max(n_sets, s.max_calls_per_graph - s.max_calls_per_graph % n_sets)
        # Warm up on a side stream (lazy initialisation, allocator), as torch.cuda.graphs' documentation does.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for fn in fns[: min(n_sets, 3)]:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # capture on the caller's stream when it is a side stream (the runner's backward rows: autograd launches
        # each backward kernel on its forward's stream), else on torch.cuda.graph's own
        current = torch.cuda.current_stream()
        capture_stream = None if current == torch.cuda.default_stream() else current
        try:
            with torch.cuda.graph(graph, stream=capture_stream):
                for i in range(calls):
                    fns[i % n_sets]()
            warm_start, warm_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()
            warm_start.record()
            for _ in range(2):
                graph.replay()
            warm_end.record()
            torch.cuda.synchronize()
        except BaseException:
            _release(graph)
            raise
        return CapturedGraph(graph, calls, max(warm_start.elapsed_time(warm_end) * 1e3 / 2, 1.0), fns)

    def replay_rounds(self, graphs: list["CapturedGraph"]) -> list[tuple[float, float, int]]:
        """(median µs per call, spread, calls per graph) of each captured graph, then release them.

        The replays are interleaved: ``graph_rounds`` rounds, each replaying every graph in turn for its share of
        ``graph_ms``, and the samples of all rounds pooled. A slow drift of the GPU's state over the run (clocks,
        temperature) then reaches every implementation of a case alike instead of whichever was timed at the
        wrong moment (measured sequentially, one kernel's small-case time moved by several percent from run to
        run: docs/tuning.md#benchmark-harness).
        """
        s = self.settings
        rounds = max(1, s.graph_rounds)
        samples: list[list[float]] = [[] for _ in graphs]
        try:
            for _ in range(rounds):
                for captured, out in zip(graphs, samples):
                    # as many replays as fit in this round's share of graph_ms, counted from the warm-up replays
                    replays = int(min(2000, max(5, s.graph_ms * 1e3 / rounds / captured.replay_us)))
                    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                              for _ in range(replays)]
                    for start, end in events:
                        start.record()
                        captured.graph.replay()
                        end.record()
                    torch.cuda.synchronize()
                    out.extend(start.elapsed_time(end) * 1e3 / captured.calls for start, end in events)
        finally:
            for captured in graphs:
                _release(captured.graph)
        return [(*median_and_spread(out), captured.calls) for captured, out in zip(graphs, samples)]

    def eager_us(self, fns: list, estimate_us: float) -> tuple[float, float, int]:
        """(median µs per call, spread, calls per round): wall clock of N back-to-back calls, one sync at the end."""
        s = self.settings
        n_sets = len(fns)
        for fn in fns[: min(n_sets, 3)]:
            fn()  # warm (allocator, caches); the timed rounds follow
        torch.cuda.synchronize()
        probe = [fns[i % n_sets] for i in range(20)]
        start = time.perf_counter()
        for fn in probe:
            fn()
        torch.cuda.synchronize()
        per_call_us = max((time.perf_counter() - start) / len(probe) * 1e6, estimate_us, 0.5)
        n = int(min(20000, max(20, s.eager_ms * 1e3 / s.eager_rounds / per_call_us)))
        n = n_sets * max(1, math.ceil(n / n_sets))  # every buffer set equally often
        calls = [fns[i % n_sets] for i in range(n)]  # prebuilt: the timed loop does nothing but call
        samples = []
        gc.collect()
        gc.disable()  # as timeit does: a garbage collection inside a round is not the call's cost
        try:
            for _ in range(s.eager_rounds):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for fn in calls:
                    fn()
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - start) / n * 1e6)
        finally:
            gc.enable()
        median, spread = median_and_spread(samples)
        return median, spread, n


class DryRunTimer:
    """No clock at all: every function is called once (so a tool's whole path runs, on a CPU too) and every "time"
    is 1.0. For dry runs of the harness and the tools; what it produces is never a measurement."""

    def __init__(self, l2_bytes: int = 0):  # 0: one buffer set a case, DRAM rows only
        self._l2_bytes = l2_bytes

    def l2_bytes(self) -> tuple[int, str]:
        return self._l2_bytes, "dry run"

    def copy_ceiling(self) -> dict:
        return {"gbps": 1.0, "time_us": 1.0, "bytes_read": 0, "bytes_written": 0, "method": "dry run: no clock"}

    def do_bench_us(self, fn, warmup_ms: float, rep_ms: float) -> float:
        fn()
        return 1.0

    def graph_us(self, fns: list, estimate_us: float) -> tuple[float, float, int]:
        for fn in fns:
            fn()
        return 1.0, 0.0, len(fns)

    def capture(self, fns: list, estimate_us: float) -> "CapturedGraph":
        for fn in fns:
            fn()
        return CapturedGraph(list(fns), len(fns), 1.0, fns)

    def replay_rounds(self, graphs: list["CapturedGraph"]) -> list[tuple[float, float, int]]:
        return [(1.0, 0.0, captured.calls) for captured in graphs]

    def eager_us(self, fns: list, estimate_us: float) -> tuple[float, float, int]:
        for fn in fns:
            fn()
        return 1.0, 0.0, len(fns)


@dataclass
class CapturedGraph:
    """A graph of ``calls`` back-to-back calls, captured and warmed up; ``replay_us``: one warm replay's time.

    ``fns``: the captured callables. A CUDA graph records raw addresses and holds no reference to the tensors behind
    them, so the captured graph holds the callables (and through them every buffer they read and write) until it is
    released. Without that, a caller that captures several graphs from short-lived closures frees the first graph's
    buffers, the next capture's ``empty_cache`` returns that memory to the driver, and replaying the first graph
    writes to unmapped memory ("an illegal memory access").
    """

    graph: object
    calls: int
    replay_us: float
    fns: list = None


def _release(graph) -> None:
    try:
        graph.reset()  # give the graph's memory pool back now, not at garbage collection
    except Exception:  # noqa: BLE001  (after a failed capture there may be nothing to reset)
        pass


def cuda_healthy() -> bool:
    """False when the CUDA context is broken (a sticky error): nothing after that can be trusted."""
    try:
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False
