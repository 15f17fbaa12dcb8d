"""A stored row as the frozen value that leaves its app's store (or one value made
from another that has the same fields)."""

from __future__ import annotations

import dataclasses
from typing import Any

#: The init fields of each class seen, read once.
_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return names


def from_row[T](cls: type[T], row: object, /, **converted: Any) -> T:
    """The dataclass ``cls`` of ``row`` (a model instance, or a value with the same
    attributes): each field is the row's attribute of the same name, unless
    ``converted`` gives it (an enum member, a tuple of a JSON list, a value the row does
    not hold). A field with a default is read from the row too: one the row lacks is an
    AttributeError, never a silent default."""
    values = {name: getattr(row, name) for name in _field_names(cls) if name not in converted}
    return cls(**values, **converted)
