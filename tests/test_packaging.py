"""environment.yml and pyproject.toml list the same dependencies; the version comes from one place."""

import re
from pathlib import Path

import pytest
import yaml

import ropekit

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda's name for a package -> its PyPI name


def _split(requirement: str) -> tuple[str, str]:
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", requirement).groups()
    return name.lower(), spec.replace(" ", "")


def test_environment_yml_lists_what_pyproject_lists():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = dict(_split(r) for r in project["dependencies"])
    for extra in ("course", "dev"):
        wanted.update(_split(r) for r in project["optional-dependencies"][extra])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip_part = {}, []
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            pip_part += entry["pip"]
            continue
        name, spec = _split(entry)
        if name not in ("python", "pip"):
            conda[CONDA_NAMES.get(name, name)] = spec
    assert conda == wanted, {"only in environment.yml": set(conda) - set(wanted),
                             "only in pyproject.toml": set(wanted) - set(conda),
                             "different versions": {n for n in conda if n in wanted and conda[n] != wanted[n]}}
    assert pip_part == ["-e ."], "the project itself is installed from the checkout with pip"
    python = next(e for e in env["dependencies"] if isinstance(e, str) and e.startswith("python"))
    assert _split(python)[1] == project["requires-python"]


def test_the_version_comes_from_one_place():
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = tomllib.loads(pyproject)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert tomllib.loads(pyproject)["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ropekit.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", ropekit.__version__)
