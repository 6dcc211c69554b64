"""The documentation is true: every Python block in README.md and docs/*.md runs, and what the docs promise exists.

* Each ```python block of a page runs, in order, in one namespace per page (a page reads like one session). A block
  whose first line is ``# gpu-only`` runs only on a CUDA machine; on a CPU it is skipped (and says so).
* The README's two quickstart commands are exactly the ones CI (``.ci/run``) runs.
* Relative links and images in README.md and the hand-written docs point at files that exist.
* docs/api.md names every public name of ``ropekit`` and every command of ``python -m ropekit``, whose --help
  gives each command one line.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import ropekit
from conftest import ON_GPU

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GPU_ONLY = "# gpu-only"
# a fenced block, also indented inside a list item: (indent, language, body); the closing fence has the same indent
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line
    language: str
    source: str

    @property
    def gpu_only(self) -> bool:
        return self.source.lstrip().startswith(GPU_ONLY)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start(3)) + 1, m.group(2), textwrap.dedent(m.group(3)))
            for m in FENCE.finditer(text)]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# --- the collector is itself tested, so that "no block found" cannot pass for "every block ran" ---------------------

def test_collector_finds_blocks_with_their_language_line_and_gpu_marker(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n```python\n# gpu-only\ny = 2\n```\n"
                    "\n1. a list item:\n\n   ```python\n   if x:\n       z = 3\n   ```\n")
    blocks = code_blocks(page)
    assert [(b.language, b.line, b.gpu_only) for b in blocks] == [("python", 4, False), ("bash", 8, False),
                                                                  ("python", 12, True), ("python", 19, False)]
    assert blocks[0].source == "x = 1\n"
    assert blocks[3].source == "if x:\n    z = 3\n"  # an indented block is dedented, so it runs


def test_the_pages_that_teach_the_api_have_python_examples():
    counts = {page.name: sum(b.language == "python" for b in code_blocks(page)) for page in PAGES}
    for name in ("README.md", "api.md", "design.md"):
        assert counts.get(name, 0) >= 1, f"{name} has no ```python block"
    assert counts["api.md"] >= 15


# --- every Python block runs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", [p for p in PAGES if any(b.language == "python" for b in code_blocks(p))],
                         ids=page_id)
def test_python_blocks_run(page, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("ROPEKIT_CHECK", raising=False)  # pages start without check mode; a block may set it
    namespace = {"__name__": f"docs_{page.stem}"}
    ran = skipped = 0
    for block in code_blocks(page):
        if block.language != "python":
            continue
        if block.gpu_only and not ON_GPU:
            skipped += 1
            continue
        code = compile(block.source, f"{block.where} (```python block)", "exec")
        exec(code, namespace)  # a failure's traceback names the page and the line inside the block
        ran += 1
    with capsys.disabled():
        print(f"\n  {page_id(page)}: {ran} python blocks ran, {skipped} gpu-only blocks skipped")
    assert ran + skipped > 0


def test_gpu_only_marker_is_the_first_line_of_its_block():
    # A block that needs CUDA must say so on its first line; the marker anywhere else would not be seen.
    for page in PAGES:
        for block in code_blocks(page):
            if block.language == "python" and GPU_ONLY in block.source:
                assert block.gpu_only, f"{block.where}: '{GPU_ONLY}' must be the block's first line"


# --- what the README promises -------------------------------------------------------------------------------------

def test_readme_quickstart_commands_are_the_ones_ci_runs():
    readme_commands = [b.source.strip() for b in code_blocks(ROOT / "README.md") if b.language == "bash"][:2]
    assert readme_commands == ['pip install -e ".[dev]" && python -m ropekit check',
                               'pip install -e ".[dev]" && pytest -n auto --dist loadfile']
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in readme_commands:
        assert command in ci_lines, f".ci/run does not run the README's command {command!r} verbatim"


def test_readme_course_map_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"(notebooks/{notebook.name})" in readme, f"README's course map does not link {notebook.name}"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# benchmarks.md and reliability.md are rendered from the JSON of a GPU run (tests/test_bench.py and
# tests/test_reliability_report.py own them); until a run is published they link to files that run will write.
GENERATED = {"benchmarks.md", "reliability.md"}


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces become hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_heading_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## `ropekit.apply_rope`\n\n## Triton launchers: `ropekit.triton.v1` … `v4`\n")
    assert heading_anchors(page) == {"title", "ropekitapply_rope", "triton-launchers-ropekittritonv1--v4"}


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in GENERATED], ids=page_id)
def test_relative_links_point_at_files_and_headings_that_exist(page):
    text = FENCE.sub("", page.read_text())  # links inside code blocks are code, not links
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if not path.exists():
            missing.append(target)
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            missing.append(target)
    assert not missing, f"{page_id(page)} links to missing files or headings: {missing}"


# --- api.md covers the public surface ------------------------------------------------------------------------------

def test_api_reference_names_every_public_name():
    api = (ROOT / "docs" / "api.md").read_text()
    modules = {"reference", "frequencies", "positions", "triton", "device"}
    for name in ropekit.__all__:
        wanted = f"ropekit.{name}" if name in modules else name
        assert f"`{wanted}" in api or f"ropekit.{name}`" in api or f"ropekit.{name}(" in api, \
            f"docs/api.md does not document ropekit.{name}"
    for name in ropekit.reference.__all__:
        assert f"`{name}(" in api, f"docs/api.md does not document ropekit.reference.{name}"
    for version in ("v1", "v2", "v3"):
        assert f"{version}.rope_{version}(" in api
    assert "launch.rope_v4(" in api  # v4's launcher lives beside its launch table


def test_cli_help_lists_each_command_in_one_line_and_api_md_documents_it(capsys):
    from ropekit.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    commands = ("check", "info", "bench", "stress")
    for command in commands:
        assert re.search(rf"^    {command}\s+\S", help_text, re.M), f"--help has no one-line entry for {command!r}"
    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("## Command line"):]
    for command in commands:
        assert f"| `{command}` |" in section, f"docs/api.md's command table lacks {command!r}"


# --- the tuning record, the provenance page and the tools ---------------------------------------------------------

TUNING = ROOT / "docs" / "tuning.md"
# the sections the code links to for the measurements behind its choices
TUNING_SECTIONS = ("launch-table", "flat-path", "eviction-hints", "dense-strides", "lean-launch", "index-dtype",
                   "eager-rounding", "direct-launch", "plan-cache", "benchmark-harness")


def test_the_tuning_record_has_a_section_for_every_choice_the_code_links_to():
    anchors = heading_anchors(TUNING)
    assert set(TUNING_SECTIONS) <= anchors, set(TUNING_SECTIONS) - anchors
    linked = set()
    sources = [*(ROOT / "ropekit").rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "notebooks").glob("*.ipynb")]
    for path in sources:
        linked |= {(path.name, a) for a in re.findall(r"docs/tuning\.md#([\w-]+)", path.read_text())}
    assert not {(name, a) for name, a in linked if a not in anchors}, "links to sections tuning.md does not have"


# a commit as the docs write one, bare or in backticks: 7-40 lowercase hex digits with a digit and a letter among them
# (all digits is a number, all letters a word such as "deadbeef" or "faded"); a constant written 0x7F is not one
COMMIT = re.compile(r"(?<!0x)\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def run_provenance_in(text: str) -> list[str]:
    """What a reader's page must leave to provenance.md: raw-output folders (gpu-runs/...) and commits."""
    return re.findall(r"gpu-runs/[^\s`)]*", text) + COMMIT.findall(text)


def test_run_provenance_in_finds_run_folders_and_commits_and_nothing_else():
    text = ("see `docs/gpu-runs/v-programs/h200/5-sweep/` against `2f1c897`, and 75470f8 bare; not 0x7F, 0x7f3a9c1e, "
            "deadbeef, a hash's 1234567 or 163840, nor `ROPEKIT_AUTOTUNE=0`")
    assert run_provenance_in(text) == ["gpu-runs/v-programs/h200/5-sweep/", "2f1c897", "75470f8"]


def test_the_tuning_record_names_no_run_folder_and_no_commit():
    """docs/tuning.md is a reader's page (issue #32, item 6): what each choice buys and why, with the measurement
    beside it. Run folders and commits stay in provenance.md, which tuning.md links to."""
    found = run_provenance_in(TUNING.read_text())
    assert not found, f"docs/tuning.md names run folders or commits (provenance.md's rows keep them): {found}"


def test_every_run_folder_in_docs_is_named_on_the_provenance_page():
    provenance = (ROOT / "docs" / "provenance.md").read_text()
    folders = sorted(p.name for p in (ROOT / "docs" / "gpu-runs").iterdir() if p.is_dir())
    assert folders, "docs/gpu-runs holds the raw output of the published runs"
    assert not [f for f in folders if f"gpu-runs/{f}/" not in provenance], "a run folder no published result needs"
    for named in re.findall(r"`gpu-runs/([\w-]+)/`", provenance):
        assert named in folders, f"provenance.md names gpu-runs/{named}/, which is not in docs/gpu-runs"


TOOLS = sorted(p for p in (ROOT / "tools").iterdir() if p.is_file())


def test_every_tool_is_documented_in_contributing_and_every_documented_tool_exists():
    contributing = (ROOT / "docs" / "contributing.md").read_text()
    section = contributing[contributing.index("## Tools"):contributing.index("## What installs with ropekit")]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`([\w.]+\.(?:py|sh))`", cell)}
    assert documented == {p.name for p in TOOLS}, {"undocumented": {p.name for p in TOOLS} - documented,
                                                   "documented but missing": documented - {p.name for p in TOOLS}}


@pytest.mark.parametrize("tool", [p for p in TOOLS if p.suffix == ".py"], ids=lambda p: p.name)
def test_tools_use_public_names_the_harness_clocks_and_no_other_tool(tool):
    import ast

    tree = ast.parse(tool.read_text())
    stems = {p.stem for p in TOOLS}
    ropekit_names = set()  # names bound to ropekit modules or objects by this file's imports
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in stems:
                    problems.append(f"imports the tool {alias.name}")
                if alias.name.split(".")[0] in ("ropekit", "ropekit_base"):
                    ropekit_names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root in stems:
                problems.append(f"imports the tool {node.module}")
            if root == "ropekit":
                problems += [f"imports the private {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_")]
                ropekit_names |= {a.asname or a.name for a in node.names}
            if node.module in ("triton.testing",) or any(a.name == "do_bench" for a in node.names):
                problems.append("times with do_bench directly (use ropekit.bench.timing)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in ropekit_names:
                    problems.append(f"uses the private name {ast.unparse(node)}")
            if node.attr in ("CUDAGraph", "Event", "do_bench", "elapsed_time"):
                problems.append(f"keeps its own clock ({ast.unparse(node)}; use ropekit.bench.timing)")
    assert not problems, f"{tool.name}: {problems}"
