"""The speed exercise's grade: a correct kernel passes when it reaches a share of the copy ceiling.

A RoPE kernel is memory-bound: it reads q and k once and writes them once, and its arithmetic is a few multiplies per
element. Its floor is therefore the time a plain device-to-device copy of the same bytes takes, and its speed is
reported as a share of that copy's bandwidth (the **copy ceiling**). The timing is
:func:`ropekit.course.measure.time_launch` (CUDA-graph replay on :class:`ropekit.bench.timing.GpuTimer`); for the grade
the ceiling is measured again in the same call, so that both numbers come from the same GPU in the same state.

* :func:`grade` compares a :class:`~ropekit.course.measure.Measurement` with the exercise's target (``TARGET``);
* :func:`grade_exercise` builds the exercise's stated shape, times the reader's kernel and grades it. Without a CUDA
  GPU it says that speed needs one and grades nothing;
* :func:`grade_prediction` grades the reader's *prediction* of the share their tile reaches: against this run on a
  GPU, and on a CPU against the stored measurements of the reference tiles (``data/reference_tiles.json``, written on
  an H100 and an H200 by ``python -m ropekit.course.reference_tiles``), beside the model's error on every such tile,
  each GPU's model on that GPU's own facts (:func:`gpu_model`);
* :func:`grade_stretch` asks for ``STRETCH`` of the ceiling, measured on a GPU, never predicted: a kernel changed
  beyond the solution's tile cannot be judged from the reference tiles, which show what a tile alone reaches.

The timer is a parameter (anything :func:`~ropekit.course.measure.time_launch` accepts): ``GpuTimer`` on a GPU, a
fake one in the tests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import device as _device
from . import measure

__all__ = ["TARGET", "STRETCH", "PREDICTION_TOLERANCE", "GPUS", "REFERENCE_TILES", "REFERENCE_DATA", "SpeedGrade",
           "grade", "grade_exercise", "grade_speed", "grade_prediction", "grade_stretch", "model_words", "model_pct",
           "gpu_model", "load_reference_tiles", "reference_table", "QKShape"]

TARGET = 0.80  # the speed exercise's pass mark: this share of the copy ceiling
STRETCH = 0.97  # the stretch target, measured on a GPU; the stored reference tiles show what a tile alone reaches
PREDICTION_TOLERANCE = 5.0  # points of %: a prediction this close to the measurement is graded right
GPUS = ("H100", "H200")  # the GPUs the reference tiles are stored for (matched in the device's name)
# (BLOCK_S, BLOCK_H, NUM_WARPS) tiles of the solution's kernel that reference_tiles measures: the template's 1 x 1,
# the solution's 4 x 4, and changes of one or two of its constants around them.
REFERENCE_TILES = ((1, 1, 4), (1, 4, 4), (2, 4, 4), (4, 4, 4), (8, 4, 4), (16, 4, 4), (4, 2, 4), (4, 8, 4),
                   (2, 8, 4), (4, 4, 8))
REFERENCE_DATA = Path(__file__).parent / "data" / "reference_tiles.json"


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
          "checker checked correctness, not speed. speed.grade_prediction grades your prediction of it against "
          "stored measurements instead.")


def _tile_launch(tile: tuple[int, int, int], shape: "QKShape"):
    from . import perf_model
    from .exercises import qk_grid

    block_s, block_h, warps = tile
    programs = math.prod(qk_grid(shape.batch, shape.seq, shape.heads_q, shape.heads_k, block_s, block_h))
    per_program = block_s * block_h * shape.head_dim * shape.dtype.itemsize
    return perf_model.Launch(programs=programs, num_warps=warps, bytes_in_flight_per_program=per_program)


def _device_model():
    """The model of the GPU this runs on, where it is one of :data:`GPUS`; else the course's (its ablation run's
    device, or assumed H100 figures)."""
    from . import ablations, perf_model

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for gpu in GPUS:
            if gpu in name:
                return gpu_model(gpu)
    return perf_model.device_model(ablations.load())


def gpu_model(gpu: str, runs: dict | None = None):
    """The model's facts for ``gpu`` (one of :data:`GPUS`), each from that GPU alone: its data sheet's SMs and
    bandwidth with an assumed latency (``perf_model.PUBLISHED``); where the course's ablation run was on it, that
    run's SMs, copy ceiling and fitted latency; where a reference tile run of it is stored (``runs``, as
    :func:`load_reference_tiles` returns them; default: the stored file), that run's copy ceiling, which its tiles'
    % are shares of."""
    from . import ablations, perf_model

    facts = next(facts for name, facts in perf_model.PUBLISHED.items() if gpu in name)
    measured = ablations.load()
    if measured and gpu in measured.get("device", ""):
        facts = perf_model.device_model(measured, base=facts)
    run = (load_reference_tiles() if runs is None else runs).get(gpu)
    if run is not None:
        facts = replace(facts, name=run["device"], ceiling_gbps=run["ceiling_gbps"],
                        bandwidth_source="measured: the copy ceiling of the stored reference tiles' run")
    return facts


def model_pct(tile: tuple[int, int, int], shape: "QKShape", device=None) -> float:
    """The bytes-in-flight model's % of the copy ceiling for a (BLOCK_S, BLOCK_H, NUM_WARPS) tile on ``shape``, on
    ``device``'s facts (a ``perf_model.DeviceModel``; default: the GPU this runs on, else the course's model)."""
    from . import perf_model

    return perf_model.predicted_pct(_tile_launch(tile, shape), device or _device_model())


def model_words(kernel, shape: "QKShape", target: float = TARGET) -> str:
    """What the bytes-in-flight model (notebooks 02 and 04) predicts for the reader's tile on the stated shape, and
    which way to move when that is below the target: a guide before a GPU is at hand, and beside a measurement that
    misses."""
    from . import perf_model
    from .exercises import tile_of

    def count(n: int, word: str) -> str:
        return f"{n} {word}" + ("" if n == 1 else "s")

    block_s, block_h, warps = tile_of(kernel)
    launch = _tile_launch((block_s, block_h, warps), shape)
    per_program = launch.bytes_in_flight_per_program
    device = _device_model()
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


# --- the stored reference tiles (graded on a CPU) --------------------------------------------------------------------

def load_reference_tiles(path: Path | str | None = None) -> dict:
    """``{gpu: run}`` for the GPUs of :data:`GPUS` that have a stored run (none: ``{}``); a run holds ``device``,
    ``ceiling_gbps`` and ``tiles`` (rows with ``block_s``, ``block_h``, ``num_warps``, ``pct_ceiling``)."""
    path = Path(path) if path is not None else REFERENCE_DATA
    if not path.exists():
        return {}
    runs = json.loads(path.read_text()).get("runs", {})
    found = {}
    for gpu in GPUS:
        for device, run in runs.items():
            if gpu in device:
                found[gpu] = run
    return found


def _row(run: dict, tile: tuple[int, int, int]) -> dict | None:
    for row in run["tiles"]:
        if (row["block_s"], row["block_h"], row["num_warps"]) == tuple(tile):
            return row
    return None


def _no_run(gpu: str) -> str:
    return (f"{gpu}: no stored measurement for this GPU yet (on one, `python -m ropekit.course.reference_tiles "
            f"--out ropekit/course/data/reference_tiles.json` adds it).")


def reference_table(shape: "QKShape", runs: dict) -> str:
    """Markdown: every reference tile and, for each stored GPU, the model's % on that GPU's facts
    (:func:`gpu_model`), the measured % and the model's error; then the facts each model used."""
    models = {gpu: gpu_model(gpu, runs) for gpu in GPUS if gpu in runs}
    head = "| tile (BLOCK_S × BLOCK_H, warps) |" + "".join(f" {g} model % | {g} measured % | model error |"
                                                           for g in models)
    lines = [head, "|---|" + "---:|---:|---:|" * len(models)]
    for tile in REFERENCE_TILES:
        cells = ""
        for gpu, facts in models.items():
            predicted, row = model_pct(tile, shape, facts), _row(runs[gpu], tile)
            cells += f" {predicted:.0f} |" + (f" {row['pct_ceiling']:.1f} | {predicted - row['pct_ceiling']:+.1f} |"
                                              if row else " — | — |")
        lines.append(f"| {tile[0]} × {tile[1]}, {tile[2]} |{cells}")
    lines.append("")
    lines += [f"{gpu}'s model: {facts.name}, {facts.n_sms} SMs, {facts.ceiling_gbps:.0f} GB/s "
              f"({facts.bandwidth_source}), {facts.latency_ns:.0f} ns ({facts.latency_source})."
              for gpu, facts in models.items()]
    return "\n".join(lines)


_CHECKED: dict[int, tuple] = {}  # id(kernel) -> (kernel, its check): a kernel's values are checked once


def _not_correct(name: str, kernel) -> SpeedGrade | None:
    """None when the kernel's values are right (a kernel that writes nothing would be timed fast); else the answer."""
    from .checker import check

    if id(kernel) not in _CHECKED:
        _CHECKED[id(kernel)] = (kernel, check(name, kernel))
    result = _CHECKED[id(kernel)][1]
    if result.ok or result.diagnosis == "too_slow":
        return None
    return SpeedGrade(False, False, f"Speed is timed once the values are right; the check says:\n{result}")


_ASK = ("Write your own prediction (the % of the copy ceiling you expect your tile to reach; notebook 04's model, and "
        "where it missed, are your guide) to have it graded.")


def grade_prediction(name: str, kernel, predicted_pct: float | None, *, timer=None,
                     data: Path | str | None = None) -> SpeedGrade:
    """Grade the reader's prediction of the % of the copy ceiling their kernel's tile reaches on the stated shape.

    On a GPU (or with a fake ``timer``) against the kernel measured now. Without one, against the stored
    measurements of the solution's kernel at the same tile on each GPU of :data:`GPUS` (``data``: the file, default
    :data:`REFERENCE_DATA`); a GPU without a stored run says so and grades nothing. Right means within
    :data:`PREDICTION_TOLERANCE` points of every measurement; the model's prediction and error are shown beside.
    With ``predicted_pct`` None the model's prediction stands in, graded the same way and labelled as the model's:
    how far off the model is, and a prompt to write one's own.
    """
    from .exercises import exercise, tile_of

    shape = exercise(name).notes["speed_shape"]
    tile = tile_of(kernel)
    by_model = predicted_pct is None
    if timer is not None or torch.cuda.is_available():
        model = model_pct(tile, shape)
        wrong = _not_correct(name, kernel)
        if wrong is not None:
            return wrong
        measured = grade_exercise(name, kernel, timer=timer).speed
        predicted = model if by_model else predicted_pct
        error = predicted - measured.pct_ceiling
        ok = abs(error) <= PREDICTION_TOLERANCE
        verdict = "Right" if ok else "Off"
        if by_model:
            return SpeedGrade(True, ok, (
                f"{verdict}: the model predicted {model:.0f} % (no prediction of yours was given: the model's "
                f"stands in), the kernel measured {measured.pct_ceiling:.1f} % of the copy ceiling now "
                f"({error:+.1f} points; within {PREDICTION_TOLERANCE:.0f} is right). {_ASK}"), measured)
        return SpeedGrade(True, ok, (
            f"{verdict}: you predicted {predicted_pct:.0f} %, your kernel measured "
            f"{measured.pct_ceiling:.1f} % of the copy ceiling now ({error:+.1f} points; within "
            f"{PREDICTION_TOLERANCE:.0f} is right). The model predicted {model:.0f} % "
            f"({model - measured.pct_ceiling:+.1f} points)."), measured)
    runs = load_reference_tiles(data)
    lines, errors = [], []
    for gpu in GPUS:
        run = runs.get(gpu)
        row = _row(run, tile) if run else None
        if run is None:
            lines.append(_no_run(gpu))
        elif row is None:
            tiles = ", ".join(f"{s} × {h}, {w}" for s, h, w in REFERENCE_TILES)
            lines.append(f"{gpu}: your tile ({tile[0]} × {tile[1]}, {tile[2]} warps) is not among the measured "
                         f"reference tiles ({tiles}): choose one of them to have the prediction graded here.")
        else:
            model = model_pct(tile, shape, gpu_model(gpu, runs))
            error = (model if by_model else predicted_pct) - row["pct_ceiling"]
            errors.append(error)
            lines.append(f"{gpu} ({run['device']}): the solution's kernel at your tile measured "
                         f"{row['pct_ceiling']:.1f} %; " + (
                             f"the model predicted {model:.0f} % ({error:+.1f} points)." if by_model else
                             f"you predicted {predicted_pct:.0f} % ({error:+.1f} points), the model {model:.0f} % "
                             f"({model - row['pct_ceiling']:+.1f} points)."))
    graded = bool(errors)
    ok = graded and all(abs(e) <= PREDICTION_TOLERANCE for e in errors)
    verdict = ("Right" if ok else "Off") if graded else "Not graded"
    whose = ("the model's prediction (no prediction of yours was given: the model's stands in)" if by_model
             else "your prediction")
    words = (f"{verdict}: {whose} against the stored measurements (within {PREDICTION_TOLERANCE:.0f} points "
             "is right; a kernel written differently from the solution may differ from it at the same tile).\n"
             + "\n".join(lines) + (f"\n{_ASK}" if by_model else ""))
    if runs:
        words += "\n\nThe model against every stored reference tile:\n" + reference_table(shape, runs)
    return SpeedGrade(graded, ok, words)


def grade_stretch(name: str, kernel, *, timer=None, data: Path | str | None = None) -> SpeedGrade:
    """The stretch target: :data:`STRETCH` of the copy ceiling, measured on a GPU (or with a fake ``timer``).

    Without a GPU nothing is graded: a kernel restructured beyond the solution's cannot be judged from stored
    measurements. The answer then shows what the stored reference tiles reached, which is why one constant cannot
    pass.
    """
    from .exercises import exercise

    if timer is not None or torch.cuda.is_available():
        wrong = _not_correct(name, kernel)
        if wrong is not None:
            return wrong
        result = grade_exercise(name, kernel, timer=timer, target=STRETCH)
        words = f"Stretch target: {result.message}"
        if not result.ok:
            words += "\n" + "\n".join(_best_tiles(load_reference_tiles(data)))
        return SpeedGrade(True, result.ok, words, result.speed)
    shape = exercise(name).notes["speed_shape"]
    words = (f"Stretch target ({100 * STRETCH:.0f} % of the copy ceiling, on {shape.words}): graded on a GPU only, "
             "because a kernel changed beyond the solution's tile cannot be judged from stored measurements of the "
             "solution's kernel.\n" + "\n".join(_best_tiles(load_reference_tiles(data))))
    return SpeedGrade(False, False, words)


def _best_tiles(runs: dict) -> list[str]:
    """Per GPU of :data:`GPUS`: the best stored reference tile against the stretch target."""
    lines = []
    for gpu in GPUS:
        run = runs.get(gpu)
        if run is None:
            lines.append(_no_run(gpu))
            continue
        best = max(run["tiles"], key=lambda row: row["pct_ceiling"])
        below = best["pct_ceiling"] < 100 * STRETCH
        lines.append(f"{gpu}: the best reference tile of the solution's kernel ({best['block_s']} × "
                     f"{best['block_h']}, {best['num_warps']} warps) measured {best['pct_ceiling']:.1f} %, "
                     + ("below the stretch target: changing the tile alone does not reach it." if below else
                        "at or above the stretch target."))
    return lines


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
