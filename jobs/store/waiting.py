"""Why a Queued job has not started, and each limit key's state: reads for operators
(the admin, ``manage.py jobs_queues why`` and ``keys``). State is data — frozen
dataclasses, one per reason — and text is rendered from it (``describe()``).

A job waits for the first of these that holds, in this order:

- its start deadline passed (:class:`Expired`): it never starts;
- held behind an earlier job of its sequence (:class:`BehindSequence`: which job, or
  the Failed job that halts the sequence);
- no attempt left (:class:`NoAttemptsLeft`);
- its queue is paused (:class:`QueuePaused`) and/or it is not due yet
  (:class:`NotDue`: a delay, a retry's back-off, a snooze, a debounce, a worker
  without its handler — read from the job's data);
- once due: each limit with no room for it (:class:`OverLimit`: a ``max_running``,
  ``max_running_per_scope`` or ``max_running_per_key`` at its cap, with the count;
  :class:`OverRate`: a ``rate`` or ``rate_per_key`` without its units, with when they
  are free), under the limits this process declares, as its claims would keep them;
- else it is due and free of limits (:class:`InLine`): it waits for its place in line
  and a worker.

Counts are of Running jobs (what every claim counts, on both databases); rates are
their rows (``jobs_ratebucket``, :mod:`jobs.store.rates`). A read, not a promise: a
worker may claim the job the moment after.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from django.db.models import Count, Q

from ledon.db import connection_for

from ..conf import claim_limits as claim_limits
from ..exceptions import JobNotFound
from ..flow_control import ClaimLimits, Limits, Rate
from ..models import Job, JobAttempt, Queue, RateBucket, Sequence
from ..types import AttemptStatus, JobStatus
from .base import current_time
from .rates import RateState, moment, nanoseconds, rate_key, read_states, units_of


def _at(value: datetime) -> str:
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _limit(on: str, name: str, rule: str, value: object, limit_key: str) -> str:
    text = f"{on} {name!r} {rule}={value}"
    return f"{text} for key {limit_key!r}" if limit_key else text


class DueCause(StrEnum):
    """Why a job is due later than now, read from its data."""

    #: Submitted with ``not_before`` (or by a schedule for later).
    DELAY = "delay"
    #: A debounced submission moved its start (``debounce``).
    DEBOUNCE = "debounce"
    #: Its last attempt failed and a retry waits for its back-off.
    BACKOFF = "backoff"
    #: Its last execution snoozed until then.
    SNOOZE = "snooze"
    #: Put back by a worker that did not know its handler or version.
    UNKNOWN_HANDLER = "unknown_handler"


_DUE_TEXT = {
    DueCause.DELAY: "delayed",
    DueCause.DEBOUNCE: "debounced",
    DueCause.BACKOFF: "backing off after a failed attempt",
    DueCause.SNOOZE: "snoozed",
    DueCause.UNKNOWN_HANDLER: "put back by a worker that does not know its handler",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Expired:
    """Its start deadline ``start_by`` passed: no claim takes it, the sweep ends it
    Expired."""

    start_by: datetime

    def describe(self) -> str:
        return f"its start deadline ({_at(self.start_by)}) passed: it never starts"


@dataclass(frozen=True, slots=True, kw_only=True)
class BehindSequence:
    """Held behind an earlier job of its sequence ``sequence_key``: ``earlier``, the
    job whose turn it is (None if none is Queued or Running); or, when the sequence is
    halted, ``halted_by``, the Failed job that halts it until it is retried or
    cancelled."""

    sequence_key: str
    earlier: str | None = None
    halted_by: str | None = None

    def describe(self) -> str:
        text = f"held: it waits for an earlier job of its sequence {self.sequence_key!r}"
        if self.halted_by is not None:
            return (
                f"{text}: the sequence is halted by failed job {self.halted_by!r};"
                " retry or cancel that job to go on"
            )
        return f"{text}: {self.earlier!r} goes first" if self.earlier else text


@dataclass(frozen=True, slots=True, kw_only=True)
class NoAttemptsLeft:
    """Queued with every attempt used (``attempts`` of ``max_attempts``)."""

    attempts: int
    max_attempts: int

    def describe(self) -> str:
        return f"no attempt left ({self.attempts} of {self.max_attempts} used)"


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePaused:
    """Its queue is paused: no worker claims its jobs until it is resumed."""

    queue: str

    def describe(self) -> str:
        return f"its queue {self.queue!r} is paused"


@dataclass(frozen=True, slots=True, kw_only=True)
class NotDue:
    """Not due until ``until``, because of ``cause``; a debounced job starts at the
    latest at ``latest`` (its ``debounce_max``)."""

    until: datetime
    cause: DueCause
    latest: datetime | None = None

    def describe(self) -> str:
        text = f"{_DUE_TEXT[self.cause]}: not due until {_at(self.until)}"
        return f"{text}, at the latest {_at(self.latest)}" if self.latest else text


@dataclass(frozen=True, slots=True, kw_only=True)
class OverLimit:
    """A counted limit at its cap: ``rule`` (``max_running``,
    ``max_running_per_scope`` or ``max_running_per_key``) of the handler or queue
    ``name`` (``on``), for ``limit_key`` or ``scope_hash`` when it counts per key or
    scope, with ``running`` jobs against ``cap``."""

    on: str
    name: str
    rule: str
    cap: int
    running: int
    limit_key: str = ""
    scope_hash: str = ""

    def describe(self) -> str:
        text = _limit(self.on, self.name, self.rule, self.cap, self.limit_key)
        if self.scope_hash:
            text += f" for its scope {self.scope_hash[:12]}…"
        return f"over {text}: {self.running} running of {self.cap}"


@dataclass(frozen=True, slots=True, kw_only=True)
class OverRate:
    """A rate without room: ``rule`` (``rate`` or ``rate_per_key``) of the handler or
    queue ``name`` (``on``), for ``limit_key`` per key; the job needs ``units`` (its
    cost under the rate), ``room`` are free now, and they are free at ``frees_at``."""

    on: str
    name: str
    rule: str
    rate: Rate
    units: int
    room: int
    frees_at: datetime
    limit_key: str = ""

    def describe(self) -> str:
        text = _limit(self.on, self.name, self.rule, self.rate.describe(), self.limit_key)
        return (
            f"over {text}: needs {self.units} unit(s), {max(self.room, 0)} free;"
            f" free at {_at(self.frees_at)}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InLine:
    """Due, and no limit holds it: it waits for its place in line — ``ahead`` due jobs
    of its queue go before it (priority, then place) — and a worker of its queue."""

    queue: str
    ahead: int

    def describe(self) -> str:
        return (
            f"due: {self.ahead} due job(s) of queue {self.queue!r} go before it "
            "(priority, then place in line); then it waits for a worker"
        )


WaitReason = (
    Expired | BehindSequence | NoAttemptsLeft | QueuePaused | NotDue | OverLimit | OverRate | InLine
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """Why job ``job_id`` of ``scope_hash`` has not started at ``now``: its
    ``reasons`` (none when it is not Queued)."""

    scope_hash: str
    job_id: str
    handler: str
    queue: str
    status: JobStatus
    now: datetime
    reasons: tuple[WaitReason, ...]

    def describe(self) -> str:
        """The reasons, one sentence each, joined by semicolons ("-" for a job not
        Queued)."""
        return "; ".join(reason.describe() for reason in self.reasons) or "-"


def _behind(job: Job) -> BehindSequence:
    assert job.sequence_key is not None
    mates = Job.objects.filter(scope_hash=job.scope_hash, sequence_key=job.sequence_key)
    halted_by = (
        Sequence.objects.filter(scope_hash=job.scope_hash, sequence_key=job.sequence_key)
        .values_list("halted_by", flat=True)
        .first()
    )
    earlier = (
        mates.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING), sequence_held=False)
        .order_by("id")
        .values_list("job_id", flat=True)
        .first()
    )
    return BehindSequence(sequence_key=job.sequence_key, earlier=earlier, halted_by=halted_by)


def _due_cause(job: Job) -> DueCause:
    if job.handler_unknown_since is not None:
        return DueCause.UNKNOWN_HANDLER
    last = (
        JobAttempt.objects.filter(job=job).order_by("-number").values_list("status", flat=True)
    ).first()
    if last == AttemptStatus.SNOOZED:
        return DueCause.SNOOZE
    if last == AttemptStatus.FAILED:
        return DueCause.BACKOFF
    if job.unique_while == "queued" and job.debounce_until is not None:
        return DueCause.DEBOUNCE
    return DueCause.DELAY


def _named(job: Job, limits: ClaimLimits) -> Iterable[tuple[str, str, Limits]]:
    for on, name, configured in (
        ("handler", job.handler, limits.handlers),
        ("queue", job.queue, limits.queues),
    ):
        if name in configured:
            yield on, name, configured[name]


def _running(on: str, name: str, **more: str) -> int:
    return Job.objects.running().filter(**{on: name}, **more).count()


def _over_limits(job: Job, limits: ClaimLimits) -> list[OverLimit]:
    found = []
    for on, name, value in _named(job, limits):
        for rule, cap, more in (
            ("max_running", value.max_running, {}),
            ("max_running_per_scope", value.max_running_per_scope, {"scope_hash": job.scope_hash}),
            ("max_running_per_key", value.max_running_per_key, {"limit_key": job.limit_key}),
        ):
            if cap is None or (rule == "max_running_per_key" and not job.limit_key):
                continue
            running = _running(on, name, **more)
            if running >= cap:
                found.append(
                    OverLimit(on=on, name=name, rule=rule, cap=cap, running=running, **more)
                )
    return found


def _job_rates(job: Job, limits: ClaimLimits) -> list[tuple[str, str, str, str, Rate]]:
    """(on, name, rule, rate key, rate) of every rate ``job`` falls under."""
    found = []
    for on, name, value in _named(job, limits):
        if value.rate is not None:
            found.append((on, name, "rate", rate_key(on, name), value.rate))
        if value.rate_per_key is not None and job.limit_key:
            key = rate_key(on, name, job.limit_key)
            found.append((on, name, "rate_per_key", key, value.rate_per_key))
    return found


def _over_rates(job: Job, limits: ClaimLimits, now: datetime) -> list[OverRate]:
    rates = _job_rates(job, limits)
    states = read_states(connection_for(RateBucket), {key: rate for *_, key, rate in rates})
    now_ns = nanoseconds(now)
    found = []
    for on, name, rule, key, rate in rates:
        state, units = states[key], units_of(job.cost, rate)
        room = state.room(now_ns)
        if room < units:
            found.append(
                OverRate(
                    on=on, name=name, rule=rule, rate=rate, units=units, room=room,
                    frees_at=moment(state.frees_at(now_ns, units)),
                    limit_key=job.limit_key if rule == "rate_per_key" else "",
                )
            )  # fmt: skip
    return found


def _ahead(job: Job, now: datetime) -> int:
    before = Q(priority__gt=job.priority) | Q(priority=job.priority, fair_at__lt=job.fair_at)
    before |= Q(priority=job.priority, fair_at=job.fair_at, id__lt=job.id)
    return Job.objects.due(now).filter(before, queue=job.queue).count()


def reasons_of(job: Job, now: datetime, limits: ClaimLimits) -> tuple[WaitReason, ...]:
    """Why ``job`` (a row just read) has not started at ``now`` under ``limits``
    (see the module's docstring); none when it is not Queued."""
    if job.status != JobStatus.QUEUED:
        return ()
    if job.start_by is not None and job.start_by <= now:
        return (Expired(start_by=job.start_by),)
    if job.sequence_held:
        return (_behind(job),)
    if job.attempt_count >= job.max_attempts:
        return (NoAttemptsLeft(attempts=job.attempt_count, max_attempts=job.max_attempts),)
    reasons: list[WaitReason] = []
    if Queue.objects.filter(name=job.queue, paused=True).exists():
        reasons.append(QueuePaused(queue=job.queue))
    if job.next_run_at > now:
        cause = _due_cause(job)
        latest = job.debounce_until if cause is DueCause.DEBOUNCE else None
        reasons.append(NotDue(until=job.next_run_at, cause=cause, latest=latest))
        return tuple(reasons)
    held: list[WaitReason] = [*_over_limits(job, limits), *_over_rates(job, limits, now)]
    if held:
        return (*reasons, *held)
    if reasons:
        return tuple(reasons)
    return (InLine(queue=job.queue, ahead=_ahead(job, now)),)


def why_waiting(
    scope_hash: str,
    job_id: str,
    *,
    limits: ClaimLimits | None = None,
    now: datetime | None = None,
) -> Waiting:
    """Why job ``job_id`` of ``scope_hash`` has not started at ``now``, under
    ``limits`` (default: this process's, :func:`claim_limits`). Raises
    :class:`~jobs.exceptions.JobNotFound` if there is no such job."""
    now = current_time(now)
    job = Job.objects.filter(scope_hash=scope_hash, job_id=job_id).first()
    if job is None:
        raise JobNotFound(f"no job {job_id!r} in scope {scope_hash[:12]}…")
    return Waiting(
        scope_hash=job.scope_hash,
        job_id=job.job_id,
        handler=job.handler,
        queue=job.queue,
        status=JobStatus(job.status),
        now=now,
        reasons=reasons_of(job, now, claim_limits() if limits is None else limits),
    )


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyState:
    """One limit's state: the handler or queue ``name`` (``on``) as a whole
    (``limit_key`` ""; its ``max_running`` and ``rate``) or one of its limit keys (its
    ``max_running_per_key`` and ``rate_per_key``). ``queued`` and ``running``: the
    jobs it counts; ``cap``: its counted limit, if any; ``rate``: its rate, if any,
    with ``room`` units free now and, when none is, ``frees_at``, when the next is."""

    on: str
    name: str
    limit_key: str
    queued: int
    running: int
    cap: int | None
    rate: Rate | None
    room: int | None
    frees_at: datetime | None

    #: The headings of :meth:`cells`.
    HEADINGS = ("limit", "key", "queued", "running", "cap", "rate", "free", "next free")

    def cells(self) -> tuple[str, ...]:
        """The state as text, one cell per heading: the limit (``handler:<name>``), its
        key (``*``: the whole), its jobs, its cap, its rate, the rate's free units of
        its capacity and when the next is free (``now`` while one is); ``-`` for
        what it has not."""
        free = next_free = "-"
        if self.rate is not None and self.room is not None:
            free = f"{self.room}/{self.rate.capacity}"
            next_free = "now" if self.frees_at is None else _at(self.frees_at)
        return (
            f"{self.on}:{self.name}",
            self.limit_key or "*",
            str(self.queued),
            str(self.running),
            "-" if self.cap is None else str(self.cap),
            "-" if self.rate is None else self.rate.describe().replace(" ", ""),
            free,
            next_free,
        )

    @property
    def full(self) -> bool:
        """Whether it holds jobs back now: at its cap or without a free unit."""
        at_cap = self.cap is not None and self.running >= self.cap
        return at_cap or (self.room is not None and self.room < 1)


def _counts(queue: str | None) -> Counter[tuple[str, str, str, str]]:
    """(handler, queue, limit key, status) -> jobs, of Queued and Running jobs — with
    ``queue``, those of the queue and of the handlers of its jobs."""
    jobs = Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
    if queue is not None:
        handlers = jobs.filter(queue=queue).values("handler")
        jobs = jobs.filter(Q(queue=queue) | Q(handler__in=handlers))
    counts: Counter[tuple[str, str, str, str]] = Counter()
    rows = jobs.values("handler", "queue", "limit_key", "status").annotate(n=Count("id"))
    for row in rows.order_by():
        counts[(row["handler"], row["queue"], row["limit_key"], row["status"])] += row["n"]
    return counts


def key_states(
    queue: str | None = None,
    *,
    limits: ClaimLimits | None = None,
    now: datetime | None = None,
) -> list[KeyState]:
    """Every limit of ``limits`` (default: this process's) with Queued or Running jobs
    — those ``queue``'s jobs fall under, if given: its own and its handlers' — and
    each limit key of a per-key limit with such jobs: handlers then queues, by name,
    the whole before its keys. Two reads, plus one of the rates' rows."""
    limits = claim_limits() if limits is None else limits
    now = current_time(now)
    counts = _counts(queue)
    rows: list[tuple[str, str, str, int | None, Rate | None, int, int]] = []
    for on, configured, column in (("handler", limits.handlers, 0), ("queue", limits.queues, 1)):
        for name in sorted(configured):
            if queue is not None and on == "queue" and name != queue:
                continue
            value = configured[name]
            by_key: dict[str, Counter[str]] = {}
            for key, n in counts.items():
                if key[column] == name:
                    by_key.setdefault(key[2], Counter())[key[3]] += n
            if not by_key:
                continue
            if value.max_running is not None or value.rate is not None:
                whole: Counter[str] = sum(by_key.values(), Counter())
                rows.append((on, name, "", value.max_running, value.rate, *_pair(whole)))
            if value.max_running_per_key is not None or value.rate_per_key is not None:
                for limit_key in sorted(k for k in by_key if k):
                    cap, rate = value.max_running_per_key, value.rate_per_key
                    rows.append((on, name, limit_key, cap, rate, *_pair(by_key[limit_key])))
    return _with_rates(rows, now)


def _pair(by_status: Mapping[str, int]) -> tuple[int, int]:
    return by_status.get(JobStatus.QUEUED, 0), by_status.get(JobStatus.RUNNING, 0)


def _with_rates(
    rows: list[tuple[str, str, str, int | None, Rate | None, int, int]], now: datetime
) -> list[KeyState]:
    wanted = {rate_key(on, name, key): rate for on, name, key, _c, rate, *_ in rows if rate}
    states: Mapping[str, RateState] = read_states(connection_for(RateBucket), wanted)
    now_ns = nanoseconds(now)
    found = []
    for on, name, limit_key, cap, rate, queued, running in rows:
        room = frees_at = None
        if rate is not None:
            state = states[rate_key(on, name, limit_key)]
            room = max(state.room(now_ns), 0)
            frees_at = None if room else moment(state.frees_at(now_ns))
        found.append(
            KeyState(
                on=on, name=name, limit_key=limit_key, queued=queued, running=running, cap=cap,
                rate=rate, room=room, frees_at=frees_at,
            )
        )  # fmt: skip
    return found
