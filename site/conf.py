"""Sphinx configuration of ropekit's website: the README, docs/ and the course's notebooks with their stored (H100)
outputs, never re-executed. Build: ``python -m sphinx -W -b html -c site . _site`` from the repository root."""

import ropekit

project = "ropekit"
version = release = ropekit.__version__
extensions = ["myst_nb"]
root_doc = "site/index"
include_patterns = ["site/index.md", "README.md", "docs/*.md", "notebooks/*.ipynb"]
exclude_patterns = ["_site", "**/.ipynb_checkpoints"]
nb_execution_mode = "off"  # the stored outputs are the H100 run's
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = f"ropekit {release}"
html_theme_options = {"page_width": "1100px", "body_max_width": "auto"}
myst_enable_extensions = ["dollarmath", "amsmath"]
