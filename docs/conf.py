"""Sphinx configuration: MyST Markdown pages plus a reference built from docstrings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DATABASE_URL", "sqlite:///:memory:")

import django  # noqa: E402

django.setup()

project = "django-ledon"
author = "django-ledon contributors"
copyright = "2026, django-ledon contributors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinxcontrib.mermaid"]
source_suffix = {".md": "markdown"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]
exclude_patterns = ["_build", "README.md"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
html_theme = "alabaster"
html_title = "django-ledon"
# Names re-exported by several modules (Claim, FinishOutcome) resolve to one page anyway.
suppress_warnings = ["myst.xref_missing", "ref.python"]
