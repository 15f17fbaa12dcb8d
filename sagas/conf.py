"""The only reader of the ``SAGAS`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

from dataclasses import dataclass

from ledon.conf import SettingsReader, ValueChecks

from .exceptions import SagasConfigurationError


@dataclass(frozen=True, slots=True)
class SagasSettings:
    #: Seconds a runner's claim on an instance lasts without renewal; after that,
    #: ``recover_sagas`` may take the instance over.
    LEASE_SECONDS: float = 30
    #: Seconds between two lease renewals (default: a third of ``LEASE_SECONDS``).
    HEARTBEAT_SECONDS: float | None = None
    #: Seconds a step (or a compensation) may run; a step may set its own. ``None``
    #: waits for ever.
    STEP_TIMEOUT: float | None = 60
    #: Seconds a step gets to stop after its cancellation signal before the runner
    #: treats it as failed and stops waiting for it.
    CANCEL_GRACE_SECONDS: float = 5
    #: Tries of one compensation before the instance is left failed (needs attention).
    COMPENSATION_ATTEMPTS: int = 3
    #: Seconds before the second try of a compensation; doubled for each further try.
    COMPENSATION_RETRY_DELAY: float = 1
    #: Seconds between two looks for instances to recover (``recover_sagas``).
    POLL_INTERVAL: float = 1
    #: Module imported from each installed app when Django starts, to register sagas.
    AUTODISCOVER_MODULE: str = "sagas"
    #: Largest accepted saga data, in bytes of JSON text.
    MAX_DATA_BYTES: int = 1_000_000
    #: Whether every ``run_jobs`` worker also recovers unfinished instances, as
    #: ``recover_sagas`` does (when the ``jobs`` app is installed).
    RECOVER_IN_WORKER: bool = True
    #: Takeovers from an expired lease an instance may see without moving on before
    #: its current step counts as failed (a step that kills or hangs its process every
    #: time); ``None``: no limit.
    MAX_TAKEOVERS: int | None = 3
    #: Retention: seconds a succeeded or compensated instance is kept after it
    #: finished, 14 days by default (None: forever). Failed instances need an
    #: operator and are kept. A repeated ``run_saga`` with the key of a deleted
    #: instance runs the saga again. Runners delete older ones every
    #: ``CLEANUP_INTERVAL`` seconds; ``manage.py purge_sagas`` does it on demand.
    RETENTION_SECONDS: float | None = 14 * 86_400.0
    CLEANUP_INTERVAL: float = 300.0
    #: Prometheus counters of finished instances (``[metrics]``).
    METRICS: bool = False
    #: An OpenTelemetry span per step and compensation (``[otel]``).
    TRACING: bool = False

    @property
    def heartbeat_seconds(self) -> float:
        return self.HEARTBEAT_SECONDS or self.LEASE_SECONDS / 3


_values = ValueChecks("SAGAS", SagasConfigurationError)


def _check(result: SagasSettings) -> None:
    """Raise :class:`~sagas.exceptions.SagasConfigurationError` for a bad value."""
    _values.positive(
        result,
        "LEASE_SECONDS",
        "CANCEL_GRACE_SECONDS",
        "POLL_INTERVAL",
        "MAX_DATA_BYTES",
        "CLEANUP_INTERVAL",
    )
    _values.positive_or_none(result, "HEARTBEAT_SECONDS", "STEP_TIMEOUT", "RETENTION_SECONDS")
    _values.not_negative(result, "COMPENSATION_RETRY_DELAY")
    _values.int_from(result, "COMPENSATION_ATTEMPTS", 1, expected="an integer of at least 1")
    _values.int_from(
        result, "MAX_TAKEOVERS", 1, expected="None or an integer of at least 1", none_ok=True
    )
    _values.flags(result, "RECOVER_IN_WORKER", "METRICS", "TRACING")
    if result.heartbeat_seconds >= result.LEASE_SECONDS:
        raise SagasConfigurationError(
            "SAGAS['HEARTBEAT_SECONDS'] must be shorter than SAGAS['LEASE_SECONDS'] "
            "or leases expire between two renewals"
        )
    if not isinstance(result.AUTODISCOVER_MODULE, str):
        raise SagasConfigurationError(
            "SAGAS['AUTODISCOVER_MODULE'] must be a module name, or '' to turn discovery off"
        )


#: The current ``SAGAS`` settings, validated: ``sagas_settings()``.
sagas_settings = SettingsReader("SAGAS", SagasSettings, _check, SagasConfigurationError)
