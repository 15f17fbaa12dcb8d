"""Validation of everything a caller hands to the store.

Each function either returns the normalised value or raises the precise
:mod:`jobs.exceptions` error; nothing here touches the database.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

from ledon import clock
from ledon import validation as ledon_validation
from ledon.errors import storable_text

from .exceptions import InvalidJobId, InvalidPayload, InvalidScope, InvalidSubmission

MAX_JOB_ID_LENGTH = 200
MAX_NAME_LENGTH = 200
MAX_QUEUE_LENGTH = 100
MAX_SCOPE_LENGTH = 4096
MAX_ATTEMPTS_LIMIT = 1000
MIN_PRIORITY, MAX_PRIORITY = -100, 100
#: A submission's largest ``cost``: the units it counts against a rate.
MAX_COST = 1000
MAX_TEXT_LENGTH = 100_000
#: The most error text the attempts of one job keep between them: each failed attempt
#: stores at most its share (:func:`attempt_error_limit`).
MAX_JOB_ERROR_TOTAL = 1_000_000
MIN_ATTEMPT_ERROR_LENGTH = 1_000

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")


def _is_strict_utf8(value: str) -> bool:
    return ledon_validation.lone_surrogate(value) is None


#: What a reserved scope's name is hashed after. A tenant's scope can never hold a NUL
#: (it is refused as a control character), so no tenant string hashes the same bytes:
#: the library's own jobs live in a namespace of their own.
_RESERVED_NAMESPACE = b"ledon\x00reserved-scope\x00"


def _checked_scope(scope: object) -> bytes:
    # The job id's rule: a NUL or a newline in a key is a bug upstream, never a tenant.
    scope = ledon_validation.text(scope, "scope", max_length=MAX_SCOPE_LENGTH, error=InvalidScope)
    return scope.encode("utf-8", "strict")


def scope_hash(scope: object) -> str:
    """SHA-256 (hex) of a tenant scope's strict UTF-8 bytes.

    Case and every code point count: "Owner" and "owner" are different scopes. A
    scope with a lone surrogate is rejected, never replaced, so that distinct bad
    inputs cannot fold onto one scope.
    """
    return hashlib.sha256(_checked_scope(scope)).hexdigest()


def reserved_scope_hash(name: object) -> str:
    """SHA-256 (hex) of a reserved scope: the library's own jobs (schedules, the
    ``django.tasks`` backend, workflows) under ``name``, hashed in a namespace no
    tenant scope reaches, so ``JobScope(name)`` is the tenant ``name``, never these."""
    return hashlib.sha256(_RESERVED_NAMESPACE + _checked_scope(name)).hexdigest()


def validate_scope_hash(value: object) -> str:
    """A scope hash as the executor passes it: 64 lowercase hex characters."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise InvalidScope("scope_hash must be 64 lowercase hexadecimal characters")
    return value


def scope_hashes_named(term: str) -> set[str]:
    """The scope hashes an operator may mean by ``term``: the hash itself (64 hex
    characters, any case), the tenant scope of that name and the library's reserved
    scope of that name (an invalid scope name: none of those)."""
    hashes: set[str] = set()
    if len(term) == 64:
        with suppress(InvalidScope):
            hashes.add(validate_scope_hash(term.lower()))
    with suppress(InvalidScope):
        hashes.add(scope_hash(term))
        hashes.add(reserved_scope_hash(term))
    return hashes


def job_id(value: object) -> str:
    """A caller-chosen job id, or a generated one when ``value`` is None."""
    if value is None:
        return uuid.uuid4().hex
    if (
        type(value) is str
        and 0 < len(value) <= MAX_JOB_ID_LENGTH
        and value.isascii()
        and value.isprintable()
        and value[0] != " "
        and value[-1] != " "
    ):
        # Printable ASCII: no control character, NUL or surrogate, and no whitespace
        # but inner spaces; what the full check below accepts, at a fraction of its cost.
        return value
    value = ledon_validation.text(value, "job id", max_length=MAX_JOB_ID_LENGTH, error=InvalidJobId)
    if value != value.strip():
        raise InvalidJobId("job id must not start or end with whitespace")
    return value


def key(value: object, what: str) -> str:
    """A key a submission carries (``unique_key``, ``limit_key``…), checked like a job
    id; ``InvalidSubmission`` naming ``what`` otherwise."""
    if value is None:
        raise InvalidSubmission(f"{what} must be a string")
    try:
        return job_id(value)
    except InvalidJobId as exc:
        raise InvalidSubmission(f"{what}: {str(exc).replace('job id', 'a key')}") from None


def existing_job_id(value: object) -> str:
    """The id of a job that is looked up, never generated: None is refused."""
    if value is None:
        raise InvalidJobId("job id must be given to find a job")
    return job_id(value)


#: Handler and queue names already found valid (a few per project): most submissions
#: name one of them, and a set lookup costs less than the pattern. Bounded, so that
#: arbitrary names cannot grow it without limit.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_LIMIT = 4096


def name(value: object, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """A handler or queue name: letters, digits and ``_ . : -``."""
    if type(value) is str and value in _VALID_NAMES and len(value) <= max_length:
        return value
    if not isinstance(value, str):
        raise InvalidSubmission(f"{what} must be a str, not {type(value).__name__}")
    if len(value) > max_length:
        raise InvalidSubmission(f"{what} must be at most {max_length} characters")
    if not _NAME.fullmatch(value):
        raise InvalidSubmission(
            f"{what} {value!r} must be non-empty and use only letters, digits and _ . : -"
        )
    if type(value) is str and len(_VALID_NAMES) < _VALID_NAMES_LIMIT:
        _VALID_NAMES.add(value)
    return value


def integer(value: object, what: str, low: int, high: int) -> int:
    """An int (not a bool) within [low, high]."""
    if type(value) is int and low <= value <= high:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSubmission(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        # A huge int cannot even be printed (Python's digit limit): say its size.
        got = value if value.bit_length() <= 64 else f"an int of {value.bit_length()} bits"
        raise InvalidSubmission(f"{what} must be between {low} and {high}, got {got}")
    return value


def aware_utc(value: object, what: str) -> datetime:
    """An aware datetime, converted to UTC (microsecond precision is kept)."""
    return clock.aware_utc(value, what, error=InvalidSubmission)


def optional_aware_utc(value: object, what: str) -> datetime | None:
    return None if value is None else aware_utc(value, what)


def attempt_error_limit(max_attempts: int) -> int:
    """The longest error one failed attempt of a job with ``max_attempts`` stores: its
    share of :data:`MAX_JOB_ERROR_TOTAL`, at most :data:`MAX_TEXT_LENGTH`, so that a
    job that fails a thousand times keeps a bounded total."""
    share = MAX_JOB_ERROR_TOTAL // max(max_attempts, 1)
    return max(MIN_ATTEMPT_ERROR_LENGTH, min(MAX_TEXT_LENGTH, share))


#: The longest error a job row keeps: its last attempt's, shortened.
MAX_JOB_ERROR_LENGTH = 2_000


def job_error_summary(error: str) -> str:
    """What the job row keeps of its last attempt's ``error``: the whole text if short,
    else its start and end (where an exception's ``Type: message`` is), the middle
    cut; the attempt row keeps the whole."""
    return storable_text(error, MAX_JOB_ERROR_LENGTH)


def text(value: object, what: str, max_length: int = MAX_TEXT_LENGTH) -> str:
    """Free text (error, progress message, result reference): may be empty and hold
    line breaks; valid Unicode without NUL, bounded (:func:`ledon.validation.text`)."""
    return ledon_validation.text(
        value, what, max_length=max_length, error=InvalidSubmission, empty=True, control=True
    )


def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayload(f"payload{path} is {value!r}; JSON has no NaN or Infinity")
        return
    if isinstance(value, str):
        if not _is_strict_utf8(value):
            raise InvalidPayload(f"payload{path} contains a lone surrogate")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(
                    f"payload{path} has a {type(key).__name__} key {key!r}; JSON keys are strings"
                )
            if not _is_strict_utf8(key):
                raise InvalidPayload(f"payload{path} has a key with a lone surrogate")
            _check_json(item, f"{path}[{key!r}]")
        return
    raise InvalidPayload(f"payload{path} is a {type(value).__name__}, which is not JSON")


def _reject_constant(token: str) -> Any:
    raise InvalidPayload(f"payload JSON contains {token}, which is not JSON")


#: The one encoder of payloads (json.dumps with options builds one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _c_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode``, or the same C encoder made once: ``encode`` makes a new
    one per call, which is most of a small payload's cost. Without the circular
    check: :func:`_check_json` has walked the payload before it is encoded."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    encoder = make(
        None,
        _ENCODER.default,
        json.encoder.encode_basestring,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,
        False,
        False,
    )
    return lambda payload: "".join(encoder(payload, 0))


_encode = _c_encoder()


def _check_shape(value: Any, path: str) -> None:
    """:func:`_check_json` but for lone surrogates, which :func:`serialise_payload`
    finds in the encoded text at once; exact built-in scalars are checked inline
    (the common payload: a dict of them), anything else by :func:`_check_json`."""
    kind = type(value)
    members: Iterable[tuple[object, Any]]
    if kind is dict:
        if any(type(key) is not str for key in value):
            _check_json(value, path)  # names the key
        members = value.items()
    elif kind is list:
        members = enumerate(value)
    else:
        if not (kind is str or kind is int or kind is bool or value is None):
            _check_json(value, path)
        return
    for key, item in members:
        item_kind = type(item)
        if item_kind is str or item_kind is int or item_kind is bool or item is None:
            continue
        if item_kind is float and math.isfinite(item):
            continue
        _check_shape(item, f"{path}[{key!r}]")


def serialise_payload(payload: Any, max_bytes: int) -> str:
    """The exact JSON text of ``payload``; it never changes after this call."""
    # A ValueError: an int too long to print (Python's digit limit), for one.
    with _codec_errors(
        nested="payload is nested too deeply to be stored as JSON",
        invalid="payload cannot be encoded as JSON",
    ):
        _check_shape(payload, "")
        text_ = _encode(payload)
    try:
        # ASCII text (known to the str at no cost) is one byte a character.
        size = len(text_) if text_.isascii() else len(text_.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate in a string or key (the text holds them as they are):
        # the full check names where.
        _check_json(payload, "")
        raise InvalidPayload("payload contains a lone surrogate") from None
    if size > max_bytes:
        raise InvalidPayload(f"payload is larger than {max_bytes} bytes of JSON")
    return text_


def check_payload_json(value: object, max_bytes: int) -> str:
    """Validate JSON text given directly; it is kept byte for byte as given."""
    if not isinstance(value, str):
        raise InvalidPayload(f"payload_json must be a str, not {type(value).__name__}")
    if not _is_strict_utf8(value) or "\x00" in value:
        raise InvalidPayload("payload_json must be valid Unicode without NUL characters")
    if len(value.encode("utf-8")) > max_bytes:
        raise InvalidPayload(f"payload is larger than {max_bytes} bytes of JSON")
    with _codec_errors(
        nested="payload_json is nested too deeply to be read back",
        invalid="payload_json is not valid JSON",
    ):
        json.loads(value, parse_constant=_reject_constant)
    return value


@contextmanager
def _codec_errors(*, nested: str, invalid: str) -> Iterator[None]:
    """What the JSON codec refuses, as :class:`InvalidPayload`: ``nested`` for a
    structure too deep, ``invalid: <why>`` for any other ``ValueError``. An
    ``InvalidPayload`` raised inside (by this module's own checks) passes as it is."""
    try:
        yield
    except RecursionError:
        raise InvalidPayload(nested) from None
    except InvalidPayload:
        raise
    except ValueError as exc:
        raise InvalidPayload(f"{invalid}: {exc}") from None
