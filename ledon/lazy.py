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
        return getattr(import_module(f".{module}", package), name)

    return __getattr__
