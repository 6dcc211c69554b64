"""Sphinx configuration of ropekit's website: the README, docs/, the course's notebooks with their stored (H100)
outputs, never re-executed, and an API reference generated from the package's docstrings.
Build: ``python -m sphinx -W -b html -c site . _site`` from the repository root (site/README.md says how it is themed,
served and published)."""

import os

import ropekit

project = "ropekit"
author = "ropekit developers"
copyright = "ropekit developers · Apache-2.0 license"
version = release = ropekit.__version__
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
root_doc = "site/index"
include_patterns = ["site/*.md", "site/*.rst", "README.md", "CHANGELOG.md", "docs/*.md", "notebooks/*.ipynb"]
exclude_patterns = ["_site", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_extra_path = ["_extra"]  # index.html at the site's root: a redirect to site/index.html

# --- notebooks: stored outputs only; markdown outputs (tables, links to docs/) parsed as MyST like the cells -------
nb_execution_mode = "off"  # the stored outputs are the H100 run's
nb_render_markdown_format = "myst"
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "amsmath"]

# --- API reference: autodoc reads the docstrings (Google-style Args/Returns through napoleon) -----------------------
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False  # torch.nn.Module's own docstrings are not ropekit's API
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# --- math without network: MathJax 3 (tex-svg-full, one file, Apache-2.0) is served from the site's own _static -----
mathjax_path = "mathjax/tex-svg-full.js"

# --- theme: sphinx-book-theme (site/README.md says why) ------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"ropekit {release}"
html_last_updated_fmt = None
html_show_sphinx = False
html_sidebars = {"**": ["navbar-logo.html", "version-switcher", "search-button-field.html", "sbt-sidebar-nav.html"]}
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "use_download_button": False,
    "use_fullscreen_button": False,
    # the published site keeps one folder per version and one switcher.json above them (.github/workflows/docs.yml)
    "switcher": {"json_url": "../switcher.json", "version_match": os.environ.get("ROPEKIT_DOCS_VERSION", release)},
    "check_switcher": False,
    "navbar_persistent": [],
    "footer_content_items": ["copyright", "footer-version"],
}

# --- linkcheck (tests/test_site.py): every internal link; external URLs are skipped, the build is offline -----------
linkcheck_ignore = [r"^https?://", r"^mailto:"]
