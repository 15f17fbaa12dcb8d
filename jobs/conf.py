"""The only reader of the ``JOBS`` setting: typed, with defaults, reset on change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ledon.conf import (
    SettingsReader,
    ValueChecks,
    is_database_alias_or_none,
    is_number,
    unknown_keys_message,
)

from . import validation
from .exceptions import InvalidLimits, JobsConfigurationError
from .flow_control import LIMIT_NAMES, ClaimLimits, Limits, declared_handler_limits, limits_of
from .validation import scope_hash


@dataclass(frozen=True, slots=True)
class JobsSettings:
    #: Seconds a claimed attempt stays leased without a heartbeat.
    LEASE_SECONDS: float = 30
    #: Seconds between two lease renewals of a running worker.
    HEARTBEAT_SECONDS: float = 10
    #: Seconds between two polls for due jobs (SQLite; a fallback on PostgreSQL).
    POLL_INTERVAL: float = 1.0
    #: Module imported from each installed app by the worker to register handlers.
    AUTODISCOVER_MODULE: str = "tasks"
    #: Largest accepted payload, in bytes of JSON text.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Seconds between two checks for cancel requests of running jobs.
    CANCEL_POLL_INTERVAL: float = 0.5
    #: Seconds between two sweeps for attempts whose lease expired.
    RECOVERY_INTERVAL: float = 5.0
    #: Automatic retry: first delay in seconds, growth factor, cap, and jitter ratio.
    RETRY_BASE_DELAY: float = 2.0
    RETRY_BACKOFF_FACTOR: float = 2.0
    RETRY_MAX_DELAY: float = 3600.0
    RETRY_JITTER: float = 0.25
    #: Seconds handlers get, after their shutdown signal, before they are re-queued.
    SHUTDOWN_GRACE_SECONDS: float = 5.0
    #: Jobs claimed per query at most.
    CLAIM_BATCH_SIZE: int = 64
    #: Look-ahead: jobs a worker may claim beyond its free slots, for slots whose
    #: handler will free soon, so that a slot finds its next job waiting when its
    #: handler returns; taken only while handlers are quick (see the worker's slots).
    #: 0: none (a slot's next job comes with its finish's commit). None: chosen by
    #: the worker — 64, or 16 where a flow limit applies to its queues.
    PREFETCH: int | None = None
    #: Look-ahead is only taken for slots whose handler has run less than this many
    #: seconds, and a look-ahead job that waited this long for a slot is given back.
    PREFETCH_MAX_WAIT: float = 0.5
    #: PostgreSQL channel used to wake workers when a job is queued.
    NOTIFY_CHANNEL: str = "ledon_jobs"
    #: PostgreSQL: the ``DATABASES`` alias whose connection a worker LISTENs on (one
    #: connection per worker); None: the jobs database's own. Behind a transaction
    #: pooler, an alias that connects to the same database directly (a pooled alias
    #: cannot LISTEN: workers then only poll, and check ``jobs.W001`` says so).
    LISTEN_DATABASE: str | None = None
    #: Retention: seconds finished jobs (and their attempts) are kept, 14 days by
    #: default; None keeps them forever. Workers delete older ones every
    #: CLEANUP_INTERVAL seconds; ``manage.py purge_jobs`` does it on demand.
    RETENTION_SECONDS: float | None = 14 * 86_400.0
    CLEANUP_INTERVAL: float = 300.0
    #: PostgreSQL: run the hot statements (a single submit, the worker's claim and
    #: finish) as server-side prepared statements, planned once per connection. Turn
    #: off behind a transaction-pooling PgBouncer older than 1.21.
    PREPARED_STATEMENTS: bool = True
    #: PostgreSQL, opt-in: the worker's own claim and finish transactions commit with
    #: ``synchronous_commit = off`` (``SET LOCAL``; the handlers' transactions stay
    #: durable). A crash of the database server can lose the last few hundred
    #: milliseconds of those commits: finished jobs then run again, claims are undone.
    ASYNCHRONOUS_COMMIT: bool = False
    #: Schedules: every ``run_jobs`` worker enqueues the periods that are
    #: due, waking at the next period start; False turns that off in this process.
    SCHEDULER: bool = True
    #: The scope of every period's job.
    SCHEDULE_SCOPE: str = "periodic"
    #: catch_up="all": missed periods enqueued at most (the most recent ones).
    SCHEDULE_MAX_CATCH_UP: int = 100
    #: catch_up="skip": a period is enqueued only if it began less than this ago.
    SCHEDULE_TOLERANCE_SECONDS: float = 60.0
    #: A worker re-reads the schedules at least this often, however far the next
    #: period: a resume, or a schedule declared by another deploy, is noticed within it.
    SCHEDULE_REFRESH_SECONDS: float = 30.0
    #: Rolling deploys: a job whose handler (or version) a worker does not know
    #: is put back, UNKNOWN_HANDLER_RETRY_DELAY seconds later each time and without
    #: consuming an attempt, until this many seconds have passed since its first such
    #: claim; then it fails naming the handler and version. 0 fails it at once.
    UNKNOWN_HANDLER_RETRY_SECONDS: float = 600.0
    UNKNOWN_HANDLER_RETRY_DELAY: float = 10.0
    #: Dotted paths of middlewares that wrap every handler invocation,
    #: outermost first (see :mod:`jobs.middleware`).
    MIDDLEWARE: Sequence[str] = ()
    #: Prometheus counters and histograms of jobs (the ``[metrics]`` extra).
    METRICS: bool = False
    #: OpenTelemetry spans of submissions and attempts (the ``[otel]`` extra).
    TRACING: bool = False
    #: The workers registry: seconds between two heartbeats of each engine's row; a
    #: row silent for WORKERS_SILENT_AFTER heartbeats is shown as silent, and one
    #: silent for WORKERS_RETENTION_SECONDS is deleted.
    WORKERS_HEARTBEAT_SECONDS: float = 10.0
    WORKERS_SILENT_AFTER: int = 3
    WORKERS_RETENTION_SECONDS: float = 86_400.0
    #: Seconds a handler may run before it is signalled to stop, for handlers
    #: that set no ``timeout``; None: no timeout.
    JOB_TIMEOUT_SECONDS: float | None = None
    #: Seconds a timed-out handler gets to stop before its attempt is failed
    #: with ``JobTimedOut`` and its thread abandoned (a fresh one takes its slot).
    TIMEOUT_GRACE_SECONDS: float = 5.0
    #: Times a job may snooze (``raise Snooze``) before the attempt that asks once
    #: more ends Failed naming the bound; a handler may set its own
    #: (``@job_handler(max_snoozes=N)``).
    MAX_SNOOZES: int = 100
    #: The crash budget: an attempt recovered because its worker died (its lease
    #: expired, or the worker restarted) or outlived the shutdown's grace uses none of
    #: the job's ``max_attempts`` — the job is queued again at once — while the job has
    #: been interrupted fewer times than this; the interruption that reaches it ends
    #: the job Interrupted as one that keeps killing its worker.
    MAX_INTERRUPTIONS: int = 3
    #: Limits and order per queue, enforced by every worker's claim:
    #: ``{"emails": {"max_running": 4, "rate": (10, 1)}}`` (keys: ``max_running``,
    #: ``max_running_per_scope``, ``max_running_per_key``, ``rate`` and
    #: ``rate_per_key`` — ``(count, seconds)`` or ``(count, seconds, burst)`` —, and ``fair``:
    #: True, the default, shares a queue's starts across scopes; False keeps
    #: submission order).
    QUEUES: dict[str, Any] = field(default_factory=dict)


_values = ValueChecks("JOBS", JobsConfigurationError)


def _check(result: JobsSettings) -> None:
    """Raise :class:`~jobs.exceptions.JobsConfigurationError` for a bad value."""
    middleware = result.MIDDLEWARE
    if not isinstance(middleware, list | tuple) or not all(
        isinstance(path, str) and path for path in middleware
    ):
        raise JobsConfigurationError(
            f"JOBS['MIDDLEWARE'] must be a list of dotted paths, got {middleware!r}"
        )
    _values.positive(
        result,
        "LEASE_SECONDS",
        "HEARTBEAT_SECONDS",
        "POLL_INTERVAL",
        "MAX_PAYLOAD_BYTES",
        "RECOVERY_INTERVAL",
        "CANCEL_POLL_INTERVAL",
        "CLAIM_BATCH_SIZE",
        "CLEANUP_INTERVAL",
        "SCHEDULE_MAX_CATCH_UP",
        "SCHEDULE_TOLERANCE_SECONDS",
        "SCHEDULE_REFRESH_SECONDS",
        "WORKERS_HEARTBEAT_SECONDS",
        "WORKERS_SILENT_AFTER",
        "WORKERS_RETENTION_SECONDS",
    )
    if result.HEARTBEAT_SECONDS >= result.LEASE_SECONDS:
        raise JobsConfigurationError(
            "JOBS['HEARTBEAT_SECONDS'] must be shorter than JOBS['LEASE_SECONDS'] "
            "or leases expire between two heartbeats"
        )
    _values.int_from(result, "MAX_SNOOZES", 0, 1_000_000, expected="an int from 0 to 1000000")
    _values.int_from(result, "MAX_INTERRUPTIONS", 1, 1000, expected="an int from 1 to 1000")
    _values.positive_or_none(result, "RETENTION_SECONDS", "JOB_TIMEOUT_SECONDS")
    _values.not_negative(
        result,
        "UNKNOWN_HANDLER_RETRY_SECONDS",
        "UNKNOWN_HANDLER_RETRY_DELAY",
        "TIMEOUT_GRACE_SECONDS",
    )
    if not is_database_alias_or_none(result.LISTEN_DATABASE):
        raise JobsConfigurationError(
            "JOBS['LISTEN_DATABASE'] must be None or an alias of DATABASES, "
            f"got {result.LISTEN_DATABASE!r}"
        )
    _values.flags(
        result, "PREPARED_STATEMENTS", "SCHEDULER", "METRICS", "TRACING", "ASYNCHRONOUS_COMMIT"
    )
    _values.int_from(
        result,
        "PREFETCH",
        0,
        1000,
        expected="None (chosen by the worker) or an int from 0 (no look-ahead) to 1000",
        none_ok=True,
    )
    if not is_number(result.PREFETCH_MAX_WAIT) or result.PREFETCH_MAX_WAIT <= 0:
        raise JobsConfigurationError(
            "JOBS['PREFETCH_MAX_WAIT'] must be a positive number of seconds, "
            f"got {result.PREFETCH_MAX_WAIT!r}"
        )
    _values.positive_ints(result, "WORKERS_SILENT_AFTER", "SCHEDULE_MAX_CATCH_UP")
    try:
        scope_hash(result.SCHEDULE_SCOPE)
    except ValueError as exc:
        raise JobsConfigurationError(
            f"JOBS['SCHEDULE_SCOPE'] is not a valid scope: {exc}"
        ) from None
    _check_queues(result.QUEUES)
    if not isinstance(result.AUTODISCOVER_MODULE, str) or not result.AUTODISCOVER_MODULE:
        raise JobsConfigurationError("JOBS['AUTODISCOVER_MODULE'] must be a module name")


#: A queue's keys that are not limits.
_ORDER_KEYS = ("fair",)
_QUEUE_KEYS = (*LIMIT_NAMES, *_ORDER_KEYS)


def _check_queues(queues: Any) -> None:
    if not isinstance(queues, dict):
        raise JobsConfigurationError(
            "JOBS['QUEUES'] must be a dict of queue name to limits, such as "
            '{"emails": {"max_running": 4, "rate": (10, 1)}}'
        )
    for name, values in queues.items():
        try:
            validation.name(name, "queue", validation.MAX_QUEUE_LENGTH)
        except ValueError as exc:
            raise JobsConfigurationError(f"JOBS['QUEUES']: {exc}") from None
        if not isinstance(values, dict):
            raise JobsConfigurationError(
                f"JOBS['QUEUES'][{name!r}] must be a dict of limits, got {values!r}"
            )
        unknown = sorted(set(values) - set(_QUEUE_KEYS))
        if unknown:
            raise JobsConfigurationError(
                unknown_keys_message(f"JOBS['QUEUES'][{name!r}] key(s)", unknown, _QUEUE_KEYS)
            )
        if not isinstance(values.get("fair", True), bool):
            raise JobsConfigurationError(
                f"JOBS['QUEUES'][{name!r}]['fair'] must be True or False, got {values['fair']!r}"
            )
        try:
            limits_of(values)
        except InvalidLimits as exc:
            raise JobsConfigurationError(f"JOBS['QUEUES'][{name!r}]: {exc}") from None


#: The current ``JOBS`` settings, validated: ``jobs_settings()``.
jobs_settings = SettingsReader("JOBS", JobsSettings, _check, JobsConfigurationError)

#: The settings object :func:`queue_limits` was last computed from, and its result.
_queue_limits: tuple[JobsSettings, dict[str, Limits]] | None = None


def queue_limits() -> dict[str, Limits]:
    """``JOBS["QUEUES"]`` as :class:`~jobs.flow_control.Limits` (queues without any left
    out); computed again whenever the ``JOBS`` setting is read again."""
    global _queue_limits
    current = jobs_settings()
    cached = _queue_limits
    if cached is not None and cached[0] is current:
        return cached[1]
    limits = {name: limits_of(values) for name, values in current.QUEUES.items()}
    result = {name: value for name, value in limits.items() if value}
    _queue_limits = (current, result)
    return result


def claim_limits() -> ClaimLimits:
    """The limits this process's claims keep: its handlers' and ``JOBS["QUEUES"]``."""
    return ClaimLimits(declared_handler_limits(), queue_limits())


def fair_queue(name: str) -> bool:
    """Whether queue ``name`` shares its starts across scopes (``JOBS["QUEUES"][name]
    ["fair"]``, True unless set to False)."""
    values = jobs_settings().QUEUES.get(name)
    return values is None or values.get("fair", True) is not False
