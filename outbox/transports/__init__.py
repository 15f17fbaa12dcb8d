"""Transports: where the dispatcher publishes outbox messages.

``OUTBOX["TRANSPORT"]`` names a built-in transport or gives the dotted path of a
:class:`~outbox.transports.base.Transport` subclass; ``OUTBOX["TRANSPORT_OPTIONS"]``
are passed to it as keyword arguments.
"""

from __future__ import annotations

from django.utils.module_loading import import_string

from ..conf import outbox_settings
from ..exceptions import OutboxConfigurationError
from .base import Transport

#: Built-in transports by name.
BUILTIN_TRANSPORTS: dict[str, str] = {
    "in-process": "outbox.transports.in_process.InProcessTransport",
    "rabbitmq": "outbox.transports.rabbitmq.RabbitMQTransport",
    "kafka": "outbox.transports.kafka.KafkaTransport",
}


def transport_class(name: str) -> type[Transport]:
    """The transport class ``name`` designates (a built-in name or a dotted path)."""
    path = BUILTIN_TRANSPORTS.get(name, name)
    if "." not in path:
        raise OutboxConfigurationError(
            f"unknown outbox transport {name!r}; use one of "
            f"{', '.join(sorted(BUILTIN_TRANSPORTS))} or the dotted path of a Transport class"
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise OutboxConfigurationError(
            f"outbox transport {name!r} cannot be imported: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise OutboxConfigurationError(
            f"outbox transport {name!r} is not a subclass of outbox.transports.base.Transport"
        )
    return cls


def get_transport() -> Transport:
    """A new instance of the configured transport."""
    settings = outbox_settings()
    cls = transport_class(settings.TRANSPORT)
    problems = cls.check_options(settings.TRANSPORT_OPTIONS)
    if problems:
        raise OutboxConfigurationError(
            f"OUTBOX['TRANSPORT_OPTIONS'] for {settings.TRANSPORT!r}: {'; '.join(problems)}"
        )
    return cls(**settings.TRANSPORT_OPTIONS)


__all__ = ["BUILTIN_TRANSPORTS", "Transport", "get_transport", "transport_class"]
