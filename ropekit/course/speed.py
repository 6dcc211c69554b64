"""How fast is a kernel against the copy ceiling: the course's measurement, and the grading of its speed exercise.

A RoPE kernel is memory-bound: it reads q and k once and writes them once, and its arithmetic is a few multiplies per
element. Its floor is therefore the time a plain device-to-device copy of the same bytes takes, and its speed is
reported as a share of that copy's bandwidth (the **copy ceiling**), measured in the same call so that both numbers
come from the same GPU in the same state.

* :func:`measure` times one call (``do_bench`` median, the L2 cache flushed before every call, so the data comes from
  DRAM) and the copy ceiling, and returns a :class:`Speed`;
* :func:`grade` compares a :class:`Speed` with the exercise's target (``TARGET``, a share of the ceiling);
* :func:`grade_exercise` is the checker's hook: it builds the exercise's stated shape, checks nothing about values
  (the checker did that) and grades the time. Without a CUDA GPU it says that speed needs one and grades nothing.

The clock is a parameter: anything with ``copy_ceiling() -> {"gbps": ...}`` and ``do_bench_us(fn, warmup_ms,
rep_ms) -> µs`` (``ropekit.bench.timing.GpuTimer`` on a GPU; a fake clock in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TARGET", "Speed", "SpeedGrade", "measure", "grade", "grade_exercise", "grade_speed", "gpu_clock", "QKShape"]

TARGET = 0.80  # the speed exercise's pass mark: this share of the copy ceiling


@dataclass(frozen=True)
class Speed:
    time_us: float  # median time of one call
    bytes_moved: int  # bytes the call must read and write (q and k, in and out)
    ceiling_gbps: float  # the copy ceiling measured in the same call

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.time_us / 1e3

    @property
    def share(self) -> float:
        """Share of the copy ceiling (1.0: as fast as copying the same bytes)."""
        return self.gbps / self.ceiling_gbps

    def __str__(self) -> str:
        return (f"{self.time_us:.1f} µs for {self.bytes_moved / 1e6:.1f} MB: {self.gbps:.0f} GB/s, "
                f"{100 * self.share:.1f} % of the copy ceiling ({self.ceiling_gbps:.0f} GB/s, measured now)")


@dataclass(frozen=True)
class SpeedGrade:
    graded: bool  # False: no GPU, nothing was timed
    ok: bool
    message: str
    speed: Speed | None = None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message


def gpu_clock():
    """The real clock (CUDA only): ``GpuTimer`` with the benchmark harness's default settings."""
    from ..bench.timing import GpuTimer, Settings

    return GpuTimer(Settings())


def measure(run, bytes_moved: int, *, clock=None, ceiling_gbps: float | None = None, warmup_ms: float = 25.0,
            rep_ms: float = 100.0) -> Speed:
    """Time ``run()`` (median) and the copy ceiling, in this order, with ``clock`` (default: the GPU's).

    ``ceiling_gbps``: a ceiling this caller measured earlier in the same run (a sweep measures it once)."""
    clock = gpu_clock() if clock is None else clock
    ceiling = float(clock.copy_ceiling()["gbps"]) if ceiling_gbps is None else float(ceiling_gbps)
    time_us = float(clock.do_bench_us(run, warmup_ms, rep_ms))
    if time_us <= 0 or ceiling <= 0:
        raise ValueError(f"the clock returned a non-positive time ({time_us}) or ceiling ({ceiling})")
    return Speed(time_us, int(bytes_moved), ceiling)


def grade(speed: Speed, target: float = TARGET, shape_words: str = "") -> SpeedGrade:
    where = f" on {shape_words}" if shape_words else ""
    if speed.share >= target:
        return SpeedGrade(True, True, f"Fast enough{where}: {speed} — the target is {100 * target:.0f} %.", speed)
    return SpeedGrade(True, False, (
        f"Correct but not yet fast enough{where}: {speed}; the target is {100 * target:.0f} %. Look at how many bytes "
        "each program has in flight (tile size), how many programs the grid gives each SM, and whether every load "
        "of a warp reads consecutive addresses."), speed)


NO_GPU = ("Speed is graded on a CUDA GPU only (the interpreter's time says nothing about a GPU): on this machine the "
          "checker checked correctness, not speed.")


def grade_exercise(name: str, kernel, *, clock=None, target: float = TARGET) -> SpeedGrade:
    """Grade the speed of exercise ``name``'s ``kernel`` on its stated shape (``Exercise.notes["speed_shape"]``).

    Without ``clock`` this needs a CUDA GPU; on any other machine it returns an ungraded answer that says so. With
    a (fake) ``clock`` the shape is built small on the CPU and only the grading logic runs.
    """
    from .exercises import exercise

    ex = exercise(name)
    shape = ex.notes.get("speed_shape")
    if shape is None:
        raise ValueError(f"exercise {name!r} has no speed target")
    if clock is None and not torch.cuda.is_available():
        return SpeedGrade(False, False, NO_GPU)
    device = "cuda" if clock is None else "cpu"
    inputs = shape.build(device, small=clock is not None)

    def run():
        ex.launch(kernel, *inputs.arguments)

    return grade(measure(run, inputs.bytes_moved, clock=clock), target, shape.words)


@dataclass(frozen=True)
class QKShape:
    """The stated shape of a q+k speed exercise: fresh random q and k, per-sequence offsets, half-width tables."""

    batch: int
    seq: int
    heads_q: int
    heads_k: int
    head_dim: int
    dtype: torch.dtype
    table_len: int = 8192

    @property
    def words(self) -> str:
        return (f"b{self.batch} s{self.seq}, {self.heads_q} q / {self.heads_k} k heads x {self.head_dim}, "
                f"{str(self.dtype).replace('torch.', '')}")

    def build(self, device, *, small: bool = False) -> "QKInputs":
        """Inputs on ``device``; ``small`` keeps the head layout but shrinks batch and sequence (fake-clock tests)."""
        from ..frequencies import cos_sin_table

        batch, seq = (2, 5) if small else (self.batch, self.seq)
        q = torch.randn(batch, seq, self.heads_q, self.head_dim, device=device).to(self.dtype)
        k = torch.randn(batch, seq, self.heads_k, self.head_dim, device=device).to(self.dtype)
        cos, sin = cos_sin_table(self.table_len, self.head_dim, device=device)
        offsets = torch.randint(0, self.table_len - seq, (batch,), device=device, dtype=torch.int32)
        out_q, out_k = torch.empty_like(q), torch.empty_like(k)
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        return QKInputs((q, k, cos, sin, offsets, out_q, out_k), moved)


@dataclass(frozen=True)
class QKInputs:
    arguments: tuple  # (q, k, cos, sin, offsets, out_q, out_k): the exercise's launch takes them in this order
    bytes_moved: int  # q and k read once and written once


def grade_speed(name: str, target: float = TARGET):
    """The checker's ``grade`` hook for exercise ``name``: run after the values are correct, it passes ("correct",
    with the measured speed, or with the note that speed needs a GPU) or fails as "too_slow"."""

    def grade(kernel):
        from .diagnose import Finding

        result = grade_exercise(name, kernel, target=target)
        return Finding("correct" if result.ok or not result.graded else "too_slow", result.message)

    return grade
