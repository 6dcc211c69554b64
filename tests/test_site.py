"""The course as a website: Sphinx + myst-nb render the README, docs/ and the notebooks with their stored outputs
(warnings are errors), autodoc renders the API reference from the docstrings, and the site is complete offline.

* Sphinx's linkcheck passes over every page (external URLs are skipped: the build is offline).
* Headless Chromium, with every request that is not a local file refused, opens every page the build wrote: every
  image loads, every formula is typeset by the site's own MathJax (no raw TeX left), every internal link and anchor
  resolves, and no page is wider than a laptop's 1366 px viewport.
* Screenshots of the index, notebooks 05 and 09 and the API page at 1366x768 land in the test's tmp dir (or in
  ``$ROPEKIT_SITE_SHOTS``), each a readable picture, not a blank page.
"""

import html as html_module
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import ropekit

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAPTOP = {"width": 1366, "height": 768}
SHOTS = {"index": "site/index.html", "notebook_05": "notebooks/05_triton_v4.html",
         "notebook_09": "notebooks/09_fusion.html", "api": "site/api.html"}
# What the browser reads on a page: its formulas (Sphinx's .math elements, those MathJax typeset, its errors, and TeX
# delimiters left in the text outside code), its width and code blocks past the viewport's edge, the sidebar's top.
MATH_STATE = r"""() => {
    const text = document.body.cloneNode(true);
    text.querySelectorAll('pre, code, script, style, mjx-container, textarea').forEach(e => e.remove());
    return {math: document.querySelectorAll('.math').length,
            typeset: document.querySelectorAll('.math mjx-container').length,
            errors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length,
            raw: (text.innerText.match(/\$\$|\\\(|\\\[|\\begin\{/g) || []).length};
}"""
WIDTHS = r"""() => [document.documentElement.scrollWidth,
    [...document.querySelectorAll('pre')].filter(p => p.getBoundingClientRect().right > innerWidth).length]"""
SIDEBAR_TOP = r"""() => { const nav = document.querySelector('.bd-sidebar-primary');
                          return nav ? nav.getBoundingClientRect().top : null; }"""
# the public submodules the API reference documents, beside the names ropekit exports
SUBMODULES = ["frequencies", "positions", "hf", "engines", "te", "fused", "distributed", "reference", "testing",
              "device", "triton", "cuda"]


def sphinx(builder, out, doctrees):
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-d",
                           str(doctrees), "-c", "site", ".", str(out)], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the site is built with Sphinx (the docs extra installs it)")
    pytest.importorskip("myst_nb", reason="the notebooks are rendered by myst-nb (the docs extra installs it)")
    pytest.importorskip("sphinx_book_theme", reason="the site's theme (the docs extra installs it)")
    work = tmp_path_factory.mktemp("site")
    build = sphinx("html", work / "html", work / "doctrees")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return work


def html_pages(site):
    return sorted(p for p in (site / "html").rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts)


class Anchors(HTMLParser):
    """Every id (and old-style <a name>) of a page: what a #fragment may point at."""

    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids.update(v for k, v in attrs.items() if k == "id" or (tag == "a" and k == "name"))


def anchors(page: Path) -> set:
    parser = Anchors()
    parser.feed(page.read_text())
    return parser.ids


def test_the_site_builds_with_every_page_in_course_order(site):
    html = site / "html"
    for page in [*SHOTS.values(), "docs/api.html", "index.html"]:
        assert (html / page).is_file(), page
    index = (html / "site/index.html").read_text()
    course = [index.find(f"{n:02d}_") for n in range(1, 10)]
    assert all(i > 0 for i in course) and course == sorted(course), "notebooks 01-09 in course order"
    assert 'class="highlight' in (html / "notebooks/02_triton_v1.html").read_text()  # code is highlighted
    assert 'url=site/index.html' in (html / "index.html").read_text()  # the site's root leads to the index


def test_every_page_has_the_footer_with_copyright_license_and_version(site):
    for page in html_pages(site):
        text = page.read_text()
        if "bd-footer" not in text:
            continue  # search and index pages the theme writes without the article footer
        assert "ropekit developers" in text and "Apache-2.0" in text, page
        assert f"ropekit {ropekit.__version__}" in text, page


def test_the_api_reference_is_generated_from_every_public_docstring(site):
    api = (site / "html/site/api.html").read_text()
    text = " ".join(html_module.unescape(re.sub(r"<[^>]+>", "", api)).replace("’", "'").split())
    ids = anchors(site / "html/site/api.html")
    for name in ropekit.__all__:
        if name in SUBMODULES or name == "reference":
            continue
        assert f"ropekit.{name}" in ids, f"ropekit.{name} has no entry"
        opening = " ".join(getattr(ropekit, name).__doc__.replace("`", "").split()[:5])
        assert opening in text, f"{name}: its docstring is not rendered"
    for module in SUBMODULES:
        assert f"module-ropekit.{module}" in ids, f"ropekit.{module} is not in the reference"
    assert "ropekit.te.apply_rotary_pos_emb" in ids and "ropekit.engines.FusedSetKVBufferArg" in ids


def test_sphinx_linkcheck_finds_no_broken_link(site):
    check = sphinx("linkcheck", site / "linkcheck", site / "doctrees")
    rows = [json.loads(line) for line in (site / "linkcheck/output.json").read_text().splitlines()]
    broken = [f"{r['filename']}:{r['lineno']} {r['uri']} {r['info']}" for r in rows if r["status"] == "broken"]
    assert check.returncode == 0 and not broken, broken[:10] or check.stderr[-3000:]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (the CI script installs it)")
def test_headless_chromium_offline_sees_every_page_whole(site, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    html = site / "html"
    shots = Path(os.environ.get("ROPEKIT_SITE_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    ids = {page: anchors(page) for page in html_pages(site)}
    problems, left_the_machine, typeset = [], [], 0
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport=LAPTOP)

        def local_only(route):
            if urlparse(route.request.url).scheme in ("file", "data", "blob"):
                route.continue_()
            else:
                left_the_machine.append(route.request.url)
                route.abort()

        context.route("**/*", local_only)
        page = context.new_page()
        for path in ids:
            name = str(path.relative_to(html))
            if 'http-equiv="refresh"' in path.read_text():
                continue  # the root's redirect to site/index.html (checked above)
            page.goto(path.as_uri(), wait_until="load")
            if page.evaluate("() => document.querySelector('.math') !== null"):
                try:
                    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                           timeout=15_000)
                    page.evaluate("() => MathJax.startup.promise")
                except sync_api.TimeoutError:
                    problems.append(f"{name}: MathJax did not load")
                state = page.evaluate(MATH_STATE)
                if state["typeset"] < state["math"] or state["errors"] or state["raw"]:
                    problems.append(f"{name}: math {state}")
                typeset += state["typeset"]
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])")
            problems += [f"{name}: image {src} did not load" for src, width in images if not width]
            for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
                url = urlparse(href)
                if url.scheme != "file":
                    continue
                target = Path(unquote(url.path))
                if not target.exists():
                    problems.append(f"{name}: link to a missing page {href}")
                elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in ids.get(target, ()):
                    problems.append(f"{name}: link to a missing anchor {href}")
            width, code_past_the_edge = page.evaluate(WIDTHS)
            if width > LAPTOP["width"] or code_past_the_edge:
                problems.append(f"{name}: {width} px wide at a {LAPTOP['width']} px viewport, "
                                f"{code_past_the_edge} code blocks past its edge")
            if name in SHOTS.values():
                shot = shots / f"{next(k for k, v in SHOTS.items() if v == name)}.png"
                page.screenshot(path=str(shot), full_page=False)
                assert shot.stat().st_size > 30_000, f"{shot} looks blank"
                # the navigation stays in view while the page scrolls
                page.evaluate("() => window.scrollTo(0, 3000)")
                top = page.evaluate(SIDEBAR_TOP)
                if top is None or abs(top) > 1:
                    problems.append(f"{name}: the sidebar scrolled away or is missing (top: {top})")
        browser.close()
    assert not left_the_machine, f"requests that left the machine: {left_the_machine[:10]}"
    assert not problems, "\n".join(problems[:30])
    assert len(ids) >= 30, f"only {len(ids)} pages were crawled"
    assert typeset > 50, "the notebooks' formulas were typeset"


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_published_tree_lists_dev_then_releases_newest_first_and_opens_on_the_newest():
    site_versions = load_tool("site_versions")
    releases = site_versions.release_tags(["v0.2.0", "v0.10.0", "v0.9.1", "nightly", "v1.0.0rc1"])
    assert releases == ["v0.10.0", "v0.9.1", "v0.2.0"]
    entries = site_versions.switcher(releases, "https://example.org/ropekit/")
    assert [e["version"] for e in entries] == ["dev", "0.10.0", "0.9.1", "0.2.0"]
    assert entries[0]["url"] == "https://example.org/ropekit/dev/"
    assert entries[1]["url"] == "https://example.org/ropekit/v0.10.0/"
    assert [e.get("preferred", False) for e in entries] == [False, True, False, False]
    assert 'url=v0.10.0/site/index.html' in site_versions.redirect(releases)
    assert 'url=dev/site/index.html' in site_versions.redirect([])


def test_each_version_reads_the_switcher_one_folder_above_its_own_root():
    conf = (ROOT / "site" / "conf.py").read_text()
    assert '"json_url": "../switcher.json"' in conf  # /ropekit/dev/ -> /ropekit/switcher.json
    workflow = (ROOT / ".github" / "workflows" / "docs.yml").read_text()
    assert "actions/deploy-pages" in workflow and "tools/site_versions.py" in workflow
    assert "tags:" in workflow and "branches: [main]" in workflow
