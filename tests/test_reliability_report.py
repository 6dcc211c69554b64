"""ropekit.reliability.report: every section of a run renders into docs/reliability.md from the JSON alone, failures
included."""

import json

from ropekit.reliability import checks, report
from ropekit.reliability.properties import run_property
from ropekit.reliability.te_matrix import run_te_matrix

ENVIRONMENT = {"command": "python -m ropekit stress --quick", "gpu": None, "device": "cpu", "date": "today",
               "ropekit": "0", "torch": "t", "triton": "tr", "python": "3", "cuda_runtime": None,
               "backends": ["triton"], "cuda_backend": "no GPU"}


def _result():
    sections = {
        "property": run_property(2, seed=1, backends=("triton",), n_families=2),
        "te_matrix": run_te_matrix(full=False, seq_scale=64, heads=2, budget_s=0),
        "large": checks.run_large(("triton",), numel=6 * 2**10, heads=2, head_dim=16),
        "determinism": {"shape_q": [2, 3, 1, 8], "heads_k": 1, "dtype": "bf16", "repeats": 2, "checked": 1,
                        "failed": 0, "failures": [], "rows": [{"check": "bshd vs sbhd", "backend": "triton",
                                                               "bitwise_equal": True, "max_abs_diff": 0.0, "note": ""}]},
        "fuzz": {"fuzz_cases": 3, "checked": 3, "failed": 1, "matched": 1, "documented_errors": 1, "seconds": 0.1,
                 "failures": [{"backend": "apply_rope", "case": "seed 0 case 2", "messages": ["wrote a guard"]}]},
    }
    sections["property"]["failures"] = [{"backend": "triton", "case": "a configuration", "messages": ["q: off"]}]
    return {"environment": ENVIRONMENT, "quick": True, "seed": 0, "sections": sections, "seconds": 1.0,
            "total_failures": 1, "total_not_run": 0}


def test_every_section_renders_from_the_json(tmp_path):
    path = tmp_path / "reliability.json"
    path.write_text(json.dumps(_result(), default=str))
    markdown = tmp_path / "reliability.md"
    report.render(str(path), str(markdown), sanitizer_path=str(tmp_path / "absent.json"))
    text = markdown.read_text()
    for heading in ("## Summary", "## 1. Property-based configurations", "## 2. Transformer Engine's rope test matrix",
                    "## 4. Large tensors", "## 5. Determinism and batch invariance", "## 8. Hostile-but-plausible",
                    "## Reproduce"):
        assert heading in text, heading
    assert "| bshd vs sbhd | triton | yes | 0 |  |" in text
    assert "| determinism | 1 bitwise comparisons: 1 of 1 passed, 0 failed (0 s) |" in text
    assert "## 3. compute-sanitizer" not in text  # no sanitizer JSON: no section
    assert "`triton` a configuration: q: off" in text and "`apply_rope` seed 0 case 2: wrote a guard" in text
    assert "a `--quick` smoke run" in text and "Total failures: **1**" in text
    assert "rows not started within the time budget" in text


def test_section_line_says_how_a_section_ended():
    assert report.section_line({"skipped": "needs a GPU"}) == "skipped (needs a GPU)"
    assert report.section_line({"crashed": "RuntimeError: boom"}) == "CRASHED: RuntimeError: boom"
    line = report.section_line({"checked": 5, "failed": 2, "not_run": 1, "unsupported": {"cuda: thd": 3},
                                "seconds": 1.5})
    assert line == "5 runs: 3 of 5 passed, **2 failed**, 3 unsupported, **1 not run (time budget)** (1.5 s)"
