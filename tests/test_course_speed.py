"""Spec of ropekit.course.speed: the speed exercise's grading against the copy ceiling, with a fake timer.

The real timer runs on a GPU only; here a fake one returns chosen times, so the grading logic is exercised in CI:
the ceiling is measured in the same call as the kernel, 80 % of it passes, less fails with advice, and without a GPU
nothing is graded and the answer says so.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ON_GPU

from ropekit import course
from ropekit.course import measure, speed


class FakeTimer:
    """A timer for ``measure.time_launch``: a chosen copy ceiling and a chosen time per call; records the calls."""

    def __init__(self, ceiling_gbps: float, time_us: float):
        self.ceiling_gbps, self.time_us, self.calls = ceiling_gbps, time_us, []

    def copy_ceiling(self):
        self.calls.append("ceiling")
        return {"gbps": self.ceiling_gbps}

    def graph_us(self, fns, estimate_us):
        for fn in fns:
            fn()
        self.calls.append("kernel")
        return self.time_us, 0.0, len(fns)


def _measurement(share: float) -> measure.Measurement:
    return measure.Measurement("k", 100.0, 1, 1000.0 * share, 1000.0, 100.0 * share, 0.0)


@pytest.mark.parametrize("share, passes", [(0.95, True), (0.80, True), (0.7999, False), (0.3, False)])
def test_the_pass_mark_is_80_percent_of_the_copy_ceiling(share, passes):
    result = speed.grade(_measurement(share), shape_words="the stated shape")
    assert result.graded and result.ok is passes and bool(result) is passes
    assert ("Fast enough" if passes else "not yet fast enough") in result.message
    assert "the stated shape" in result.message and f"{100 * share:.1f} % of the copy ceiling" in result.message


def test_the_ceiling_is_measured_in_the_same_call_before_the_kernel():
    timer = FakeTimer(ceiling_gbps=1.0, time_us=1.0)
    speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"), timer=timer)
    speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"), timer=timer)
    assert timer.calls == ["ceiling", "kernel"] * 2  # measured again for every grade, not reused


@pytest.mark.skipif(ON_GPU, reason="on a GPU the exercise is graded for real")
def test_without_a_gpu_the_speed_exercise_says_it_checked_correctness_only():
    result = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"))
    assert not result.graded and not result.ok
    assert "GPU" in result.message and "correctness" in result.message


def test_grade_exercise_runs_the_readers_kernel_on_the_stated_shape_with_a_fake_timer():
    ex = course.exercise("05_qk_offsets")
    shape = ex.notes["speed_shape"]
    assert (shape.batch, shape.seq, shape.heads_q, shape.heads_k, shape.head_dim) == (4, 4096, 32, 8, 128)
    assert shape.dtype == torch.bfloat16 and "b4 s4096" in shape.words
    fast = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"),
                                timer=FakeTimer(ceiling_gbps=1.0, time_us=1.0))
    assert fast.graded and fast.ok and fast.speed.share >= speed.TARGET
    slow = speed.grade_exercise("05_qk_offsets", course.load_solution("05_qk_offsets"),
                                timer=FakeTimer(ceiling_gbps=1e9, time_us=1.0))
    assert slow.graded and not slow.ok


def test_an_exercise_without_a_speed_target_is_refused():
    with pytest.raises(ValueError, match="no speed target"):
        speed.grade_exercise("04_tiled_kernel", course.load_solution("04_tiled_kernel"), timer=FakeTimer(1, 1))


# --- the prediction and the stretch target, graded against stored reference tiles (test data in a temp file) --------

SOLUTION_TILE = (4, 4, 4)


def _stored(tmp_path, runs: dict, ceilings: dict | None = None) -> str:
    """A reference-tile file with ``runs``: {device name: {tile: % of the copy ceiling}} and each run's copy ceiling
    (``ceilings``: {device name: GB/s}, 1000 where not given) (test data, not measured)."""
    data = {"runs": {device: {"device": device, "ceiling_gbps": (ceilings or {}).get(device, 1000.0), "tiles": [
        {"block_s": s, "block_h": h, "num_warps": w, "pct_ceiling": pct} for (s, h, w), pct in tiles.items()]}
        for device, tiles in runs.items()}}
    path = tmp_path / "reference_tiles.json"
    path.write_text(json.dumps(data))
    return str(path)


cpu_only = pytest.mark.skipif(ON_GPU, reason="on a GPU the prediction is graded against a measurement of this run")


@cpu_only
def test_without_stored_runs_the_prediction_is_not_graded_and_each_gpu_says_so(tmp_path):
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), 90,
                                    data=tmp_path / "absent.json")
    assert not result.graded and not result.ok
    for gpu in ("H100", "H200"):
        assert f"{gpu}: no stored measurement for this GPU yet" in result.message
    assert "python -m ropekit.course.reference_tiles" in result.message


@cpu_only
@pytest.mark.parametrize("predicted, right", [(93.0, True), (99.0, True), (80.0, False), (100.5, False)],
                         ids=["1.5-under", "4.5-over", "14.5-under", "6-over"])
def test_a_prediction_is_right_within_5_points_of_every_stored_gpu(tmp_path, predicted, right):
    data = _stored(tmp_path, {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5, (1, 1, 4): 30.0},
                              "NVIDIA H200": {SOLUTION_TILE: 96.0, (1, 1, 4): 25.0}})
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), predicted, data=data)
    assert result.graded and result.ok is right
    assert result.message.startswith("Right" if right else "Off")
    assert "H100 (NVIDIA H100 80GB HBM3): the solution's kernel at your tile measured 94.5 %" in result.message
    assert f"({predicted - 94.5:+.1f} points)" in result.message and "H200 (NVIDIA H200)" in result.message


@cpu_only
def test_the_models_error_is_shown_on_every_stored_reference_tile(tmp_path):
    data = _stored(tmp_path, {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5, (1, 1, 4): 30.0}})
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), 94, data=data)
    shape = course.exercise("05_qk_offsets").notes["speed_shape"]
    template_model = speed.model_pct((1, 1, 4), shape, speed.gpu_model("H100", speed.load_reference_tiles(data)))
    assert "H200: no stored measurement for this GPU yet" in result.message and result.ok  # graded on the H100 alone
    assert f"| 1 × 1, 4 | {template_model:.0f} | 30.0 | {template_model - 30.0:+.1f} |" in result.message
    assert "| 8 × 4, 4 |" in result.message and "— | — |" in result.message  # a tile without a stored row


H200_RUN = {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5, (1, 1, 4): 30.0}, "NVIDIA H200": {(1, 1, 4): 25.0}}


@cpu_only
def test_each_gpus_model_is_computed_on_that_gpus_own_facts(tmp_path):
    """The H200's column and line use the H200's SMs, the copy ceiling of its stored run and the data sheet's assumed
    latency, not the H100's facts; the H100's, its own run's ceiling."""
    from ropekit.course import perf_model
    data = _stored(tmp_path, H200_RUN, ceilings={"NVIDIA H100 80GB HBM3": 3000.0, "NVIDIA H200": 4800.0})
    runs = speed.load_reference_tiles(data)
    h200 = speed.gpu_model("H200", runs)
    published = perf_model.PUBLISHED["H200"]
    assert (h200.name, h200.n_sms, h200.ceiling_gbps, h200.latency_ns) == ("NVIDIA H200", published.n_sms, 4800.0,
                                                                          published.latency_ns)
    assert speed.gpu_model("H100", runs).ceiling_gbps == 3000.0
    shape = course.exercise("05_qk_offsets").notes["speed_shape"]
    on = {gpu: speed.model_pct((1, 1, 4), shape, speed.gpu_model(gpu, runs)) for gpu in ("H100", "H200")}
    assert on["H100"] != on["H200"]  # a tile short of bytes in flight: the GPUs' facts tell them apart
    assert on["H200"] == speed.model_pct((1, 1, 4), shape, perf_model.DeviceModel("H200", published.n_sms, 4800.0,
                                                                                   published.latency_ns, "assumed"))
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), 30, data=data)
    assert (f"| 1 × 1, 4 | {on['H100']:.0f} | 30.0 | {on['H100'] - 30.0:+.1f} | {on['H200']:.0f} | 25.0 | "
            f"{on['H200'] - 25.0:+.1f} |") in result.message
    assert "H200's model: NVIDIA H200, 132 SMs, 4800 GB/s" in result.message


@cpu_only
def test_without_a_stored_run_a_gpus_model_is_its_data_sheets():
    from ropekit.course import perf_model
    assert speed.gpu_model("H200", {}) == perf_model.PUBLISHED["H200"]


def test_on_an_h200_the_models_words_are_the_h200s(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA H200")
    shape = course.exercise("05_qk_offsets").notes["speed_shape"]
    h200 = speed.gpu_model("H200")
    words = speed.model_words(course.load_solution("05_qk_offsets"), shape)
    assert f"({h200.ceiling_gbps:.0f} GB/s over {h200.n_sms} SMs x {h200.latency_ns:.0f} ns, {h200.name})" in words
    assert "H100" not in words


@cpu_only
def test_a_tile_outside_the_reference_tiles_is_not_graded_and_the_answer_lists_them(tmp_path, monkeypatch):
    from ropekit.course import exercises
    data = _stored(tmp_path, {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5}})
    monkeypatch.setattr(exercises, "tile_of", lambda kernel: (32, 4, 4))
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), 90, data=data)
    assert not result.graded and "not among the measured reference tiles" in result.message
    assert "4 × 4, 4" in result.message


def test_on_a_gpu_the_prediction_is_graded_against_this_runs_measurement():
    # the small fake-timer shape moves 2 x (2 x 5 x 40 x 128) bf16 = 204,800 bytes: in 1 µs that is 204.8 GB/s,
    # half of a 409.6 GB/s ceiling
    kernel = course.load_solution("05_qk_offsets")
    right = speed.grade_prediction("05_qk_offsets", kernel, 52, timer=FakeTimer(ceiling_gbps=409.6, time_us=1.0))
    assert right.graded and right.ok and "measured 50.0 % of the copy ceiling now (+2.0 points" in right.message
    off = speed.grade_prediction("05_qk_offsets", kernel, 60, timer=FakeTimer(ceiling_gbps=409.6, time_us=1.0))
    assert off.graded and not off.ok and off.message.startswith("Off")


def test_without_a_prediction_the_models_stands_in_and_is_called_the_models_on_a_gpu():
    kernel = course.load_solution("05_qk_offsets")
    model = speed.model_pct(SOLUTION_TILE, course.exercise("05_qk_offsets").notes["speed_shape"])
    result = speed.grade_prediction("05_qk_offsets", kernel, None, timer=FakeTimer(ceiling_gbps=409.6, time_us=1.0))
    assert result.graded and f"the model predicted {model:.0f} % (no prediction of yours was given" in result.message
    assert "you predicted" not in result.message and "your kernel measured" not in result.message
    assert "Write your own prediction" in result.message


@cpu_only
def test_without_a_prediction_the_models_stands_in_and_is_called_the_models_on_a_cpu(tmp_path):
    data = _stored(tmp_path, {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5}})
    result = speed.grade_prediction("05_qk_offsets", course.load_solution("05_qk_offsets"), None, data=data)
    shape = course.exercise("05_qk_offsets").notes["speed_shape"]
    model = speed.model_pct(SOLUTION_TILE, shape, speed.gpu_model("H100", speed.load_reference_tiles(data)))
    assert result.graded and "the model's prediction (no prediction of yours was given" in result.message
    assert f"the model predicted {model:.0f} % ({model - 94.5:+.1f} points)" in result.message
    assert "you predicted" not in result.message and "Write your own prediction" in result.message


@pytest.mark.parametrize("share, target_passes, stretch_passes", [(0.95, True, False), (0.9699, True, False),
                                                                   (0.9701, True, True), (0.79, False, False)])
def test_the_stretch_target_asks_97_percent_measured_where_80_percent_passes_the_exercise(share, target_passes,
                                                                                          stretch_passes):
    kernel = course.load_solution("05_qk_offsets")
    ceiling = 204.8 / share  # the fake clock: 204,800 bytes in 1 µs at this share of the ceiling
    target = speed.grade_exercise("05_qk_offsets", kernel, timer=FakeTimer(ceiling_gbps=ceiling, time_us=1.0))
    stretch = speed.grade_stretch("05_qk_offsets", kernel, timer=FakeTimer(ceiling_gbps=ceiling, time_us=1.0))
    assert target.ok is target_passes and stretch.graded and stretch.ok is stretch_passes
    assert stretch.message.startswith("Stretch target") and "the target is 97 %" in stretch.message


@cpu_only
def test_on_a_cpu_the_stretch_target_is_never_passed_and_shows_the_best_stored_tile(tmp_path):
    data = _stored(tmp_path, {"NVIDIA H100 80GB HBM3": {SOLUTION_TILE: 94.5, (8, 4, 4): 95.1},
                              "NVIDIA H200": {SOLUTION_TILE: 95.0}})
    result = speed.grade_stretch("05_qk_offsets", course.load_solution("05_qk_offsets"), data=data)
    assert not result.graded and not result.ok and "graded on a GPU only" in result.message
    assert "H100: the best reference tile of the solution's kernel (8 × 4, 4 warps) measured 95.1 %, below" \
        in result.message
    assert "H200: the best reference tile of the solution's kernel (4 × 4, 4 warps) measured 95.0 %" in result.message


def test_the_reference_tiles_include_the_template_and_solution_tiles_and_one_constant_changes():
    assert (1, 1, 4) in speed.REFERENCE_TILES and SOLUTION_TILE in speed.REFERENCE_TILES
    for tile in speed.REFERENCE_TILES:
        assert sum(a != b for a, b in zip(tile, SOLUTION_TILE)) <= 2


@cpu_only
def test_the_measuring_script_refuses_a_machine_without_a_gpu(tmp_path, capsys):
    from ropekit.course import reference_tiles
    out = tmp_path / "reference_tiles.json"
    assert reference_tiles.main(["--out", str(out)]) == 2
    assert not out.exists() and "CUDA GPU" in capsys.readouterr().err


def test_a_kernel_with_wrong_values_is_not_timed_for_the_prediction_or_the_stretch():
    timer = FakeTimer(ceiling_gbps=1.0, time_us=1.0)  # an empty kernel would look fast: it must not be timed
    template = course.load_template("05_qk_offsets")
    for result in (speed.grade_prediction("05_qk_offsets", template, 90, timer=timer),
                   speed.grade_stretch("05_qk_offsets", template, timer=timer)):
        assert not result.graded and not result.ok and "not yet solved" in result.message
    assert timer.calls == []
