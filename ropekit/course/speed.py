"""The speed exercise's grade: a correct kernel passes when it reaches a share of the copy ceiling.

A RoPE kernel is memory-bound: it reads q and k once and writes them once, and its arithmetic is a few multiplies per
element. Its floor is therefore the time a plain device-to-device copy of the same bytes takes, and its speed is
reported as a share of that copy's bandwidth (the **copy ceiling**). The timing is
:func:`ropekit.course.measure.time_launch` (CUDA-graph replay on :class:`ropekit.bench.timing.GpuTimer`); for the grade
the ceiling is measured again in the same call, so that both numbers come from the same GPU in the same state.

* :func:`grade` compares a :class:`~ropekit.course.measure.Measurement` with the exercise's target (``TARGET``);
* :func:`grade_exercise` builds the exercise's stated shape, times the reader's kernel and grades it. Without a CUDA
  GPU it says that speed needs one and grades nothing.

The timer is a parameter (anything :func:`~ropekit.course.measure.time_launch` accepts): ``GpuTimer`` on a GPU, a
fake one in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import device as _device
from . import measure

__all__ = ["TARGET", "SpeedGrade", "grade", "grade_exercise", "grade_speed", "model_words", "QKShape"]

TARGET = 0.80  # the speed exercise's pass mark: this share of the copy ceiling


@dataclass(frozen=True)
class SpeedGrade:
    graded: bool  # False: no GPU, nothing was timed
    ok: bool
    message: str
    speed: measure.Measurement | None = None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message


def _words(speed: measure.Measurement) -> str:
    return (f"{speed.time_us:.1f} µs for {speed.bytes_moved / 1e6:.1f} MB: {speed.gbps:.0f} GB/s, "
            f"{speed.pct_ceiling:.1f} % of the copy ceiling ({speed.ceiling_gbps:.0f} GB/s, measured now)")


def grade(speed: measure.Measurement, target: float = TARGET, shape_words: str = "") -> SpeedGrade:
    where = f" on {shape_words}" if shape_words else ""
    if speed.share >= target:
        return SpeedGrade(True, True, f"Fast enough{where}: {_words(speed)} — the target is {100 * target:.0f} %.",
                          speed)
    return SpeedGrade(True, False, (
        f"Correct but not yet fast enough{where}: {_words(speed)}; the target is {100 * target:.0f} %. Look at how "
        "many bytes each program has in flight (tile size), how many programs the grid gives each SM, and whether "
        "every load of a warp reads consecutive addresses."), speed)


NO_GPU = ("Speed is graded on a CUDA GPU only (the interpreter's time says nothing about a GPU): on this machine the "
          "checker checked correctness, not speed.")


def model_words(kernel, shape: "QKShape", target: float = TARGET) -> str:
    """What the bytes-in-flight model (notebooks 02 and 04) predicts for the reader's tile on the stated shape, and
    which way to move when that is below the target: a guide before a GPU is at hand, and beside a measurement that
    misses."""
    from . import ablations, perf_model
    from .exercises import qk_grid, tile_of

    def count(n: int, word: str) -> str:
        return f"{n} {word}" + ("" if n == 1 else "s")

    block_s, block_h, warps = tile_of(kernel)
    programs = math.prod(qk_grid(shape.batch, shape.seq, shape.heads_q, shape.heads_k, block_s, block_h))
    per_program = block_s * block_h * shape.head_dim * shape.dtype.itemsize
    launch = perf_model.Launch(programs=programs, num_warps=warps, bytes_in_flight_per_program=per_program)
    device = perf_model.device_model(ablations.load())
    in_flight = perf_model.bytes_in_flight_per_sm(launch, device)
    needed = device.needed_bytes_in_flight_per_sm
    predicted = perf_model.predicted_pct(launch, device)
    resident = perf_model.resident_programs(launch, device)
    per_thread = block_s * block_h * shape.head_dim // (32 * warps)
    words = (f"The model for your tile ({count(block_s, 'token')} x {count(block_h, 'head')} a program, "
             f"{count(warps, 'warp')}; the whole tile is one step's loads): {per_program} B in flight a program, "
             f"{resident} programs resident an SM, so {in_flight / 1024:.1f} KiB "
             f"an SM against the {needed / 1024:.1f} KiB Little's law asks ({device.ceiling_gbps:.0f} GB/s over "
             f"{device.n_sms} SMs x {device.latency_ns:.0f} ns, {device.name}): it predicts {predicted:.0f} % of the "
             f"copy ceiling.")
    if predicted < 100 * target:
        # More bytes a program is the one lever: notebook 02's ablation measured fewer warps a program (more
        # programs an SM at the same bytes each) giving no speed, so the hint never suggests it.
        words += (f" That is below the {100 * target:.0f} % target, which asks for about "
                  f"{target * needed / 1024:.1f} KiB an SM: more bytes a program (BLOCK_S x BLOCK_H).")
    values = f"about {count(per_thread, 'value')}" if per_thread else "under one value"
    words += (f" The model leaves registers out: each thread holds {values} of q or k here, and a tile that "
              "needs many registers holds fewer programs an SM than the model counts (notebook 04's sweep measured "
              "its largest tiles slower).")
    return words


def grade_exercise(name: str, kernel, *, timer=None, target: float = TARGET) -> SpeedGrade:
    """Grade the speed of exercise ``name``'s ``kernel`` on its stated shape (``Exercise.notes["speed_shape"]``).

    Without ``timer`` this needs a CUDA GPU; on any other machine it returns an ungraded answer that says so. With
    a (fake) ``timer`` the shape is built small on the device ropekit's kernels run on (``ropekit.device.DEVICE``)
    and only the grading logic runs.
    """
    from .exercises import exercise

    ex = exercise(name)
    shape = ex.notes.get("speed_shape")
    if shape is None:
        raise ValueError(f"exercise {name!r} has no speed target")
    model = model_words(kernel, shape, target)
    if timer is None and not torch.cuda.is_available():
        return SpeedGrade(False, False, f"{NO_GPU}\n{model}")
    device = "cuda" if timer is None else _device.DEVICE
    inputs = shape.build(device, small=timer is not None)

    def run():
        ex.launch(kernel, *inputs.arguments)

    measure.copy_ceiling(timer, fresh=True)  # the ceiling of this call, not of an earlier one
    result = grade(measure.time_launch(run, inputs.bytes_moved, label=name, timer=timer), target, shape.words)
    if result.ok:
        return result
    return SpeedGrade(result.graded, False, f"{result.message}\n{model}", result.speed)


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
        """Inputs on ``device``; ``small`` keeps the head layout but shrinks batch and sequence (fake-timer tests)."""
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
