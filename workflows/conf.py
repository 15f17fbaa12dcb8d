"""The only reader of the ``WORKFLOWS`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

from dataclasses import dataclass

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
    #: Seconds before the second try of a failed step; doubled for each further try.
    STEP_RETRY_DELAY: float = 1.0
    #: The longest wait between two tries of a step, in seconds.
    STEP_RETRY_MAX_DELAY: float = 300.0
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
    _values.not_negative(result, "STEP_RETRY_DELAY", "STEP_RETRY_MAX_DELAY")
    _values.positive_ints(result, "RETENTION_BATCH", "MAX_VALUE_BYTES", "MAX_MAP_ITEMS")
    _values.flags(result, "METRICS", "TRACING")
    if not isinstance(result.ADVANCE_QUEUE, str) or not result.ADVANCE_QUEUE:
        raise WorkflowsConfigurationError("WORKFLOWS['ADVANCE_QUEUE'] must be a queue name")


#: The current ``WORKFLOWS`` settings, validated: ``workflows_settings()``.
workflows_settings = SettingsReader(
    "WORKFLOWS", WorkflowsSettings, _check, WorkflowsConfigurationError
)
