"""tools/ab_fused.py's dry run (a CPU's interpreter, or a GPU): every version's call is prepared and checked, and a
version that computes a wrong result is reported, not timed."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ab_dir(tmp_path_factory):
    """.ab-like folder: this tree as the base, and a variant whose fused forward turns by -θ (a wrong result)."""
    folder = tmp_path_factory.mktemp("ab")
    versions = _tool("ab_versions")
    versions.as_package(ROOT / "ropekit", folder / "ropekit_base")
    versions.as_package(ROOT / "ropekit", folder / "ropekit_turned")
    kernel = folder / "ropekit_turned" / "triton" / "fused.py"
    text = kernel.read_text()
    rotation = "y_a, y_b = _rotate(x_a, x_b, cos_a, sin_a, cos_b, sin_b, MATH_DTYPE, False)"
    assert text.count(rotation) == 1
    kernel.write_text(text.replace(rotation, rotation.replace("sin_a, cos_b, sin_b", "-sin_a, cos_b, -sin_b")))
    return folder


def _run(ab_dir, out, *argv):
    code = _tool("ab_fused").main(["--dry-run", "--ab-dir", str(ab_dir), "--out", str(out), *argv])
    return code, json.loads((out / "ab.json").read_text())


def test_fused_dry_run_checks_every_version(ab_dir, tmp_path):
    code, doc = _run(ab_dir, tmp_path, "--cases", "decode-b64", "decode-b64-fp8", "--also", "ropekit_turned")
    status = {(r["case"], r["impl"]): r["status"] for r in doc["rows"]}
    for case in ("decode-b64", "decode-b64-fp8"):
        for label in ("base", "base#2", "new", "new#2"):
            assert status[(case, label)] == "ok"
        assert status[(case, "ropekit_turned")] == "wrong result"
    assert code == 1 and doc["versions"] == ["base", "new", "ropekit_turned"] and doc["dry_run"]
    assert "ropekit_turned: wrong result" in (tmp_path / "ab.md").read_text().replace("#2", "")


def test_eager_dry_run_checks_every_version(ab_dir, tmp_path, monkeypatch):
    from ropekit.bench import eager
    order = []
    real = eager.time_interleaved

    def recorded(timed, *args, **kwargs):  # the order the runs time the calls in
        order.append([(row["op"], row["version"]) for row, _ in timed])
        return real(timed, *args, **kwargs)

    monkeypatch.setattr(eager, "time_interleaved", recorded)
    code, doc = _run(ab_dir, tmp_path, "--eager", "--ops", "rope_and_cache", "qk_norm_rope")
    # one op's versions side by side
    assert order and all(pairs == [(op, version) for op in dict.fromkeys(op for op, _ in pairs)
                                   for version in ("base", "new")] for pairs in order)
    rows = {(r["case"], r["op"], r["version"]): r for r in doc["rows"]}
    assert code == 0
    for case in ("decode", "small-prefill"):
        for op in ("rope_and_cache", "qk_norm_rope"):
            for version in ("base", "new"):
                row = rows[(case, op, version)]
                assert row["status"] == "ok" and len(row["runs_us"]) == 2
    code, doc = _run(ab_dir, tmp_path, "--eager", "--ops", "rope_and_cache", "--also", "ropekit_turned")
    assert code == 1
    assert {r["status"] for r in doc["rows"] if r["version"] == "ropekit_turned"} == {"wrong result"}
