"""ropekit.course.measure: the arithmetic of a timed launch (with a fake clock) and the ladder's table."""

import pytest
import torch

from ropekit.course import measure


class FakeTimer:
    """Copy ceiling 2000 GB/s; every launch takes 100 µs. Records what it was asked."""

    settings = "fake"

    def __init__(self):
        self.calls = []

    def copy_ceiling(self):
        return {"gbps": 2000.0, "time_us": 1.0, "method": "fake"}

    def graph_us(self, fns, estimate_us):
        self.calls.append((len(fns), estimate_us))
        for fn in fns:
            fn()
        return 100.0, 0.02, 8


def test_time_launch_reports_gbps_and_share_of_ceiling():
    timer = FakeTimer()
    ran = []
    m = measure.time_launch(lambda: ran.append(1), 100_000_000, label="k", timer=timer, predicted_pct=40.0)
    assert ran == [1]
    assert m.time_us == 100.0 and m.gbps == pytest.approx(1000.0) and m.pct_ceiling == pytest.approx(50.0)
    assert timer.calls == [(1, pytest.approx(50.0))]  # graph sized by the time at the ceiling
    assert "50.0 % of copy" in m.line() and "predicted  40.0 %" in m.line()
    assert m.to_json()["ceiling_gbps"] == 2000.0


def test_time_launch_rotates_buffer_sets_and_refuses_nonsense():
    timer = FakeTimer()
    measure.time_launch([lambda: None, lambda: None], 10, timer=timer)
    assert timer.calls[0][0] == 2
    with pytest.raises(ValueError, match="bytes_moved"):
        measure.time_launch(lambda: None, 0, timer=timer)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU behaviour")
def test_time_launch_never_times_the_interpreter():
    with pytest.raises(RuntimeError, match="never timed"):
        measure.time_launch(lambda: None, 10)


def test_ladder_table_with_prediction_and_a_skipped_row():
    rows = [dict(case="fp32", impl="triton-v1", residency="dram", status="ok", time_us=10.0, gbps=500.0,
                 pct_ceiling=25.0),
            dict(case="decode", impl="triton-v1", residency=None, status="skipped", reason="positions 0..S-1 only")]
    table = measure.ladder_table(rows, predict=lambda r: 30.0)
    lines = table.splitlines()
    assert lines[0].endswith("predicted % |") and "| 25 % | 30 % |" in lines[2]
    assert "skipped: positions 0..S-1 only" in lines[3]
    assert all(line.count("|") == lines[0].count("|") for line in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU ladder_rows measures")
def test_ladder_rows_on_cpu_come_from_the_published_run():
    rows, source = measure.ladder_rows(["triton-v1", "torch-compile"])
    if source is None:
        pytest.skip("no published benchmark run")
    assert source.startswith("published run on")
    assert {r["impl"] for r in rows} <= {"triton-v1", "torch-compile"}
    assert all(r["direction"] == "forward" and r["case"] in measure.LADDER_CASES for r in rows)
