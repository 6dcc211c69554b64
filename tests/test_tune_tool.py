"""tools/tune_v4.py on a CPU (--dry-run: tiny shapes, every configuration once, no clock): the library's choice and
every candidate the model offers for the case run, and each agrees with the choice bit for bit."""

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import ON_GPU

TOOL = Path(__file__).resolve().parents[1] / "tools" / "tune_v4.py"


@pytest.mark.skipif(ON_GPU, reason="the dry run is the CPU's; on a GPU, tools/gpu_run.sh configs runs the tool")
def test_the_tune_tool_runs_the_choice_and_its_candidates(tmp_path):
    spec = importlib.util.spec_from_file_location("tune_v4", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "tune.json"
    assert tool.main(["--dry-run", "--cases", "small-prefill", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    for case in report["cases"]:
        rows = case["rows"]
        assert rows[0]["config"] == "choice" and len(rows) >= 3
        assert all("error" not in row for row in rows), rows
        assert {row["fields"]["kind"] for row in rows} <= {"TileConfig", "FlatConfig"}
    configs = tool.parse_configs("choice; tile:block_s=2,num_warps=8; flat:block=512,paired=1", None)
    assert [label for label, _ in configs][0] == "choice"
    assert configs[1][1] == tool.TileConfig(2, 1, 8) and configs[2][1] == tool.FlatConfig(512, 8, paired=True)
