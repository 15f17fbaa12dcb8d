"""Packages whose public names live in submodules, imported on first use.

An app's package (``jobs``, ``outbox``, ``sagas``) is imported when Django reads
``INSTALLED_APPS``, before the app registry is ready: it must not import models then.
Its public names are therefore declared once, by the submodule that defines them, and
resolved by a module ``__getattr__`` (PEP 562) that imports that submodule when the
name is first used::

    if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
        from .api import submit_job as submit_job
        from .types import JobStatus as JobStatus

    _LAZY = exported({"api": ("submit_job",), "types": ("JobStatus",)})
    __all__ = sorted(_LAZY)
    __getattr__ = lazy_attributes(__name__, _LAZY)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured


def exported(modules: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each public name mapped to its submodule, from ``modules``: each submodule
    (relative to the package) with the names it defines."""
    return {name: module for module, names in modules.items() for name in names}


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``names`` maps each public name to the
    submodule (relative to ``package``) that defines it."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            loaded = import_module(f".{module}", package)
        except RuntimeError:
            # Django refuses a model of an app that is not installed, in words that
            # name neither the app nor the fix.
            if apps.apps_ready and not apps.is_installed(package):
                raise AppNotInstalled(package, name) from None
            raise
        return getattr(loaded, name)

    return __getattr__


class AppNotInstalled(ImproperlyConfigured):
    """A public name of an app was used while the app is not in ``INSTALLED_APPS``."""

    def __init__(self, package: str, name: str) -> None:
        self.package = package
        super().__init__(
            f"{package}.{name} needs the {package!r} app, which is not in INSTALLED_APPS: "
            f"add {package!r} to INSTALLED_APPS and run 'python manage.py migrate'"
        )
