"""Spec of ropekit.course.tile_ablation: the v3 copy with one switch that notebook 04's ablation times.

* with cos/sin loaded once or in every head step, the copy computes v3's result (the switch changes loads, not
  values), and under the interpreter the reloading version really loads the rows once per head step;
* occupancy follows the register and warp limits of an SM;
* run() produces every row it promises (fake clock: the timing logic runs on a CPU).
"""

from __future__ import annotations

import pytest
import torch

import ropekit
from ropekit import reference
from ropekit.course import tile_ablation
from ropekit.device import DEVICE
from ropekit.testing import assert_close_to_reference


@pytest.mark.parametrize("reload", [False, True])
def test_the_copy_matches_the_reference_with_and_without_reuse(reload):
    x = torch.randn(2, 5, 3, 16, device=DEVICE).to(torch.float16)
    cos, sin = ropekit.cos_sin_table(5, 16, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    tile_ablation.launch(x, cos, sin, out, block_s=2, block_h=2, reload=reload)
    assert_close_to_reference(out, reference.rope(x, reference.token_positions(2, 5)))


@pytest.mark.skipif(not ropekit.device.INTERPRET, reason="loads are recorded under the Triton interpreter")
def test_reloading_loads_the_rows_once_per_head_step():
    from ropekit.course import touch

    x = torch.randn(1, 4, 4, 8)
    cos, sin = ropekit.cos_sin_table(4, 8)
    for reload, loads in ((False, 1), (True, 2)):  # 4 heads, BLOCK_H 2: two head steps
        record = touch.record(tile_ablation.launch, x, cos, sin, torch.empty_like(x), block_s=4, block_h=2,
                              reload=reload, names=["x", "cos", "sin", "out"])
        assert (record.count("cos", "load") == loads).all() and (record.count("sin", "load") == loads).all()
        assert record.reuse("cos") == loads


def test_occupancy_is_limited_by_registers_warps_and_block_slots():
    assert tile_ablation.occupancy(32, 4) == 16  # 2048 threads / 128
    assert tile_ablation.occupancy(128, 4) == 4  # 65536 / (128 x 128)
    assert tile_ablation.occupancy(255, 8) == 1
    assert tile_ablation.occupancy(16, 1) == 32  # the block-slot limit


class FakeClock:
    def copy_ceiling(self):
        return {"gbps": 100.0}

    def do_bench_us(self, fn, warmup_ms, rep_ms):
        fn()
        return 10.0


def test_run_measures_every_row_against_one_ceiling():
    result = tile_ablation.run((1, 3, 4, 16, torch.float32), clock=FakeClock(), device=DEVICE)
    assert result["ceiling_gbps"] == 100.0 and result["bytes_moved"] == 2 * 3 * 4 * 16 * 4
    assert len(result["reuse"]) == 7 and [row["block_s"] for row in result["sweep"]] == [1, 2, 4, 8, 16]
    assert all(row["share"] == pytest.approx(row["gbps"] / 100.0) for row in result["reuse"] + result["sweep"])
