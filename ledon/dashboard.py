"""What an app adds to the admin's dashboard, without importing the app that
shows it: each installed app's config may define ``dashboard_panels(now)``, returning
:class:`Panel` values, and the dashboard (in ``jobs``) lists them after its own.

A panel names the model whose rows it summarises: the dashboard shows it only to a
user whom that model's own admin page lets in (its view permission), so that the
dashboard never shows more than the admin would.

A page of the apps' own in the admin draws its :func:`breadcrumbs` in the markup the
running Django's admin styles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import django
from django.apps import apps
from django.db.models import Model
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

#: Django 6.1's admin draws its breadcrumbs as an ordered list and styles only
#: ``ol.breadcrumbs``; before, a ``div.breadcrumbs`` with ``›`` between the links.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)


@dataclass(frozen=True, slots=True)
class Cell:
    """A table cell: text, linked to ``link`` (an admin page) when there is one."""

    text: str
    link: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    """A titled box: a few facts (label, value), then an optional table."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    #: Table rows of :class:`Cell` values.
    rows: list[list[Cell]] = field(default_factory=list)
    #: Where to see all of it (an admin list), or "".
    link: str = ""
    #: Whether something here needs a person (the panel is highlighted).
    attention: bool = False
    #: The model whose rows the panel summarises: only users who may view it in the
    #: admin see the panel (None: everyone who sees the dashboard).
    model: type[Model] | None = None


def panels(now: datetime, may_view: Callable[[type[Model]], bool]) -> list[Panel]:
    """The panels of every installed app that has some, in INSTALLED_APPS order, that
    ``may_view`` lets the user see (it is asked about each panel's model)."""
    found: list[Panel] = []
    for config in apps.get_app_configs():
        hook = getattr(config, "dashboard_panels", None)
        if callable(hook):
            found.extend(
                panel
                for panel in hook(now, may_view)
                if panel.model is None or may_view(panel.model)
            )
    return found


def age(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    whole = int(max(seconds, 0))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86_400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86_400} d {whole % 86_400 // 3600} h"


def breadcrumbs(*trail: tuple[str, str]) -> SafeString:
    """The breadcrumbs of an admin page of the apps' own, as the running Django's
    admin draws its own (:data:`BREADCRUMBS_AS_LIST`): ``trail`` is ``(text, link)``
    pairs from the admin's home, the last one the current page (its link unused)."""
    *above, (here, _link) = trail
    if BREADCRUMBS_AS_LIST:
        # One item a line, as Django's own: the space between them is the space
        # after each "›" its style sheet adds.
        links = format_html_join("\n", '<li><a href="{}">{}</a></li>', ((u, t) for t, u in above))
        return format_html(
            '<ol class="breadcrumbs">\n{}\n<li aria-current="page">{}</li>\n</ol>', links, here
        )
    links = format_html_join("", '<a href="{}">{}</a> &rsaquo; ', ((u, t) for t, u in above))
    return format_html('<div class="breadcrumbs">{}{}</div>', links, here)
