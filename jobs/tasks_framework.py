"""Where this Django's tasks framework lives, found without importing it.

Django 6 ships ``django.tasks``; on Django 5.2 the framework is the ``django-tasks``
backport (``pip install "django-ledon[tasks-backport]"``), when it is installed. The
names themselves are imported by :mod:`jobs.backends.compat`; this module only says
where they are, so that the jobs app, its worker and its checks work on Django 5.2
without the backport for a project that does not use ``TASKS``.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

import django
from django.core import checks
from django.core.checks.registry import registry

#: Whether this Django has ``django.tasks`` itself (Django 6.0 and later).
BUILT_IN = django.VERSION >= (6, 0)
#: The package that holds the tasks framework here.
PACKAGE = "django.tasks" if BUILT_IN else "django_tasks"
#: What a project on Django 5.2 installs to use ``jobs.backends.JobsBackend``.
INSTALL_HINT = "pip install 'django-ledon[tasks-backport]'"


def available() -> bool:
    """Whether the tasks framework can be imported (built in, or the backport installed)."""
    return BUILT_IN or find_spec(PACKAGE) is not None


def register_checks() -> None:
    """Import what registers the framework's system check (every ``TASKS`` backend's
    ``check()``) and its ``setting_changed`` receiver, as ``import django.tasks``
    does on Django 6; on the backport its app config would, so ``"django_tasks"`` in
    ``INSTALLED_APPS`` is optional (and harmless). Nothing when it is missing.

    The framework's check is tagged as one the engines' commands run
    (:data:`ledon.checks.ENGINES`): ``run_jobs`` runs the tasks, so a bad ``TASKS``
    (``jobs.E101``-``jobs.E107`` among the backends' errors) stops it at start."""
    if BUILT_IN:
        import_module("django.tasks")
    elif available():
        import_module("django_tasks.checks")
        import_module("django_tasks.signals")
    else:
        return
    from ledon.checks import ENGINES  # with the checks, after the app registry is ready

    framework = f"{PACKAGE}.checks"
    for check in registry.get_checks():
        tags = tuple(getattr(check, "tags", ()))
        if check.__module__ == framework and ENGINES not in tags:
            checks.register(check, *tags, ENGINES)
