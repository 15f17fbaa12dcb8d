"""The only reader of the ``WORKFLOWS`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

from dataclasses import dataclass

from ledon.conf import SettingsReader, is_number

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
    #: Largest accepted input, output, step argument or result, in bytes of JSON text.
    MAX_VALUE_BYTES: int = 1_000_000
    #: Prometheus counters of runs and steps, gauges of unfinished runs (``[metrics]``).
    METRICS: bool = False
    #: An OpenTelemetry span per advance and per inline step (``[otel]``).
    TRACING: bool = False


def _check(result: WorkflowsSettings) -> None:
    """Raise :class:`~workflows.exceptions.WorkflowsConfigurationError` for a bad value."""
    retention = result.RETENTION_SECONDS
    if retention is not None and (not is_number(retention) or retention <= 0):
        raise WorkflowsConfigurationError(
            f"WORKFLOWS['RETENTION_SECONDS'] must be a positive number or None, got {retention!r}"
        )
    if not is_number(result.CLEANUP_INTERVAL) or result.CLEANUP_INTERVAL <= 0:
        raise WorkflowsConfigurationError(
            "WORKFLOWS['CLEANUP_INTERVAL'] must be a positive number of seconds, "
            f"got {result.CLEANUP_INTERVAL!r}"
        )
    for key in ("STEP_RETRY_DELAY", "STEP_RETRY_MAX_DELAY"):
        value = getattr(result, key)
        if not is_number(value) or value < 0:
            raise WorkflowsConfigurationError(
                f"WORKFLOWS[{key!r}] must be a number of seconds >= 0, got {value!r}"
            )
    for key in ("RETENTION_BATCH", "MAX_VALUE_BYTES"):
        value = getattr(result, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkflowsConfigurationError(
                f"WORKFLOWS[{key!r}] must be a positive integer, got {value!r}"
            )
    for key in ("METRICS", "TRACING"):
        if not isinstance(getattr(result, key), bool):
            raise WorkflowsConfigurationError(
                f"WORKFLOWS[{key!r}] must be True or False, got {getattr(result, key)!r}"
            )
    if not isinstance(result.ADVANCE_QUEUE, str) or not result.ADVANCE_QUEUE:
        raise WorkflowsConfigurationError("WORKFLOWS['ADVANCE_QUEUE'] must be a queue name")


#: The current ``WORKFLOWS`` settings, validated: ``workflows_settings()``.
workflows_settings = SettingsReader(
    "WORKFLOWS", WorkflowsSettings, _check, WorkflowsConfigurationError
)
