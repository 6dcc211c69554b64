"""The published website: one folder per version under one root, as GitHub Pages serves it.

    _pages/dev/            main's head, the version switcher's "dev"
    _pages/v0.2.0/         each release tag vX.Y.Z, built from that tag's own tree
    _pages/switcher.json   the list the theme's version switcher reads (site/conf.py points at "../switcher.json",
                           i.e. one folder above the version's own root)
    _pages/index.html      a redirect to the newest release (to dev before the first release)

Pages publishes one artifact per deploy, so every deploy rebuilds main and every tag
(.github/workflows/docs.yml runs this on each push to main and each tag):

    python tools/site_versions.py --base-url https://OWNER.github.io/ropekit --out _pages
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


def release_tags(tags):
    """The release tags (vX.Y.Z), newest first."""
    releases = [tag for tag in tags if RELEASE_TAG.match(tag)]
    return sorted(releases, key=lambda tag: tuple(int(n) for n in RELEASE_TAG.match(tag).groups()), reverse=True)


def switcher(releases, base_url):
    """The theme's switcher.json: dev first, then the releases newest first, the newest one preferred. Each url is
    a version's root: the switcher appends the page being read."""
    base = base_url.rstrip("/")
    entries = [{"name": "dev (main)", "version": "dev", "url": f"{base}/dev/"}]
    for i, tag in enumerate(releases):
        entry = {"name": f"{tag[1:]} (stable)" if i == 0 else tag[1:], "version": tag[1:],
                 "url": f"{base}/{tag}/"}
        if i == 0:
            entry["preferred"] = True
        entries.append(entry)
    return entries


def redirect(releases):
    """The root's index.html: a redirect to the newest release's index (dev's before the first release)."""
    target = f"{releases[0] if releases else 'dev'}/site/index.html"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>ropekit</title>\n'
            f'<meta http-equiv="refresh" content="0; url={target}"></head>\n'
            f'<body><p><a href="{target}">ropekit\'s documentation</a></p></body></html>\n')


def build(tree: Path, out: Path, version: str):
    env = {**os.environ, "PYTHONPATH": str(tree), "ROPEKIT_DOCS_VERSION": version}
    subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-c", "site", ".", str(out)],
                   cwd=tree, env=env, check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="where the root is served, e.g. GitHub Pages' base_url")
    parser.add_argument("--out", type=Path, default=Path("_pages"))
    args = parser.parse_args(argv)
    tags = subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    releases = release_tags(tags.split())
    # a tag's push checks out the tag, so dev is built from main's head, not from this checkout
    has_main = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "origin/main"], cwd=ROOT,
                              capture_output=True).returncode == 0
    args.out.mkdir(parents=True, exist_ok=True)
    for ref, folder, version in [("origin/main" if has_main else "HEAD", "dev", "dev"),
                                 *[(tag, tag, tag[1:]) for tag in releases]]:
        with tempfile.TemporaryDirectory() as tree:
            subprocess.run(["git", "worktree", "add", "--detach", tree, ref], cwd=ROOT, check=True)
            try:
                build(Path(tree), args.out.resolve() / folder, version)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=True)
    shutil.rmtree(args.out / "jupyter_execute", ignore_errors=True)  # myst-nb's work folder beside the builds
    (args.out / "switcher.json").write_text(json.dumps(switcher(releases, args.base_url), indent=2) + "\n")
    (args.out / "index.html").write_text(redirect(releases))
    (args.out / ".nojekyll").write_text("")


if __name__ == "__main__":
    main()
