"""The course as a website: Sphinx + myst-nb render the README, docs/ and the notebooks with their stored outputs
(warnings are errors), and headless Chromium opens the index, a notebook page with figures and the API page: every
image loaded (natural width > 0), no link to a missing page, a screenshot of each under the test's tmp dir."""

import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAGES = {"index": "site/index.html", "notebook": "notebooks/01_math.html", "api": "docs/api.html"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the site is built with Sphinx (the dev extra installs it)")
    pytest.importorskip("myst_nb", reason="the notebooks are rendered by myst-nb (the dev extra installs it)")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-c", "site",
                            ".", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return out


def test_the_site_builds_with_every_page_in_course_order(site):
    for page in PAGES.values():
        assert (site / page).is_file(), page
    index = (site / "site/index.html").read_text()
    course = [index.find(f"{n:02d}_") for n in range(1, 9)]
    assert all(i > 0 for i in course) and course == sorted(course), "notebooks 01-08 in course order"
    assert 'class="highlight' in (site / "notebooks/02_triton_v1.html").read_text()  # code is highlighted


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (the CI script installs it)")
def test_headless_chromium_sees_figures_and_no_broken_link(site, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, path in PAGES.items():
            page.goto((site / path).as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])")
            assert all(width > 0 for _, width in images), [src for src, width in images if not width]
            if name == "notebook":
                assert any("_images/" in src for src, _ in images), "the notebook page shows its figures"
            broken = []
            for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
                url = urlparse(href)
                if url.scheme == "file" and not Path(unquote(url.path)).exists():
                    broken.append(href)
            assert not broken, f"{name}: broken links {broken[:10]}"
            shot = tmp_path / f"{name}.png"
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 10_000
            print(f"screenshot: {shot}")
        browser.close()
