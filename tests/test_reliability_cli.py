"""ropekit.reliability.cli: ``python -m ropekit stress`` writes its JSON and renders it into the Markdown page."""

import io
import json

import pytest
import torch

from ropekit.device import DEVICE
from ropekit.reliability import cli
from ropekit.reliability.safety import INVALID_INPUTS


def test_json_and_rendered_markdown(tmp_path):
    out = tmp_path / "reliability.json"
    status = cli.main(["--sections", "safety,long_context", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == (0 if result["total_failures"] == 0 else 1)
    assert result["environment"]["torch"] == torch.__version__ and result["environment"]["ropekit"]
    assert list(result["sections"]) == ["safety", "long_context"]
    sanitizer = tmp_path / "sanitize.json"
    sanitizer.write_text(json.dumps({"gpu": "a GPU", "tools": {"memcheck": {"exit": 0, "errors": 0,
                                                                            "summary": "ERROR SUMMARY: 0 errors"}}}))
    markdown = tmp_path / "reliability.md"
    assert cli.main(["--render", str(out), str(markdown), "--sanitizer", str(sanitizer)]) == 0
    text = markdown.read_text()
    safety = result["sections"]["safety"]["invalid_inputs"]
    assert f"{safety['cases']} invalid inputs" in text and f"{safety['calls']} calls" in text
    assert "## 7. Numerics at long context" in text and "ERROR SUMMARY: 0 errors" in text
    assert text.count("\n| ") > len(INVALID_INPUTS)  # the table of invalid inputs is rendered


def test_a_crashing_section_is_reported_and_the_others_still_run(monkeypatch, capsys):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "run_long_context", crash)
    args = cli.build_parser().parse_args(["--sections", "long_context,large"])
    result = cli.run_all(args, argv=[])
    assert result["sections"]["long_context"]["crashed"] == "RuntimeError: boom"
    large = result["sections"]["large"]
    if DEVICE == "cuda":  # a GPU runs the large tensor; only the crashed section may fail
        assert "skipped" not in large and large["past_2_31"] and large["checked"] > 0 and large["failed"] == 0
    else:  # no GPU: the large tensor is never attempted
        assert "skipped" in large
    assert result["total_failures"] == 1
    assert "CRASHED: RuntimeError: boom" in capsys.readouterr().out


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_label_names_the_section_that_is_running(monkeypatch):
    pytest.importorskip("tqdm", reason="the bar is tqdm's (the reliability extra installs it)")
    terminal, shown = _Terminal(), {}

    def section(name):
        def run(*args, **kwargs):
            shown[name] = terminal.getvalue().rsplit("\r", 1)[-1]  # the bar as last drawn
            return {"checked": 1, "failed": 0}
        return run

    monkeypatch.setattr(cli.sys, "stdout", terminal)
    monkeypatch.setattr(cli, "run_safety", section("safety"))
    monkeypatch.setattr(cli, "run_long_context", section("long_context"))
    cli.run_all(cli.build_parser().parse_args(["--sections", "safety,long_context"]), argv=[])
    assert "safety ..." in shown["safety"], shown
    assert "long_context ..." in shown["long_context"] and "safety" not in shown["long_context"], shown
