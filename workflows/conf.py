"""The only reader of the ``WORKFLOWS`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

from dataclasses import dataclass

from ledon.backoff import RetryPace
from ledon.conf import SettingsReader, ValueChecks

from .exceptions import WorkflowsConfigurationError


@dataclass(frozen=True, slots=True)
class WorkflowsSettings:
    #: Seconds a finished run (with its checkpoints, items and signals) is kept before
    #: every worker's retention deletes it; ``None`` keeps finished runs for ever.
    RETENTION_SECONDS: float | None = 30 * 86_400
    #: Seconds between two retention passes in each ``run_jobs`` worker.
    CLEANUP_INTERVAL: float = 300.0
    #: Runs deleted per statement batch by retention (bounded work per transaction).
    RETENTION_BATCH: int = 500
    #: Retries of a failed inline step or activity try, as ``JOBS``' and ``OUTBOX``'s:
    #: first delay in seconds, growth factor, cap, and jitter ratio (none by default).
    RETRY_BASE_DELAY: float = 1.0
    RETRY_BACKOFF_FACTOR: float = 2.0
    RETRY_MAX_DELAY: float = 300.0
    RETRY_JITTER: float = 0.0
    #: The queue of the jobs that advance runs (activities use their own queue).
    ADVANCE_QUEUE: str = "default"
    #: Largest accepted input, output, step argument or result, in bytes of JSON text
    #: (a map's results count as one list).
    MAX_VALUE_BYTES: int = 1_000_000
    #: Most items one ``map`` may be given (``TooManyItems`` at the call beyond).
    MAX_MAP_ITEMS: int = 10_000
    #: Prometheus counters of runs and steps, gauges of unfinished runs (``[metrics]``).
    METRICS: bool = False
    #: An OpenTelemetry span per advance and per inline step (``[otel]``).
    TRACING: bool = False


_values = ValueChecks("WORKFLOWS", WorkflowsConfigurationError)


def _check(result: WorkflowsSettings) -> None:
    """Raise :class:`~workflows.exceptions.WorkflowsConfigurationError` for a bad value."""
    _values.positive_or_none(result, "RETENTION_SECONDS")
    _values.positive(result, "CLEANUP_INTERVAL")
    _values.retry_pace(result)
    _values.positive_ints(result, "RETENTION_BATCH", "MAX_VALUE_BYTES", "MAX_MAP_ITEMS")
    _values.flags(result, "METRICS", "TRACING")
    if not isinstance(result.ADVANCE_QUEUE, str) or not result.ADVANCE_QUEUE:
        raise WorkflowsConfigurationError("WORKFLOWS['ADVANCE_QUEUE'] must be a queue name")


#: Keys that were renamed: their error names the new key.
RENAMED = {"STEP_RETRY_DELAY": "RETRY_BASE_DELAY", "STEP_RETRY_MAX_DELAY": "RETRY_MAX_DELAY"}

#: The current ``WORKFLOWS`` settings, validated: ``workflows_settings()``.
workflows_settings = SettingsReader(
    "WORKFLOWS", WorkflowsSettings, _check, WorkflowsConfigurationError, RENAMED
)


def retry_pace() -> RetryPace:
    """The pace of the retries of failed inline steps and activity tries (the
    ``RETRY_*`` keys), read at each retry."""
    return RetryPace.from_settings(workflows_settings())
