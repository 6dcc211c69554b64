"""Counting outcomes, and running independent jobs, optionally spread over worker processes.

Every new Triton kernel variant is a compile (about a second of one CPU core); the property run and TE's matrix need a
few hundred. Jobs that share variants (one family; one TE dtype/size/pairing group) go to the same worker, so each
variant is compiled once, in parallel with the others. A job is ``(function, item, backends, options)``: a worker
calls ``function(item, backends, **options)``, which returns ``{backend: failure messages, or "unsupported: why"}``
(functions are pickled by name, so they live at module level).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from typing import Callable, Optional

from .common import Unsupported

__all__ = ["MAX_FAILURES_KEPT", "Tally", "run_job", "run_jobs", "worker_main"]

MAX_FAILURES_KEPT = 25


class Tally:
    """Counts of one section: passes, failures (the first few kept in full), unsupported per backend."""

    def __init__(self):
        self.checked = 0
        self.failed = 0
        self.unsupported: Counter = Counter()
        self.not_run = 0  # jobs left when a section's time budget ran out
        self.failures: list = []

    def record(self, what: str, backend: str, fn: Callable[[], list]) -> Optional[list]:
        """Run ``fn`` (returns failure messages) and count the outcome; returns the messages (None: unsupported)."""
        try:
            messages = fn()
        except Unsupported as why:
            self.add_unsupported(backend, str(why))
            return None
        except Exception as error:  # a crash is a failure of this configuration, not of the run
            messages = [f"raised {type(error).__name__}: {error}"]
            if os.environ.get("ROPEKIT_STRESS_TRACEBACK"):
                traceback.print_exc()
        self.add(what, backend, messages)
        return messages

    def add(self, what: str, backend: str, messages: list) -> None:
        self.checked += 1
        if messages:
            self.failed += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append({"case": what, "backend": backend, "messages": messages[:4]})

    def add_unsupported(self, backend: str, why: str) -> None:
        self.unsupported[f"{backend}: {why[:120]}"] += 1

    def add_outcomes(self, what: str, outcome: Optional[dict]) -> None:
        """A job's outcome: {backend: failure messages, or "unsupported: why"}; None: not run (time budget)."""
        if outcome is None:
            self.not_run += 1
            return
        for backend, result in outcome.items():
            if isinstance(result, str):
                self.add_unsupported(backend, result.removeprefix("unsupported: "))
            else:
                self.add(what, backend, result)

    def as_dict(self) -> dict:
        return {"checked": self.checked, "passed": self.checked - self.failed, "failed": self.failed,
                "unsupported": dict(self.unsupported), "not_run": self.not_run, "failures": self.failures}


def run_job(job) -> dict:
    """One job -> {backend: list of failure messages, or "unsupported: why"}."""
    function, item, backends, options = job
    return function(item, backends, **options)


def run_jobs(jobs: list, groups: list, workers: int = 1, budget_s: Optional[float] = None) -> list:
    """Run ``jobs`` and return their outcomes in order (None for a job not started within ``budget_s``).

    With ``workers`` > 1, the jobs of one group run in the same ``python -m ropekit.reliability.run`` process (groups
    spread over the workers, largest first; inside a worker the groups take turns, so that a run cut short by the
    budget still covers every group). Each worker streams its outcomes to a file, so a killed worker loses nothing
    it finished.
    """
    deadline = None if budget_s is None else time.time() + budget_s
    if workers <= 1 or len(set(groups)) <= 1:
        return [run_job(job) if deadline is None or time.time() < deadline else None for job in jobs]
    members = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    loads, shards = [0] * workers, [[] for _ in range(workers)]
    for group in sorted(members, key=lambda g: -len(members[g])):
        w = loads.index(min(loads))
        shards[w].append(members[group])
        loads[w] += len(members[group])
    outcomes: list = [None] * len(jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // workers)))
    with tempfile.TemporaryDirectory(prefix="ropekit-stress-") as tmp:
        procs = []
        for w, group_lists in enumerate(shards):
            # interleave this worker's groups: job 0 of every group, then job 1 of every group, ...
            shard = [i for rank in range(max(map(len, group_lists), default=0)) for g in group_lists
                     if rank < len(g) for i in (g[rank],)]
            if not shard:
                continue
            jobs_path, out_path, log_path = (os.path.join(tmp, f"{w}.{ext}") for ext in ("jobs", "out", "log"))
            with open(jobs_path, "wb") as handle:
                pickle.dump(([jobs[i] for i in shard], deadline), handle)
            log = open(log_path, "w")
            procs.append((shard, out_path, log_path, log, subprocess.Popen(
                [sys.executable, "-m", "ropekit.reliability.run", jobs_path, out_path], stdout=log,
                stderr=subprocess.STDOUT, env=env)))
        hard_stop = time.time() + (budget_s if budget_s is not None else 3600) + 120
        for shard, out_path, log_path, log, proc in procs:
            try:
                proc.wait(timeout=max(1.0, hard_stop - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            finished = []
            if os.path.exists(out_path):
                with open(out_path, "rb") as handle:
                    while True:
                        try:
                            finished.append(pickle.load(handle))
                        except (EOFError, pickle.UnpicklingError):
                            break
            for index, outcome in zip(shard, finished):
                outcomes[index] = outcome
            if proc.returncode != 0:
                with open(log_path) as handle:
                    tail = handle.read()[-600:]
                if len(finished) < len(shard):  # the job that was running when the worker died failed
                    crashed = shard[len(finished)]
                    outcomes[crashed] = {b: [f"worker exited with {proc.returncode}: {tail}"]
                                         for b in jobs[crashed][2]}
    return outcomes


def worker_main(jobs_path: str, out_path: str) -> int:
    """The worker process: run the pickled jobs until the deadline, appending each outcome to ``out_path``."""
    with open(jobs_path, "rb") as handle:
        jobs, deadline = pickle.load(handle)
    with open(out_path, "wb") as out:
        for job in jobs:
            outcome = run_job(job) if deadline is None or time.time() < deadline else None
            pickle.dump(outcome, out)
            out.flush()
    return 0


if __name__ == "__main__":
    # Run the imported module's worker, so that pickled jobs and this code share one set of classes.
    from ropekit.reliability import run as _run

    sys.exit(_run.worker_main(*sys.argv[1:3]))
