"""Domain and integration events: dataclasses with a registered name and a JSON form.

::

    @dataclass(frozen=True)
    class OrderPlaced(IntegrationEvent, name="orders.placed"):
        order_id: int

The name (default: module and class name) is what travels with a message. Reading a
message looks the name up in this module's registry and never imports a path taken
from the message: an event can only be decoded into a class the process defined.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import threading
import types
import typing
import uuid
import weakref
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Self

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.dateparse import parse_date, parse_datetime, parse_duration, parse_time

from ledon.validation import non_string_key

from .exceptions import EventNameConflict, InvalidEvent, UnknownEventType

MAX_NAME_LENGTH = 200
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")

_registry: dict[str, type[Event]] = {}
_registry_lock = threading.Lock()


class Event:
    """Base of every event. Subclass :class:`DomainEvent` or :class:`IntegrationEvent`.

    ``name`` (a class keyword) is the stable type name; ``abstract=True`` declares a
    base class of other events that is never sent itself.
    """

    __slots__ = ()

    #: The registered type name of this class.
    event_name: ClassVar[str]

    def __init_subclass__(
        cls, *, name: str | None = None, abstract: bool = False, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        if name is None:
            # ``@dataclass(slots=True)`` rebuilds the class without the keywords; the
            # name set on the first build is in the copied namespace.
            name = cls.__dict__.get("event_name") or f"{cls.__module__}.{cls.__qualname__}"
        cls.event_name = _valid_name(name)
        _register(cls)

    def to_payload(self) -> dict[str, Any]:
        """The event's fields as a dict (nested dataclasses become dicts)."""
        if not dataclasses.is_dataclass(self):
            raise InvalidEvent(f"{type(self).__qualname__} must be a dataclass to be sent")
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The event's JSON text; raises :class:`InvalidEvent` if a field is not JSON."""
        try:
            payload = self.to_payload()
            # json.dumps would write an int key 1 as "1": refused, as a job's payload is.
            bad_key = non_string_key(payload)
            if bad_key is not None:
                path, key = bad_key
                raise InvalidEvent(
                    f"{self.event_name}: event{path} has a key that is not a str: "
                    f"{key!r} ({type(key).__name__}); JSON keys are strings: use str keys"
                )
            text = json.dumps(
                payload,
                cls=_Encoder,
                ensure_ascii=False,
                allow_nan=False,
                separators=(",", ":"),
            )
        except InvalidEvent:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidEvent(f"{self.event_name}: the event is not JSON: {exc}") from None
        except RecursionError:
            raise InvalidEvent(
                f"{self.event_name}: the event is nested too deeply to be stored as JSON"
            ) from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidEvent(
                f"{self.event_name}: the event contains a lone surrogate at position "
                f"{exc.start} of its JSON; it is not valid Unicode"
            ) from None
        return text

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Self:
        """Build the event from its JSON form, converting fields by their annotations
        (datetime, date, time, timedelta, UUID, Decimal, enums, nested dataclasses,
        lists, tuples, dicts, optionals). Keys this class does not know are ignored,
        so an older consumer reads events from a newer producer."""
        if not isinstance(data, Mapping):
            raise InvalidEvent(f"{cls.event_name}: the payload must be a JSON object")
        try:
            event: Self = _from_dict(cls, data)
        except (TypeError, ValueError, InvalidOperation) as exc:
            raise InvalidEvent(f"{cls.event_name}: cannot read the payload: {exc}") from None
        return event


class DomainEvent(Event, abstract=True):
    """Something that happened inside this service. Published on ``event_bus`` in
    process after the unit of work commits; never stored, never sent elsewhere."""

    __slots__ = ()


class IntegrationEvent(Event, abstract=True):
    """Something other services may react to. With the outbox enabled it is stored in
    the unit of work's transaction and delivered by the dispatcher; otherwise it is
    published on ``event_bus`` after commit."""

    __slots__ = ()


class CollectsEvents:
    """Mixin for models that record their own events; ``uow.save(instance)`` saves the
    instance and hands the recorded events to the unit of work."""

    def record_event(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise InvalidEvent(f"expected an event, not {type(event).__name__}")
        self.__dict__.setdefault("_recorded_events", []).append(event)

    def take_events(self) -> list[Event]:
        """The events recorded since the last call, oldest first; clears them."""
        events: list[Event] = self.__dict__.pop("_recorded_events", [])
        return events


# --------------------------------------------------------------------------- registry


def _valid_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise InvalidEvent(
            f"event name must be 1 to {MAX_NAME_LENGTH} letters, digits, '_', '.', ':' "
            f"or '-', got {name!r}"
        )
    return name


def _register(cls: type[Event]) -> None:
    with _registry_lock:
        existing = _registry.get(cls.event_name)
        # Re-defining the same class (a module reloaded, a test redefining it) replaces
        # it; a different class may not take a name that is in use.
        if existing is not None and (existing.__module__, existing.__qualname__) != (
            cls.__module__,
            cls.__qualname__,
        ):
            raise EventNameConflict(
                f"event name {cls.event_name!r} is already used by "
                f"{existing.__module__}.{existing.__qualname__}"
            )
        _registry[cls.event_name] = cls


def event_class(name: str) -> type[Event]:
    """The event class registered under ``name``."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownEventType(
            f"no event class is registered as {name!r}; define it in a module that this "
            "process imports (OUTBOX['AUTODISCOVER_MODULE'], by default <app>/events.py)"
        ) from None


def registered_events() -> dict[str, type[Event]]:
    with _registry_lock:
        return dict(_registry)


def decode(name: str, payload_json: str) -> Event:
    """The event stored as ``payload_json`` under type ``name``, via the registry."""
    cls = event_class(name)
    try:
        data = json.loads(payload_json)
    except ValueError as exc:
        raise InvalidEvent(f"{name}: the payload is not JSON: {exc}") from None
    return cls.from_payload(data)


# --------------------------------------------------------------------------- JSON form


class _Encoder(DjangoJSONEncoder):
    """Django's encoder, except that datetimes and times keep their microseconds
    (Django's keeps milliseconds only): an event reads back exactly as it was sent."""

    def default(self, o: Any) -> Any:
        if isinstance(o, enum.Enum):
            return o.value
        if isinstance(o, datetime | time):
            text = o.isoformat()
            return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text
        return super().default(o)


_hint_cache: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()


def _hints(cls: type) -> dict[str, Any]:
    hints = _hint_cache.get(cls)
    if hints is None:
        try:
            hints = typing.get_type_hints(cls)
        except (NameError, TypeError):
            # Annotations naming what the class's module cannot resolve (a class local
            # to a function): the fields are read as plain JSON values.
            hints = {}
        _hint_cache[cls] = hints
    return hints


def _from_dict(cls: type[Any], data: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    kwargs = {
        f.name: _convert(hints.get(f.name, Any), data[f.name])
        for f in dataclasses.fields(cls)
        if f.init and f.name in data
    }
    return cls(**kwargs)


_PARSERS: dict[Any, Any] = {
    datetime: parse_datetime,
    date: parse_date,
    time: parse_time,
    timedelta: parse_duration,
}


def _parse(tp: Any, value: Any) -> Any:
    if isinstance(value, tp):
        return value
    parsed = _PARSERS[tp](str(value))
    if parsed is None:
        raise ValueError(f"{value!r} is not a valid {tp.__name__}")
    return parsed


def _convert(tp: Any, value: Any) -> Any:
    if value is None or tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if tp in _PARSERS:
        return _parse(tp, value)
    if tp is uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    if tp is Decimal:
        return Decimal(str(value))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return _from_dict(tp, value)
    if origin in (list, set, frozenset) and args:
        return origin(_convert(args[0], v) for v in value)
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(t, v) for t, v in zip(args, value, strict=True))
    if origin in (dict, Mapping) and len(args) == 2:
        return {k: _convert(args[1], v) for k, v in value.items()}
    return value
