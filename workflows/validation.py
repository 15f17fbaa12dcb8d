"""Validation of what callers and bodies hand to the engine.

Scopes, run ids and checkpoint keys follow the jobs' rules (a key is validated like
a job id); values are JSON checked like a job's payload, nested at most
:data:`MAX_VALUE_DEPTH` levels. Each function returns the normalised value or raises
:class:`~workflows.exceptions.InvalidInput`; nothing here touches the database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from jobs import validation as job_validation
from jobs.exceptions import JobsError
from ledon import validation as text_validation

from .conf import workflows_settings
from .exceptions import InvalidInput as InvalidInput

MAX_KEY_LENGTH = job_validation.MAX_JOB_ID_LENGTH
#: Longest run id: a child's id is its parent's plus "/" and the child's key.
MAX_RUN_ID_LENGTH = 1000
#: The highest version of a workflow.
MAX_VERSION = 2**31 - 1
#: The deepest a value (input, output, argument, result, payload) may nest. A fixed
#: bound, so that whatever is accepted in one place is accepted in every other: the
#: interpreter's own limit depends on how deep the call stack already is, and a run's
#: output is checked far deeper in a worker than its input was at ``start_workflow``.
MAX_VALUE_DEPTH = 200
#: The longest wait or timeout, in seconds (ten years).
MAX_SECONDS = 10 * 366 * 86_400
#: The most runs one ``WorkflowScope.list`` returns (as ``JobScope.list``).
MAX_LIST_LIMIT = 10**9
#: The most tries after the first that a step or an activity may have.
MAX_RETRIES = 100
#: A run's tags: at most this many pairs, each key and value a text of at most these
#: many characters (a key must not be empty; a value may be).
MAX_TAGS = 16
MAX_TAG_KEY_LENGTH = 100
MAX_TAG_VALUE_LENGTH = 200


def scope_hash(scope: object) -> str:
    try:
        return job_validation.scope_hash(scope)
    except JobsError as exc:
        raise InvalidInput(str(exc)) from None


def _run_id(value: object, max_length: int) -> str:
    """The job id rule (valid Unicode, no control character, no surrounding space)."""
    if value is None:
        raise InvalidInput("a run id must be given")
    value = text_validation.text(value, "run id", max_length=max_length, error=InvalidInput)
    if value != value.strip():
        raise InvalidInput("run id must not start or end with whitespace")
    return value


def run_id(value: object) -> str:
    """The id of a new run, chosen by its caller (required): a job id's rule."""
    return _run_id(value, MAX_KEY_LENGTH)


def existing_run_id(value: object) -> str:
    """The id of a run that is looked up: the same rule as :func:`run_id`, but as
    long as a child's id may be (its parent's, "/" and its key)."""
    return _run_id(value, MAX_RUN_ID_LENGTH)


def child_run_id(parent_run_id: str, key: str) -> str:
    """The id of the child ``key`` of run ``parent_run_id``; InvalidInput if it
    would be longer than a run id may be (children nest: each adds its key)."""
    value = f"{parent_run_id}/{key}"
    if len(value) > MAX_RUN_ID_LENGTH:
        raise InvalidInput(
            f"child {key!r}: its run id would be {len(value)} characters, longer than "
            f"the {MAX_RUN_ID_LENGTH} a run id may have; use a shorter key"
        )
    return value


def key(value: object, what: str = "checkpoint key") -> str:
    """A checkpoint or signal key: validated like a job id."""
    if value is None:
        raise InvalidInput(f"a {what} must be given")
    try:
        return job_validation.job_id(value)
    except JobsError as exc:
        raise InvalidInput(str(exc).replace("job id", what)) from None


def is_key(value: object) -> bool:
    """Whether ``value`` is a valid checkpoint key (one that may be stored as one)."""
    try:
        key(value)
    except InvalidInput:
        return False
    return True


def name(
    value: object, what: str = "workflow name", *, error: type[InvalidInput] = InvalidInput
) -> str:
    """A workflow, activity or queue name: a handler name's rule; ``error`` (an
    :class:`InvalidInput`) if it is not one."""
    try:
        return job_validation.name(value, what)
    except JobsError as exc:
        raise error(str(exc)) from None


def version(value: object, what: str, *, error: type[InvalidInput] = InvalidInput) -> int:
    """A workflow's version: an int from 1 to :data:`MAX_VERSION`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        raise error(f"{what} must be an int from 1 to {MAX_VERSION}, got {value!r}")
    return value


def tags(value: object) -> dict[str, str]:
    """A run's tags, or the tags a search asks for: a dict of at most
    :data:`MAX_TAGS` pairs whose keys are non-empty texts of at most
    :data:`MAX_TAG_KEY_LENGTH` characters and whose values are texts of at most
    :data:`MAX_TAG_VALUE_LENGTH` (None is no tags). Anything else is
    :class:`InvalidInput`: a number is not turned into a text."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"tags must be a dict of str to str, not {type(value).__name__}")
    if len(value) > MAX_TAGS:
        raise InvalidInput(f"tags: {len(value)} pairs, more than the {MAX_TAGS} a run may carry")
    checked = {}
    for tag, text in value.items():
        tag = text_validation.text(
            tag, "a tag's key", max_length=MAX_TAG_KEY_LENGTH, error=InvalidInput
        )
        checked[tag] = text_validation.text(
            text, f"tag {tag!r}", max_length=MAX_TAG_VALUE_LENGTH, error=InvalidInput, empty=True
        )
    return checked


def limit(value: object) -> int | None:
    """A count of rows to return: None (all) or an int in [0, MAX_LIST_LIMIT]."""
    if value is None:
        return None
    try:
        return job_validation.integer(value, "limit", 0, MAX_LIST_LIMIT)
    except JobsError as exc:
        raise InvalidInput(str(exc)) from None


def retries(value: object, what: str, *, error: type[InvalidInput] = InvalidInput) -> int:
    """A count of tries after the first, from 0 to :data:`MAX_RETRIES`, or ``error``
    naming ``what`` (a step, an activity)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        raise error(f"{what}: retries must be an int in [0, {MAX_RETRIES}]")
    return value


def seconds(
    value: object, what: str, *, zero: bool = False, error: type[InvalidInput] = InvalidInput
) -> float:
    """A finite number of seconds, positive (or 0 with ``zero``), at most
    :data:`MAX_SECONDS`: NaN, infinities and times past the calendar are refused
    (``error``, an :class:`InvalidInput`)."""
    low = "0" if zero else "a positive number"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not (value >= 0 if zero else value > 0)
        or value > MAX_SECONDS
    ):
        raise error(f"{what} must be a number of seconds from {low} to 10 years")
    return float(value)


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether ``value`` nests more than ``depth`` lists or dicts (level by level,
    without recursion)."""
    level = [value] if isinstance(value, dict | list | tuple) else []
    for _ in range(depth):
        members: list[Any] = []
        for item in level:
            members.extend(item.values() if isinstance(item, dict) else item)
        level = [item for item in members if isinstance(item, dict | list | tuple)]
        if not level:
            return False
    return bool(level)


def to_json(value: Any, what: str) -> str:
    """The JSON text of ``value``, or InvalidInput naming ``what``."""
    try:
        text = job_validation.serialise_payload(value, workflows_settings().MAX_VALUE_BYTES)
    except JobsError as exc:
        raise InvalidInput(f"{what}: {str(exc).replace('payload', 'value')}") from None
    # Only a text with more brackets than the bound can nest deeper than it.
    if text.count("[") + text.count("{") > MAX_VALUE_DEPTH and _deeper_than(value, MAX_VALUE_DEPTH):
        raise InvalidInput(f"{what}: value nests more than {MAX_VALUE_DEPTH} levels deep")
    return text


#: A JSON decoder's C scanner: one value at once, without the whitespace matching
#: around it that ``json.loads`` adds (the texts the engine stores have none).
_scan_value: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def from_json(text: str | None) -> Any:
    """The value of JSON ``text`` (None for None): read at every replay of every
    recorded checkpoint, so the common case takes the scanner alone; any other text
    (surrounding whitespace, nothing or more than one value) is ``json.loads``'s."""
    if text is None:
        return None
    try:
        value, end = _scan_value(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else json.loads(text)
