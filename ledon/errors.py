"""The root of each app's errors: the class docstring is the default message."""

from __future__ import annotations


def docstring_message(cls: type) -> str:
    """``cls``'s docstring as one line of text: a message, not source layout.

    Docstrings wrap and indent; the message a user reads must not carry that
    layout (a newline and four spaces in the middle of a sentence).
    """
    return " ".join((cls.__doc__ or "").split())


class DocumentedError(Exception):
    """An error whose default message is its class docstring, on one line."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or docstring_message(type(self)))
