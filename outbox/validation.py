"""Validation of what callers hand to the outbox app: the limits of its text fields.
Each function returns the value or raises :class:`~outbox.exceptions.InvalidInput`;
nothing here touches the database. The rule itself is every app's
(:func:`ledon.validation.text`)."""

from __future__ import annotations

from ledon import validation as ledon_validation

from .exceptions import InvalidInput

MAX_KEY_LENGTH = 200
MAX_CONSUMER_LENGTH = 100
MAX_MESSAGE_ID_LENGTH = 200
MAX_DISPATCHER_ID_LENGTH = 200
MAX_HEADER_LENGTH = 1000


def text(value: object, what: str, max_length: int, *, empty: bool = False) -> str:
    """A text field of at most ``max_length`` characters (empty only if ``empty``)."""
    return ledon_validation.text(
        value, what, max_length=max_length, error=InvalidInput, empty=empty, control=True
    )
