"""How an outbox message travels on a broker, shared by the RabbitMQ and Kafka
transports.

The body is the event's JSON text (UTF-8). Headers carry the user's headers and, under
names starting with ``ledon-``, what the consumer needs to rebuild the
:class:`~outbox.types.Envelope`:

==================== =========================================================
``ledon-message-id`` the message id (a UUID), the same on every delivery
``ledon-event-type`` the registered event name
``ledon-key``        the outbox key (Kafka also uses it as the record key)
``ledon-created-at`` when the event was added, ISO 8601
``ledon-attempt``    the dispatcher's delivery attempt that published this copy
==================== =========================================================

A parked copy (see ``consume_events``) keeps all of these and adds
``ledon-parked-reason``, ``ledon-parked-by`` (the consumer group),
``ledon-parked-from`` and ``ledon-parked-at``.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType, UnionType
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..events import MAX_NAME_LENGTH
from ..exceptions import MissingBrokerClient, UndecodableMessage
from ..types import Envelope

PREFIX = "ledon-"
MESSAGE_ID = "ledon-message-id"
EVENT_TYPE = "ledon-event-type"
KEY = "ledon-key"
CREATED_AT = "ledon-created-at"
ATTEMPT = "ledon-attempt"
PARKED_REASON = "ledon-parked-reason"
PARKED_BY = "ledon-parked-by"
PARKED_FROM = "ledon-parked-from"
PARKED_AT = "ledon-parked-at"

#: Longest parking reason written into a header (brokers limit header sizes).
MAX_REASON_LENGTH = 4000


def require_client(module: str, *, transport: str, extra: str) -> ModuleType:
    """Import a broker client library, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingBrokerClient(
            f"the {transport} transport needs the {module!r} package, which is not "
            f"installed: pip install 'django-ledon[{extra}]' ({exc})"
        ) from None


def client_problem(module: str, *, transport: str, extra: str) -> list[str]:
    """``[message]`` if the client library is missing, for ``check_options``."""
    try:
        require_client(module, transport=transport, extra=extra)
    except MissingBrokerClient as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True, slots=True)
class BrokerClient:
    """A transport's client library (``module``), imported when called; the extra named
    like the transport installs it."""

    module: str
    transport: str

    def __call__(self) -> Any:
        return require_client(self.module, transport=self.transport, extra=self.transport)

    def problems(self) -> list[str]:
        """``[message]`` if the library is missing, for ``check_options``."""
        return client_problem(self.module, transport=self.transport, extra=self.transport)


#: An option's accepted types, and whether it must be given.
OptionSpec = Mapping[str, tuple[type | tuple[type, ...], bool]]


def option_spec(options: type) -> OptionSpec:
    """The options a transport accepts, read from its options dataclass: each field's
    types (its annotation without None; a float may be given as an int, a mapping as a
    dict) and whether it must be given (it has no default)."""
    hints = typing.get_type_hints(options)
    return {
        f.name: (
            _accepted(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(options)
    }


def _accepted(hint: Any) -> tuple[type, ...]:
    kinds = typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)
    accepted: list[type] = []
    for kind in kinds:
        kind = typing.get_origin(kind) or kind
        if kind is float:
            accepted += [int, float]
        elif kind is Mapping:
            accepted.append(dict)
        elif kind is not type(None):
            accepted.append(kind)
    return tuple(accepted)


def option_problems(options: Mapping[str, object], spec: OptionSpec) -> list[str]:
    """Unknown, missing and mistyped transport options (a bool is no number here)."""
    problems = [f"unknown option {name!r}" for name in options if name not in spec]
    for name, (types, required) in spec.items():
        if name not in options:
            if required:
                problems.append(f"{name!r} is required")
            continue
        value = options[name]
        wanted = types if isinstance(types, tuple) else (types,)
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            names = " or ".join(t.__name__ for t in wanted)
            problems.append(f"{name!r} must be {names}, not {type(value).__name__}")
        elif isinstance(value, str) and not value and required:
            problems.append(f"{name!r} must not be empty")
    return problems


def envelope_headers(envelope: Envelope) -> dict[str, str]:
    """The headers a message is published with: the user's, then this app's."""
    headers = {
        name: value for name, value in envelope.headers.items() if not name.startswith(PREFIX)
    }
    headers[MESSAGE_ID] = str(envelope.message_id)
    headers[EVENT_TYPE] = envelope.event_type
    headers[KEY] = envelope.key
    headers[CREATED_AT] = envelope.created_at.isoformat()
    headers[ATTEMPT] = str(envelope.attempt)
    return headers


def parked_headers(
    headers: Mapping[str, str], *, reason: str, group: str, source: str
) -> dict[str, str]:
    """The headers of a parked copy: the original's and why, by whom, from where."""
    return {
        **headers,
        PARKED_REASON: reason[:MAX_REASON_LENGTH],
        PARKED_BY: group,
        PARKED_FROM: source,
        PARKED_AT: timezone.now().isoformat(),
    }


def text_headers(headers: Mapping[str, object] | None) -> dict[str, str]:
    """Header values as text: bytes are read as UTF-8; other values (numbers, the
    broker's own tables) as their ``str()``. Raises if bytes are not UTF-8."""
    result: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if isinstance(value, bytes):
            try:
                result[name] = value.decode()
            except UnicodeDecodeError:
                raise UndecodableMessage(f"header {name!r} is not UTF-8 text") from None
        elif value is not None:
            result[name] = value if isinstance(value, str) else str(value)
    return result


def read_envelope(
    body: bytes,
    headers: Mapping[str, str],
    *,
    message_id: str | None = None,
    event_type: str | None = None,
) -> Envelope:
    """Rebuild the envelope of a received message. ``message_id`` and ``event_type``
    given by the broker's own properties win over the headers. Raises
    :class:`~outbox.exceptions.UndecodableMessage` naming what is wrong."""
    raw_id = message_id or headers.get(MESSAGE_ID)
    if not raw_id:
        raise UndecodableMessage("the message has no message id")
    try:
        parsed_id = uuid.UUID(raw_id)
    except ValueError:
        raise UndecodableMessage(f"the message id {raw_id[:100]!r} is not a UUID") from None
    name = event_type or headers.get(EVENT_TYPE)
    if not name:
        raise UndecodableMessage(f"message {parsed_id} has no event type")
    if len(name) > MAX_NAME_LENGTH:
        raise UndecodableMessage(f"message {parsed_id}: the event type is too long")
    try:
        payload_json = body.decode()
    except UnicodeDecodeError:
        raise UndecodableMessage(f"message {parsed_id}: the body is not UTF-8 text") from None
    created_at = _created_at(headers.get(CREATED_AT))
    attempt = headers.get(ATTEMPT, "")
    return Envelope(
        message_id=parsed_id,
        event_type=name,
        payload_json=payload_json,
        key=headers.get(KEY, ""),
        headers={k: v for k, v in headers.items() if not k.startswith(PREFIX)},
        created_at=created_at,
        attempt=int(attempt) if attempt.isdigit() else 0,
    )


def _created_at(value: str | None) -> datetime:
    try:
        parsed = parse_datetime(value) if value else None
    except ValueError:
        parsed = None
    if parsed is None:
        return timezone.now()
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
