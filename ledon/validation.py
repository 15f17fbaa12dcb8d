"""The one rule for a text field a caller hands to any app.

A text field — a job id, a scope, an idempotency key, a consumer group, an error
message — is a ``str`` of valid Unicode (no lone surrogate: it could not be stored
or compared byte for byte), without NUL (PostgreSQL text cannot hold it), and at most
its field's length. Each field says only its limits: how long, whether it may be
empty, and whether it may hold control characters (line breaks in an error message
or a progress message; never in an identifier). Each app raises its own error type.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def lone_surrogate(value: str) -> int | None:
    """The position of ``value``'s first lone surrogate, or None if it is valid Unicode."""
    try:
        value.encode("utf-8", "strict")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def text(
    value: object,
    what: str,
    *,
    max_length: int,
    error: type[Exception],
    empty: bool = False,
    control: bool = False,
) -> str:
    """``value`` if it is a valid text field, else ``error`` saying why.

    ``empty`` allows the empty string; ``control`` allows control characters other
    than NUL (for free text such as error messages).
    """
    if not isinstance(value, str):
        raise error(f"{what} must be a str, not {type(value).__name__}")
    if not value and not empty:
        raise error(f"{what} must not be empty")
    if len(value) > max_length:
        raise error(f"{what} must be at most {max_length} characters")
    if not control and _CONTROL.search(value):
        raise error(f"{what} must not contain control characters")
    if "\x00" in value:
        raise error(f"{what} must not contain NUL characters")
    position = lone_surrogate(value)
    if position is not None:
        raise error(
            f"{what} contains a lone surrogate at position {position}; it is not valid Unicode"
        )
    return value


def non_string_key(value: object, path: str = "") -> tuple[str, object] | None:
    """The first dict key in ``value`` (dicts, lists and tuples, nested) that is not a
    ``str``, as ``(path, key)`` — the path of the dict holding it, ``["lines"][0]``
    — or None. ``json.dumps`` turns an int, float, bool or None key into a string
    without a word: what is read back would not be what was written."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, key
            found = non_string_key(item, f"{path}[{key!r}]")
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = non_string_key(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None
