"""Packages whose public names live in submodules, imported on first use.

An app's package (``jobs``, ``outbox``, ``sagas``) is imported when Django reads
``INSTALLED_APPS``, before the app registry is ready: it must not import models then.
Its public names are therefore resolved by a module ``__getattr__`` (PEP 562) that
imports the submodule holding each name when the name is first used::

    __all__ = ["JobStatus", "submit_job"]       # literal, for type checkers and linters
    _LAZY = {"submit_job": "api", "JobStatus": "types"}
    __getattr__ = lazy_attributes(__name__, _LAZY)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``names`` maps each public name to the
    submodule (relative to ``package``) that defines it."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f".{module}", package), name)

    return __getattr__
