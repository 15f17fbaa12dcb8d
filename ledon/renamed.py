"""Attributes that shipped under an older name: the old name still reads the new
attribute, and warns (``DeprecationWarning``) where it is used."""

from __future__ import annotations

import warnings
from typing import Any


def renamed_attribute(old: str, new: str) -> property:
    """A read-only property for ``old`` (``"Class.old_name"``) that warns and returns
    the attribute ``new`` of the same object."""
    owner = old.rpartition(".")[0]

    def read(self: object) -> Any:
        warnings.warn(f"{old} is deprecated; use {owner}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(read, doc=f"Deprecated alias of :attr:`{new}`, the name every engine uses.")
