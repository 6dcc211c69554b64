"""Spec of ropekit.course.ablations.tiles: the v3 copy with one switch that notebook 04's ablation times.

* with cos/sin loaded once or in every head step, the copy computes v3's result (the switch changes loads, not
  values), and under the interpreter the reloading version really loads the rows once per head step;
* both experiments produce every row they promise, each with the model's prediction (fake timer: the code path runs
  on a CPU);
"""

from __future__ import annotations

import pytest
import torch

import ropekit
from ropekit import reference
from ropekit.course import ablations, perf_model
from ropekit.course.ablations import tiles
from ropekit.device import DEVICE
from ropekit.testing import assert_close_to_reference


class FakeTimer:
    settings = "fake"

    def copy_ceiling(self):
        return {"gbps": 100.0, "time_us": 1.0, "method": "fake"}

    def graph_us(self, fns, estimate_us):
        for fn in fns:
            fn()
        return 10.0, 0.0, 1


@pytest.mark.parametrize("reload", [False, True])
def test_the_copy_matches_the_reference_with_and_without_reuse(reload):
    x = torch.randn(2, 5, 3, 16, device=DEVICE).to(torch.float16)
    cos, sin = ropekit.cos_sin_table(5, 16, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    tiles.launch(x, cos, sin, out, block_s=2, block_h=2, reload=reload)
    assert_close_to_reference(out, reference.rope(x, reference.token_positions(2, 5)))


@pytest.mark.skipif(not ropekit.device.INTERPRET, reason="loads are recorded under the Triton interpreter")
def test_reloading_loads_the_rows_once_per_head_step():
    from ropekit.course import touch

    x = torch.randn(1, 4, 4, 8)
    cos, sin = ropekit.cos_sin_table(4, 8)
    for reload, loads in ((False, 1), (True, 2)):  # 4 heads, BLOCK_H 2: two head steps
        record = touch.record(tiles.launch, x, cos, sin, torch.empty_like(x), block_s=4, block_h=2,
                              reload=reload, names=["x", "cos", "sin", "out"])
        assert (record.count("cos", "load") == loads).all() and (record.count("sin", "load") == loads).all()
        assert record.reuse("cos") == loads


def test_a_tile_launch_has_one_head_step_in_flight():
    launch = perf_model.tile_launch(batch=4, seq=4096, heads=32, head_dim=128, element_size=2, block_s=8, block_h=4)
    assert launch.programs == 4 * 512 and launch.bytes_in_flight_per_program == 8 * 4 * 128 * 2
    assert launch.bytes_read == 4 * 4096 * 32 * 128 * 2  # the whole q, not the programs' first steps


def test_both_experiments_are_registered_and_measure_every_row_against_one_ceiling():
    doc = ablations.run(["tile_reuse", "tile_sweep"], on_gpu=False, timer=FakeTimer())
    reuse = doc["experiments"]["tile_reuse"]["rows"]
    sweep = doc["experiments"]["tile_sweep"]["rows"]
    assert len(reuse) == 1 + 2 * len(tiles.REUSE_TILES)
    assert [r["block_s"] for r in sweep] == list(tiles.SWEEP_BLOCK_S)
    for row in reuse + sweep:
        assert row["pct_ceiling"] == pytest.approx(100 * row["gbps"] / 100.0)
        assert 0 < row["predicted_pct"] <= 100
    assert all(0 < r["last_wave_full"] <= 1 for r in sweep)
    # a bigger tile never has fewer bytes in flight per SM in the model
    in_flight = [r["bytes_in_flight_per_sm"] for r in sweep]
    assert in_flight[-1] >= in_flight[0] and perf_model.ASSUMED_H100.n_sms == doc["n_sms"]
