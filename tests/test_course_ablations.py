"""ropekit.course.ablations: the registry, the document's shape on the CPU code path, and the instruments' math."""

import json

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.course import ablations
from ropekit.course.ablations import kernels


class FakeTimer:
    settings = "fake"

    def copy_ceiling(self):
        return {"gbps": 1000.0, "time_us": 1.0, "method": "fake"}

    def graph_us(self, fns, estimate_us):
        for fn in fns:
            fn()
        return 2.0, 0.0, 1


def test_registry_knows_the_experiments_and_refuses_a_second_name():
    assert {"littles_law", "coalescing", "row_programs"} <= set(ablations.EXPERIMENTS)
    with pytest.raises(ValueError, match="twice"):
        ablations.experiment("coalescing", "again")(lambda lab: {})
    with pytest.raises(ValueError, match="unknown"):
        ablations.run(["no-such"], on_gpu=False, timer=FakeTimer())


def test_cpu_document_is_marked_and_carries_predictions():
    doc = ablations.run(["coalescing"], on_gpu=False, timer=FakeTimer())
    assert doc["on_gpu"] is False and "meaningless" in doc["device"]
    rows = doc["experiments"]["coalescing"]["rows"]
    assert len(rows) == 3 and all(0 < r["predicted_pct"] <= 100 for r in rows)
    strided = [r for r in rows if "apart" in r["variant"]][0]
    assert strided["sectors_per_warp_load"] > strided["sectors_if_adjacent"]
    json.dumps(doc)  # the document is JSON


def test_cli_refuses_to_time_the_interpreter(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("the refusal is the CPU behaviour")
    assert ablations.main(["--out", str(tmp_path)]) == 2
    assert "never timed" in capsys.readouterr().err


@pytest.mark.parametrize("rows_per_program", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_instrument_is_rope_on_odd_sizes(rows_per_program, dtype):
    x = torch.randn(1, 3, 3, 8, device=ropekit.device.DEVICE).to(dtype)  # 9 rows: a tail for 4 rows a program
    cos, sin = ropekit.cos_sin_table(3, 8, device=x.device)
    out = torch.full_like(x, float("nan"))
    kernels.rows_rope(x, cos, sin, out, rows_per_program)
    ropekit.testing.assert_close_to_reference(out, ref.rope(x, ref.token_positions(1, 3)))


def test_copy_instrument_copies_a_tail():
    src = torch.randn(100, device=ropekit.device.DEVICE)
    dst = torch.zeros_like(src)
    kernels.copy_blocks(src, dst, 64)
    assert torch.equal(src, dst)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times a GPU")
def test_on_a_gpu_every_row_is_timed_against_the_ceiling_of_the_run():
    doc = ablations.run(["coalescing"])
    assert doc["on_gpu"] and doc["copy_ceiling"]["gbps"] > 100
    for row in doc["experiments"]["coalescing"]["rows"]:
        assert row["time_us"] > 0 and 0 < row["pct_ceiling"] < 150 and 0 < row["predicted_pct"] <= 100
