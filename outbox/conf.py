"""The only reader of the ``OUTBOX`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ledon.conf import SettingsReader, ValueChecks, is_database_alias_or_none, is_number

from .exceptions import OutboxConfigurationError


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    #: Store integration events in the outbox table (True) or publish them on the
    #: in-process event bus after commit (False). Calling code is the same.
    ENABLED: bool = False
    #: Transport the dispatcher publishes through: a built-in name ("in-process")
    #: or the dotted path of a :class:`outbox.transports.base.Transport` subclass.
    TRANSPORT: str = "in-process"
    #: Keyword options handed to the transport.
    TRANSPORT_OPTIONS: dict[str, Any] = field(default_factory=dict)
    #: Messages claimed and published per batch at most.
    BATCH_SIZE: int = 100
    #: Delivery attempts before a message is parked.
    MAX_ATTEMPTS: int = 10
    #: Retry after a failed delivery: first delay in seconds, growth factor, cap,
    #: and jitter ratio.
    RETRY_BASE_DELAY: float = 1.0
    RETRY_BACKOFF_FACTOR: float = 2.0
    RETRY_MAX_DELAY: float = 600.0
    RETRY_JITTER: float = 0.1
    #: Seconds a claimed batch stays leased; it must outlast publishing one batch.
    LEASE_SECONDS: float = 60.0
    #: Seconds between two polls for due messages (SQLite; a fallback on PostgreSQL).
    POLL_INTERVAL: float = 1.0
    #: Seconds between two sweeps for batches whose dispatcher stopped.
    RECOVERY_INTERVAL: float = 10.0
    #: Retention (None: kept forever): seconds sent messages are kept after they
    #: were sent (7 days), parked ones after they were parked (30 days: an operator
    #: may still redeliver them), and inbox records after their message was
    #: processed (14 days: a redelivery older than that is processed again).
    RETENTION_SECONDS: float | None = 7 * 86_400.0
    PARKED_RETENTION_SECONDS: float | None = 30 * 86_400.0
    INBOX_RETENTION_SECONDS: float | None = 14 * 86_400.0
    #: Seconds between two retention clean-ups.
    CLEANUP_INTERVAL: float = 300.0
    #: PostgreSQL channel used to wake dispatchers when a message is stored.
    NOTIFY_CHANNEL: str = "ledon_outbox"
    #: PostgreSQL: the ``DATABASES`` alias whose connection a dispatcher LISTENs on;
    #: None: the outbox database's own. Behind a transaction pooler, an alias that
    #: connects to the same database directly (a pooled alias cannot LISTEN:
    #: dispatchers then only poll, and check ``outbox.W003`` says so).
    LISTEN_DATABASE: str | None = None
    #: Largest accepted event payload, in bytes of JSON text.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Module imported from each installed app at start-up, where events are
    #: defined and subscribed (None: import nothing).
    AUTODISCOVER_MODULE: str | None = "events"
    #: Prometheus counters of deliveries and consumed messages (``[metrics]``).
    METRICS: bool = False
    #: OpenTelemetry spans of publish and consume, the trace context carried in
    #: the messages' headers (``[otel]``).
    TRACING: bool = False


_values = ValueChecks("OUTBOX", OutboxConfigurationError)


def _check(result: OutboxSettings) -> None:
    """Raise :class:`~outbox.exceptions.OutboxConfigurationError` for a bad value."""

    def fail(key: str, expected: str) -> Exception:
        return _values.fail(result, key, expected)

    _values.flags(result, "ENABLED", "METRICS", "TRACING")
    if not isinstance(result.TRANSPORT, str) or not result.TRANSPORT:
        raise fail("TRANSPORT", "a transport name or dotted path")
    if not isinstance(result.TRANSPORT_OPTIONS, dict):
        raise fail("TRANSPORT_OPTIONS", "a dict")
    _values.positive_ints(result, "BATCH_SIZE", "MAX_ATTEMPTS", "MAX_PAYLOAD_BYTES")
    _values.positive(
        result, "LEASE_SECONDS", "POLL_INTERVAL", "RECOVERY_INTERVAL", "CLEANUP_INTERVAL"
    )
    _values.positive_or_none(
        result, "RETENTION_SECONDS", "PARKED_RETENTION_SECONDS", "INBOX_RETENTION_SECONDS"
    )
    _values.not_negative(result, "RETRY_BASE_DELAY", "RETRY_MAX_DELAY")
    if not is_number(result.RETRY_BACKOFF_FACTOR) or result.RETRY_BACKOFF_FACTOR < 1:
        raise fail("RETRY_BACKOFF_FACTOR", "a number >= 1")
    if not is_number(result.RETRY_JITTER) or not 0 <= result.RETRY_JITTER < 1:
        raise fail("RETRY_JITTER", "a ratio in [0, 1)")
    if not isinstance(result.NOTIFY_CHANNEL, str) or not re.fullmatch(
        r"[a-z_][a-z0-9_]{0,62}", result.NOTIFY_CHANNEL
    ):
        raise fail("NOTIFY_CHANNEL", "a lowercase identifier of at most 63 characters")
    if not is_database_alias_or_none(result.LISTEN_DATABASE):
        raise fail("LISTEN_DATABASE", "None or an alias of DATABASES")
    module = result.AUTODISCOVER_MODULE
    if module is not None and (not isinstance(module, str) or not module.isidentifier()):
        raise fail("AUTODISCOVER_MODULE", "a module name or None")


#: The current ``OUTBOX`` settings, validated: ``outbox_settings()``.
outbox_settings = SettingsReader("OUTBOX", OutboxSettings, _check, OutboxConfigurationError)
