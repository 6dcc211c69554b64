"""The study commands' shared tail (``ropekit.bench.study``): time on a CUDA GPU or say the timing is skipped, then
leave the JSON."""

import json

import pytest

from ropekit.bench import study


def _args(tmp_path, *flags):
    return study.parser("example", "An example study.\n\nMore.", "example.json", "the model only").parse_args(
        ["--out", str(tmp_path / "out"), *flags])


def _speed(device):
    return [{"case": "a", "us": 1.5, "device": device}]


@pytest.mark.parametrize("device, flags, printed, speed", [
    ("cuda", (), "== speed on GPU-NAME (CUDA-graph replay, µs per call)\nreport of 1 rows\n",
     [{"case": "a", "us": 1.5, "device": "cuda"}]),
    ("cpu", (), "speed: needs a CUDA GPU (skipped)\n", None),
    ("cuda", ("--no-speed",), "", None),
    ("cpu", ("--no-speed",), "", None),
], ids=["gpu-times", "cpu-says-skipped", "gpu-no-speed", "cpu-no-speed"])
def test_finish_times_only_on_a_gpu_and_always_writes_the_json(tmp_path, capsys, device, flags, printed, speed):
    result = {"device": "GPU-NAME", "model": {"bytes": 3}, "speed": None}
    code = study.finish(_args(tmp_path, *flags), result, device, "example.json", _speed,
                        lambda rows: f"report of {len(rows)} rows")
    assert code == 0
    assert capsys.readouterr().out == printed
    assert json.loads((tmp_path / "out" / "example.json").read_text()) == {
        "device": "GPU-NAME", "model": {"bytes": 3}, "speed": speed}


def test_the_parser_names_the_command_and_its_json(tmp_path):
    cli = study.parser("example", "An example study.\n\nMore.", "example.json", "the model only")
    assert cli.prog == "python -m ropekit.bench.example" and cli.description == "An example study."
    assert "directory for example.json" in cli.format_help() and "the model only" in cli.format_help()
    with pytest.raises(SystemExit):
        cli.parse_args([])  # --out is required
