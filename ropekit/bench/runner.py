"""The measurement loop: for every case, every implementation — check it, then time it — and one row per number.

A row is a flat dict (``ROW_FIELDS``). Per (case, implementation, direction):

* a ``skipped`` row when the implementation cannot run that case (with the reason), ``error`` when it raised or its
  output failed the check (nothing is timed then), ``not run`` when the time budget ran out;
* otherwise one ``ok`` row per residency: ``dram`` always (do_bench, graph replay, eager), plus ``l2`` for cases whose
  inputs and outputs fit in L2 (same buffers every call). A DRAM row rotates through enough fresh buffer sets that
  q and k exceed ``dram_factor`` x L2 (the small cases, and large ones under that size: see ``dram_sets``).

The primary time (``time_us``) is the graph replay (backward rows too: autograd's backward is captured on the stream
its forward ran on), do_bench for sweep rows and for what a graph cannot capture; GB/s, % of the copy ceiling and the
ratio to the fastest peer are derived from it, comparing only numbers of the same clock and residency. The small
cases' rows are also divided by the launch-chain floor (``floor``), timed on the graph clock in the same rounds.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback

import torch

from ..progress import Progress as StageProgress
from .cases import LAUNCH_FLOOR_CASES, Case
from .impls import BACKWARD, FORWARD, Impl
from .inputs import check_outputs, expected_output, make_data, make_tables, seed_for

__all__ = ["ROW_FIELDS", "LATER_ROW_FIELDS", "Runner", "BenchRefused", "refusal_reason", "residencies", "dram_sets",
           "derive_metrics", "Progress"]

ROW_FIELDS = (
    "case", "group", "impl", "kind", "direction", "residency", "status", "reason", "inplace", "bytes",
    "n_buffer_sets", "do_bench_us", "graph_us", "graph_spread", "graph_calls", "eager_us", "eager_spread",
    "eager_calls", "time_us", "time_source", "gbps", "pct_ceiling", "ceiling_gbps", "fastest_peer",
    "vs_fastest_peer", "fastest_peer_eager", "eager_vs_fastest_peer", "check_error", "graph_error",
    "vs_launch_floor",
)
# fields added after documents were first published: a document from before them still validates without them
LATER_ROW_FIELDS = ("vs_launch_floor",)
STATUSES = ("ok", "skipped", "error", "not run")
RESIDENCIES = ("l2", "dram")


class BenchRefused(RuntimeError):
    """Raised instead of timing on a machine without a GPU."""


class Aborted(RuntimeError):
    """The CUDA context is broken; nothing measured after this could be trusted."""


def refusal_reason() -> str | None:
    from .. import device

    if device.DEVICE != "cuda":
        return ("no CUDA GPU in this process: ropekit runs its kernels through the Triton interpreter here "
                "(TRITON_INTERPRET=1), which is correct but is not a benchmark, so nothing is timed. "
                "Run `python -m ropekit bench` on a GPU machine (or `--render` a published JSON here).")
    return None


def residencies(case: Case, l2_bytes: int) -> tuple[str, ...]:
    """("l2", "dram") for cases whose inputs and outputs fit in L2, else ("dram",) (the tensors exceed L2)."""
    if case.group == "sweep":
        return ("dram",)
    return ("l2", "dram") if case.working_set_bytes <= l2_bytes else ("dram",)


def dram_sets(case: Case, l2_bytes: int, factor: float) -> int:
    """Buffer sets a DRAM timing rotates through: enough that their q and k total more than ``factor`` x L2.

    One set when q and k alone already do. Not only the cases that fit in L2 need several: in place, a call touches
    only its q and k, and a case a little larger than L2 (fp32: 67 MB against 50 MB) finds part of the previous
    call's lines still cached (the L2 does not evict strictly least-recently-used first), by an amount that depends
    on where the allocator placed the buffers and on the kernel's cache hints (docs/tuning.md#benchmark-harness). Every
    implementation of a case gets the same number of sets.
    """
    if case.qk_bytes > factor * l2_bytes:
        return 1
    return max(2, math.ceil(factor * l2_bytes / case.qk_bytes) + 1)


def new_row(case: Case, impl: Impl, direction: str, **fields) -> dict:
    row = dict.fromkeys(ROW_FIELDS)
    row.update(case=case.name, group=case.group, impl=impl.name, kind=impl.kind, direction=direction)
    row.update(fields)
    return row


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Progress(StageProgress):
    """The run's progress on stderr: a bar over every measured item on a terminal (each item's numbers beside it);
    in a log, one line per case when it is done."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        super().__init__(total, "bench", stream=stream, enabled=enabled)
        self.start = time.perf_counter()

    def note(self, message: str) -> None:
        if self.bar is not None:  # a detail of the run: shown above the bar, not written to logs
            self.bar.write(f"[bench] {message}", file=self.stream)

    def step(self, case: str, impl: str, direction: str, summary: str) -> None:  # type: ignore[override]
        super().step(f"{case} {direction[:3]} {impl}: {summary}")

    def case_done(self, case: str, rows: list[dict]) -> None:
        ok = sum(r["status"] == "ok" for r in rows)
        self.stage(f"[bench] {case}: {ok} of {len(rows)} measurements ({time.perf_counter() - self.start:.0f} s)")


def summarize(rows: list[dict]) -> str:
    parts = []
    for row in rows:
        if row["status"] != "ok":
            parts.append(f"{row['status']}: {row['reason']}")
            continue
        clocks = [f"{name} {row[key]:.1f}us" for name, key in
                  (("graph", "graph_us"), ("do_bench", "do_bench_us"), ("eager", "eager_us")) if row[key] is not None]
        parts.append(f"{row['residency']}: " + " ".join(clocks))
    return " | ".join(parts)


class Runner:
    """Runs ``cases`` x ``impls`` with a timer (``GpuTimer`` on a GPU; tests pass a fake one on the CPU)."""

    def __init__(self, cases, impls, *, settings, timer, device, progress: Progress | None = None,
                 on_case_done=None, started_at: float | None = None, ceiling_gbps: float | None = None):
        self.cases = list(cases)
        self.ceiling_gbps = ceiling_gbps  # sizes the CUDA graphs (see _device_estimate_us)
        self.impls = list(impls)
        self.settings = settings
        self.timer = timer
        self.device = device
        self.on_case_done = on_case_done
        self.rows: list[dict] = []
        self.graphs_enabled = True
        self.l2_bytes, self.l2_source = timer.l2_bytes()
        directions = sum(2 if case.backward else 1 for case in self.cases)
        self.progress = progress if progress is not None else Progress(directions * len(self.impls))
        self.unavailable: dict[str, str | None] = {}
        self.aborted: str | None = None
        self.started_at = started_at  # the time budget counts from here (default: when run() starts)
        self.copy_floors: dict[str, dict] = {}  # case name -> the same bytes copied (see copy_floor)
        self.launch_floors: dict[str, dict] = {}  # case name -> the launch-chain floor (see _launch_floor)

    def probe(self) -> None:
        """Ask every implementation once whether it can run here (ropekit.cuda builds now, which can take a while)."""
        for impl in self.impls:
            if impl.name == "ropekit-cuda":
                self.progress.note("probing ropekit.cuda (its first use compiles the extension) ...")
            started = time.perf_counter()
            try:
                self.unavailable[impl.name] = impl.available()
            except Exception as error:  # noqa: BLE001
                self.unavailable[impl.name] = f"{type(error).__name__}: {error}"
            state = self.unavailable[impl.name] or "available"
            self.progress.note(f"{impl.name}: {state} ({time.perf_counter() - started:.1f} s)")

    def run(self) -> list[dict]:
        if not self.unavailable:
            self.probe()
        start = self.started_at if self.started_at is not None else time.perf_counter()
        for case in self.cases:
            floor = self.copy_floor(case)
            if floor is not None:
                self.copy_floors[case.name] = floor
                self.progress.note(f"{case.name}: the same bytes copied by torch take {floor['graph_us']:.1f} us")
            tables = make_tables(case, self.device)
            for direction in (FORWARD, BACKWARD) if case.backward else (FORWARD,):
                # every implementation's graphs are captured first and replayed together afterwards, in
                # interleaved rounds (GpuTimer.replay_rounds): the same stretch of the run times them all
                pending: list[tuple[dict, object, list]] = []  # (row, captured graph, what the graph reads)
                if direction == FORWARD:
                    self._launch_floor(case, start, pending)
                for impl in self.impls:
                    rows = self._item(case, tables, impl, direction, start, pending)
                    self.rows.extend(rows)
                    self.progress.step(case.name, impl.name, direction, summarize(rows))
                    if self.aborted:
                        break
                self._replay(case, direction, pending)
                if self.aborted:
                    break
            del tables
            self.progress.case_done(case.name, [r for r in self.rows if r.get("case") == case.name])
            if torch.device(self.device).type == "cuda" and not self.aborted:
                torch.cuda.empty_cache()
            if self.on_case_done is not None:
                self.on_case_done(self.rows)
            if self.aborted:
                break
        return self.rows

    def copy_floor(self, case) -> dict | None:
        """The case's own floor: its q and k copied into fresh tensors with ``torch.Tensor.copy_`` (the same bytes
        read and written as an out-of-place rotation), graph clock. Large forward cases only (DRAM-resident)."""
        if case.group != "main" or "l2" in residencies(case, self.l2_bytes):
            return None
        def copier(data):
            out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)

            def copy():
                out_q.copy_(data.q)
                out_k.copy_(data.k)
            return copy

        try:
            seed = seed_for(case.name, "copy", FORWARD)
            n_sets = dram_sets(case, self.l2_bytes, self.settings.dram_factor)  # as the implementations' DRAM rows
            copies = [copier(make_data(case, self.device, seed + i)) for i in range(n_sets)]
            estimate = self.timer.do_bench_us(copies[0], self.settings.warmup_ms, self.settings.rep_ms)
            graph_us, spread, calls = self.timer.graph_us(copies, estimate)
        except Exception as error:  # noqa: BLE001  (a floor is context; its failure must not end the run)
            return {"graph_us": None, "error": f"{type(error).__name__}: {error}"[:300]}
        return {"graph_us": graph_us, "graph_spread": spread, "graph_calls": calls, "n_buffer_sets": n_sets,
                "bytes": case.moved_bytes(inplace=False), "method": "torch copy_ of q and k into new tensors"}

    def _launch_floor(self, case, start, pending: list) -> None:
        """Capture the launch-chain floor (``floor``) for a case in LAUNCH_FLOOR_CASES into the case's forward
        rounds: a graph of as many calls as the case's rows get, replayed interleaved with theirs."""
        budget = self.settings.time_budget_s
        if case.group != "main" or case.name not in LAUNCH_FLOOR_CASES or (
                budget and time.perf_counter() - start > budget):
            return
        from .floor import PROGRAMS, floors, launch_chain

        # the floor, and where ropekit's small grids launch programmatically the same chain launched that way, kept
        # inside it ("dependent")
        for name, method, dependent in floors(self.device):
            record = {"impl": name, "residency": "l2", **({} if dependent else {"programs": PROGRAMS}),
                      "method": method, "graph_us": None}
            if dependent:
                self.launch_floors[case.name]["dependent"] = record
            else:
                self.launch_floors[case.name] = record
            try:
                chain = launch_chain(self.device, seed_for(case.name, "launch-chain floor"), dependent)
                captured = self.timer.capture([chain], self._device_estimate_us(case, False, 1.0))
            except Exception as error:  # noqa: BLE001  (a floor is context; its failure must not end the run)
                record["error"] = f"{type(error).__name__}: {error}"[:300]
                try:
                    self._after_graph_failure()
                except Aborted as broken:
                    self.aborted = str(broken)
                return
            pending.append((record, captured, [chain]))

    def _item(self, case, tables, impl, direction, start, pending: list) -> list[dict]:
        reason = self.unavailable.get(impl.name) or impl.supports(case, direction)
        if reason:
            return [new_row(case, impl, direction, status="skipped", reason=reason)]
        budget = self.settings.time_budget_s
        if budget and time.perf_counter() - start > budget:
            return [new_row(case, impl, direction, status="not run",
                            reason=f"time budget of {budget:g} s used up (--time-budget)")]
        try:
            context = torch.no_grad() if direction == FORWARD else contextlib.nullcontext()
            with self._stream_for(direction), context:
                return self._measure(case, tables, impl, direction, pending)
        except Aborted as error:
            self.aborted = str(error)
            return [new_row(case, impl, direction, status="error", reason=str(error))]
        except Exception as error:  # noqa: BLE001  (one implementation's failure must not end the run)
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            declined = isinstance(error, impl.declines_with)
            row = new_row(case, impl, direction, status="skipped" if declined else "error",
                          reason=(f"declined: {error}" if declined else detail)[:500])
            if torch.device(self.device).type == "cuda":
                from .timing import cuda_healthy
                if not cuda_healthy():
                    self.aborted = f"CUDA context broken after {case.name} / {impl.name}: {detail[:300]}"
            return [row]

    def _stream_for(self, direction):
        """Backward rows run on a side stream of their own: autograd runs each backward kernel on the stream of its
        forward, and a CUDA graph can capture a side stream but not the default one, so recording the forward
        there lets the graph capture ``torch.autograd.grad`` (host work of the autograd engine excluded, as for
        every graph row; the do_bench and eager clocks keep it)."""
        if direction != BACKWARD or torch.device(self.device).type != "cuda":
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.Stream())

    def _measure(self, case, tables, impl, direction, pending: list) -> list[dict]:
        """Check, then time with do_bench and the eager clock; capture the graphs, which ``_replay`` times once
        every implementation of the case and direction has been captured (appended to ``pending``)."""
        backward = direction == BACKWARD
        seed = seed_for(case.name, impl.name, direction)
        data = make_data(case, self.device, seed, backward=backward)
        prepared = impl.build(case, tables, data, direction)

        # Correctness first: the expected output is computed before the call (in-place implementations overwrite).
        sources = (data.grad_q, data.grad_k) if backward else (data.q, data.k)
        expected = [expected_output(case, tables, x, conjugate=backward) for x in sources]
        result = prepared.fn()
        _sync(self.device)
        check_error, message = check_outputs(case, prepared.outputs(result), expected)
        del result, expected
        common = dict(inplace=prepared.inplace, bytes=case.moved_bytes(prepared.inplace),
                      check_error=check_error if math.isfinite(check_error) else None)  # JSON has no Infinity
        if message:
            return [new_row(case, impl, direction, status="error", reason=f"wrong result: {message}", **common)]

        s = self.settings
        if case.group == "sweep":
            do_bench_us = self.timer.do_bench_us(prepared.fn, s.sweep_warmup_ms, s.sweep_rep_ms)
            return [new_row(case, impl, direction, status="ok", residency="dram", n_buffer_sets=1,
                            do_bench_us=do_bench_us, **common)]

        do_bench_us = self.timer.do_bench_us(prepared.fn, s.warmup_ms, s.rep_ms)
        rows = []
        for residency in residencies(case, self.l2_bytes):
            fns = [prepared.fn]
            keep_alive = []
            if residency == "dram":
                for i in range(1, dram_sets(case, self.l2_bytes, s.dram_factor)):
                    extra = make_data(case, self.device, seed + i, backward=backward)
                    keep_alive.append(extra)
                    fns.append(impl.build(case, tables, extra, direction).fn)
            row = new_row(case, impl, direction, status="ok", residency=residency, n_buffer_sets=len(fns),
                          do_bench_us=do_bench_us if residency == "dram" else None, **common)
            row["eager_us"], row["eager_spread"], row["eager_calls"] = self.timer.eager_us(fns, do_bench_us)
            if prepared.graph_safe and self.graphs_enabled:
                try:
                    captured = self.timer.capture(fns, self._device_estimate_us(case, prepared.inplace, do_bench_us))
                    pending.append((row, captured, [data, prepared, fns, keep_alive]))  # all the graph reads
                except Exception as error:  # noqa: BLE001
                    row["graph_error"] = f"{type(error).__name__}: {error}"[:300]
                    self._after_graph_failure()
            rows.append(row)
            del fns, keep_alive
        return rows

    def _replay(self, case, direction, pending: list) -> None:
        """Time the captured graphs of one case and direction together (interleaved rounds) into their rows."""
        if not pending:
            return
        try:
            results = self.timer.replay_rounds([captured for _, captured, _ in pending])
        except Exception as error:  # noqa: BLE001
            for row, _, _ in pending:
                row["graph_error"] = f"{type(error).__name__}: {error}"[:300]
            try:
                self._after_graph_failure()
            except Aborted as broken:
                self.aborted = str(broken)
            return
        finally:
            pending_rows = [row for row, _, _ in pending]
            pending.clear()  # the graphs are released; their buffers may go too
        for row, (median, spread, calls) in zip(pending_rows, results):
            row["graph_us"], row["graph_spread"], row["graph_calls"] = median, spread, calls
        self.progress.note(f"{case.name} {direction[:3]} graph clock ({self.settings.graph_rounds} interleaved "
                           "rounds): " + ", ".join(f"{row['impl']} {row['residency']} {row['graph_us']:.2f}us"
                                                   for row in pending_rows))

    def _device_estimate_us(self, case, inplace: bool, do_bench_us: float) -> float:
        """The case's bytes at the copy ceiling: how long a call at the memory-bandwidth limit takes on the device.

        Sizes the graphs: the same for every implementation of a case (do_bench of a tiny call measures the host).
        Without a ceiling (tests with a fake timer), the do_bench time.
        """
        if not self.ceiling_gbps:
            return do_bench_us
        return case.moved_bytes(inplace) / (self.ceiling_gbps * 1e9) * 1e6

    def _after_graph_failure(self) -> None:
        if torch.device(self.device).type != "cuda":
            return
        from .timing import cuda_healthy

        if not cuda_healthy():
            raise Aborted("the CUDA context broke during a graph capture")


# --------------------------------------------------------------------------------------------------------------------
# Derived numbers
# --------------------------------------------------------------------------------------------------------------------

def _primary(row: dict) -> tuple[float | None, str | None]:
    order = ("graph_us", "do_bench_us", "eager_us")
    if row["group"] == "sweep":
        order = ("do_bench_us", "graph_us", "eager_us")
    for key in order:
        if row.get(key) is not None:
            return row[key], key[: -len("_us")]
    return None, None


def derive_metrics(rows: list[dict], ceiling_gbps: float | None, launch_floors: dict | None = None) -> list[dict]:
    """Fill time_us/time_source, GB/s, % of the copy ceiling, the ratios to the fastest peer, and the graph time over
    the launch-chain floor (rows of a case in ``launch_floors``, case name -> the floor with its graph_us), in place."""
    for row in rows:
        if row["status"] != "ok":
            continue
        floor_us = ((launch_floors or {}).get(row["case"]) or {}).get("graph_us")
        if floor_us and row.get("graph_us"):
            row["vs_launch_floor"] = row["graph_us"] / floor_us
        row["time_us"], row["time_source"] = _primary(row)
        if row["time_us"]:
            row["gbps"] = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
            if ceiling_gbps:
                row["ceiling_gbps"] = ceiling_gbps
                row["pct_ceiling"] = 100.0 * row["gbps"] / ceiling_gbps
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["status"] == "ok":
            groups.setdefault((row["case"], row["direction"], row["residency"]), []).append(row)
    for members in groups.values():
        peers = [r for r in members if r["kind"] == "peer"]
        for row in members:
            fastest = _fastest(peers, f"{row['time_source']}_us") if row["time_source"] else None
            if fastest is not None:
                row["fastest_peer"] = fastest["impl"]
                row["vs_fastest_peer"] = row["time_us"] / fastest[f"{row['time_source']}_us"]
            fastest_eager = _fastest(peers, "eager_us")
            if fastest_eager is not None and row["eager_us"] is not None:
                row["fastest_peer_eager"] = fastest_eager["impl"]
                row["eager_vs_fastest_peer"] = row["eager_us"] / fastest_eager["eager_us"]
    return rows


def _fastest(rows: list[dict], key: str) -> dict | None:
    timed = [r for r in rows if r.get(key) is not None]
    return min(timed, key=lambda r: r[key]) if timed else None
