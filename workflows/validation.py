"""Validation of what callers and bodies hand to the engine.

Scopes, run ids and checkpoint keys follow the jobs' rules (a key is validated like
a job id); values are JSON checked like a job's payload. Each function returns the
normalised value or raises :class:`~workflows.exceptions.InvalidInput`; nothing
here touches the database.
"""

from __future__ import annotations

import json
from typing import Any

from jobs import validation as job_validation
from jobs.exceptions import JobsError

from .conf import workflows_settings
from .exceptions import InvalidInput as InvalidInput
from .exceptions import RunNotFound

MAX_KEY_LENGTH = 200


def scope_hash(scope: object) -> str:
    try:
        return job_validation.scope_hash(scope)
    except JobsError as exc:
        raise InvalidInput(str(exc)) from None


def run_id(value: object) -> str:
    """A caller-chosen run id (required)."""
    if value is None:
        raise InvalidInput("a run id must be given")
    try:
        return job_validation.job_id(value)
    except JobsError as exc:
        raise InvalidInput(str(exc).replace("job id", "run id")) from None


def existing_run_id(value: object) -> str:
    """A run id that is looked up: a child's id may be longer than a new run's."""
    if isinstance(value, str) and 0 < len(value) <= 1000 and value.isprintable():
        return value
    raise RunNotFound(f"no run {value!r} in this scope")


def key(value: object, what: str = "checkpoint key") -> str:
    """A checkpoint or signal key: validated like a job id."""
    if value is None:
        raise InvalidInput(f"a {what} must be given")
    try:
        return job_validation.job_id(value)
    except JobsError as exc:
        raise InvalidInput(str(exc).replace("job id", what)) from None


def to_json(value: Any, what: str) -> str:
    """The JSON text of ``value``, or InvalidInput naming ``what``."""
    try:
        return job_validation.serialise_payload(value, workflows_settings().MAX_VALUE_BYTES)
    except JobsError as exc:
        raise InvalidInput(f"{what}: {str(exc).replace('payload', 'value')}") from None


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)
