"""Every notebook's stored outputs agree with its prose (read-only: nothing is executed here; nbval executes).

The course's rule is that a claim a number supports is computed and asserted in a cell, so prose cannot drift from
what the cells show. These checks read every notebook's stored JSON and fail when an output refutes the prose:

* no stored output is an error or a traceback (an assert that failed when the outputs were made);
* a deliberately wrong variant is never stored as passing its check;
* a notebook whose outputs come from a GPU does not print that something ran on the CPU only, or placeholder data;
* a measured number in the prose (%, µs, GB/s, TB/s, ulp) appears in the notebook's outputs or code (it was computed
  or asserted there, not typed in from another run);
* an exactness claim in the prose ("bit for bit", "within one ulp", "are exact") is followed by code that asserts it
  (``assert`` and, for bitwise claims, an equality test).

``REFUTED`` lists the contradictions the stored notebooks still hold, each expected to fail (strictly: once fixed, the
entry must go).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("0*.ipynb"))
IDS = [path.stem for path in NOTEBOOKS]

MEASURED = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)?)\s?(%|µs|us\b|GB/s|TB/s|ulps?\b)")
EXACT_CLAIMS = ("bit for bit", "bit-for-bit", "within one ulp", "within 1 ulp", "are exact")
CPU_ONLY = re.compile(r"runs on the CPU only|PLACEHOLDER|CPU placeholder")
GPU_RUN = re.compile(r"^CUDA: |measured in this run on NVIDIA", re.M)

# (notebook stem, check) -> what the stored notebook still contradicts
REFUTED = {
}


def _cases(check: str) -> list:
    """One param per notebook, as a list: pytest 10 no longer takes a generator as parametrize's argvalues."""
    cases = []
    for path, stem in zip(NOTEBOOKS, IDS):
        reason = REFUTED.get((stem, check))
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        cases.append(pytest.param(path, marks=marks, id=stem))
    return cases


def _outputs(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
        else:
            parts.extend(v for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def _read(path):
    return nbformat.read(path, as_version=4).cells


def test_the_course_has_its_notebooks():
    assert {"01_math", "02_triton_v1", "03_triton_v2"} <= set(IDS)


@pytest.mark.parametrize("path", _cases("errors"))
def test_no_stored_output_is_an_error(path):
    for index, cell in enumerate(_read(path)):
        if cell.cell_type != "code":
            continue
        assert not any(out.output_type == "error" for out in cell.get("outputs", [])), f"cell {index} stored an error"
        assert "Traceback (most recent call last)" not in _outputs(cell), f"cell {index} stored a traceback"


@pytest.mark.parametrize("path", _cases("wrong_variant_passed"))
def test_a_wrong_variant_is_never_stored_as_passing(path):
    for index, cell in enumerate(_read(path)):
        if cell.cell_type == "code" and "wrong_variants(" in cell.source:
            assert "PASSED (correct)" not in _outputs(cell), f"cell {index}: a deliberately wrong variant passed"


@pytest.mark.parametrize("path", _cases("gpu_run_says_cpu_only"))
def test_outputs_made_on_a_gpu_do_not_say_cpu_only(path):
    cells = [c for c in _read(path) if c.cell_type == "code"]
    text = "\n".join(_outputs(c) for c in cells)
    if not GPU_RUN.search(text):
        pytest.skip("the stored outputs were not made on a GPU")
    found = CPU_ONLY.search(text)
    assert found is None, f"a GPU run's output says {found.group(0)!r}"


@pytest.mark.parametrize("path", _cases("prose_numbers"))
def test_measured_numbers_in_prose_come_from_the_notebook(path):
    cells = _read(path)
    computed = "\n".join(c.source + "\n" + _outputs(c) for c in cells if c.cell_type == "code")
    missing = []
    for cell in cells:
        if cell.cell_type != "markdown":
            continue
        for match in MEASURED.finditer(cell.source):
            number = re.escape(match.group(1))
            if not re.search(rf"(?<![\d.]){number}(?!\d)", computed):
                missing.append(match.group(0))
    assert not missing, f"numbers in the prose that no cell computes or asserts: {missing}"


@pytest.mark.parametrize("path", _cases("exact_claims"))
def test_exactness_claims_are_asserted_by_the_cells_after_them(path):
    cells = _read(path)
    unproven = []
    for index, cell in enumerate(cells[1:], start=1):  # cell 0 states the goals; the claims are made later
        if cell.cell_type != "markdown":
            continue
        claims = [claim for claim in EXACT_CLAIMS if claim in cell.source.lower()]
        if not claims:
            continue
        following = []
        for later in cells[index + 1:]:
            if later.cell_type == "markdown":
                break
            following.append(later.source)
        code = "\n".join(following)
        bitwise = any("bit" in claim for claim in claims)
        if "assert" not in code or (bitwise and "equal" not in code):
            unproven.append((index, claims))
    assert not unproven, f"claims with no assert in the code that follows them (cell, claims): {unproven}"


@pytest.mark.parametrize("path", _cases("asserts"))
def test_every_notebook_checks_its_claims_with_asserts(path):
    asserts = sum(c.source.count("assert") for c in _read(path) if c.cell_type == "code")
    assert asserts >= 3, f"only {asserts} asserts"


def test_the_h100_ceiling_and_latency_are_quoted_from_the_committed_run_only():
    """One source for the course H100's copy ceiling and fitted latency: the committed ablation run. docs/tuning.md
    quotes that run's figures; a notebook's prose never types them (a cell prints them from the run)."""
    from ropekit.course import ablations, perf_model

    model = perf_model.device_model(ablations.load())
    gbps, latency = f"{model.ceiling_gbps:.0f} GB/s", f"{model.latency_ns:.0f} ns"
    tuning = " ".join((NOTEBOOKS[0].parent.parent / "docs" / "tuning.md").read_text().split())
    assert f"measured {gbps} and fitted {latency}" in tuning
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                assert gbps not in cell.source and latency not in cell.source, (path.stem, cell.source[:200])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_code_cell_with_stored_outputs_has_an_execution_count(path):
    """nbval refuses a cell that holds outputs but was never run ("Unrun reference cell has outputs")."""
    cells = nbformat.read(path, as_version=4).cells
    unrun = [i for i, cell in enumerate(cells)
             if cell.cell_type == "code" and cell.outputs and cell.execution_count is None]
    assert not unrun, f"{path.name}: cells {unrun} have outputs and no execution count"
