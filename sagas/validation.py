"""Validation of what callers hand to the sagas app: names, data, timeouts. Each
function returns the normalised value or raises the precise error; nothing here
touches the database."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ledon import validation as ledon_validation

from .conf import sagas_settings
from .exceptions import InvalidInput, InvalidSagaData, InvalidSagaDefinition

MAX_SAGA_NAME_LENGTH = 200
MAX_STEP_NAME_LENGTH = 100
MAX_KEY_LENGTH = 200
MAX_OWNER_LENGTH = 200

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")


def name(value: object, what: str, limit: int) -> str:
    """A saga or step name: letters, digits, '_', '.', ':' or '-'."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > limit:
        raise InvalidSagaDefinition(
            f"{what} must be 1 to {limit} letters, digits, '_', '.', ':' or '-', got {value!r}"
        )
    return value


def saga_name(value: object) -> str:
    return name(value, "saga name", MAX_SAGA_NAME_LENGTH)


def step_name(value: object) -> str:
    return name(value, "step name", MAX_STEP_NAME_LENGTH)


def text(value: object, what: str, limit: int) -> str:
    """A short identifier (idempotency key, runner id): 1 to ``limit`` characters, no
    control characters (:func:`ledon.validation.text`)."""
    return ledon_validation.text(value, what, max_length=limit, error=InvalidInput)


def idempotency_key(value: object) -> str | None:
    return None if value is None else text(value, "idempotency key", MAX_KEY_LENGTH)


def timeout(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidSagaDefinition(f"{what} must be a positive number of seconds or None")
    return float(value)


def data(value: object) -> dict[str, Any]:
    """Saga data as a fresh dict, proven to be JSON (by a round trip) and not too big."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidSagaData(f"saga data must be a dict, not {type(value).__name__}")
    try:
        _check_keys(value, "data")
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise InvalidSagaData("saga data is nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidSagaData):
            raise
        raise InvalidSagaData(f"saga data is not JSON: {exc}") from None
    limit = sagas_settings().MAX_DATA_BYTES
    if len(encoded.encode("utf-8", "surrogatepass")) > limit:
        raise InvalidSagaData(f"saga data is larger than {limit} bytes of JSON")
    try:
        encoded.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSagaData("saga data contains a lone surrogate") from None
    result: dict[str, Any] = json.loads(encoded)
    return result


def request_digest(data: dict[str, Any]) -> str:
    """SHA-256 (hex) of checked saga data as canonical JSON (sorted keys): what an
    instance was started with, compared when a request repeats its idempotency key."""
    canonical = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_keys(value: object, path: str) -> None:
    # json.dumps would silently turn 1 into "1"; a step must read back what it wrote.
    # NUL: SQLite would store it, PostgreSQL's jsonb refuses it; refused on both.
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidSagaData(f"saga data keys must be strings: {path} has {key!r}")
            if "\x00" in key:
                raise InvalidSagaData(f"saga data must not contain NUL characters: a key of {path}")
            _check_keys(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_keys(item, f"{path}[{index}]")
    elif isinstance(value, str) and "\x00" in value:
        raise InvalidSagaData(f"saga data must not contain NUL characters: {path}")
