"""Creation of jobs: ``submit`` and ``submit_many`` in a transaction of their own,
``stage`` and ``stage_many`` in the caller's; idempotent per (scope, job id)."""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import adapt_dt, alias_for, connection_for, in_caller_atomic_block, is_postgres
from ledon.tracing import carrier_text, tracer

from ..conf import fair_queue, jobs_settings, queue_limits
from ..db import fetch, numbered
from ..exceptions import (
    AmbientTransactionError,
    CostOverRate,
    InvalidSubmission,
    JobIdentityConflict,
    JobIdentityUnresolved,
    TransactionRequiredError,
)
from ..fair_share import QUANTUM, place
from ..flow_control import ClaimLimits, declared_handler_limits
from ..models import Job
from ..submit_rules import NO_RULES
from ..types import (
    IDENTITY_FIELDS,
    JobSnapshot,
    JobStatus,
    JobSubmission,
    SubmitResult,
)
from . import sql_submit
from .base import CHUNK_ROWS, current_time, notify
from .endings import admit
from .reads import snapshot
from .telemetry import observed_submission
from .uniqueness import insert_unique

#: The fields of a new Queued job's snapshot that every new job has the same value in:
#: the fixed values of its insert, and what it does not have yet.
_NEW_JOB_CONSTANTS: dict[str, Any] = {
    **{
        name: value
        for name, value in sql_submit.NEW_JOB_FIXED.items()
        if name in JobSnapshot.__dataclass_fields__
    },
    "status": JobStatus(str(sql_submit.NEW_JOB_FIXED["status"])),
    # The columns' database defaults.
    "granted_attempts": 0,
    "interruption_count": 0,
    "keeps_killing_worker": False,
    "progress": None,
    "result_ref": None,
    "start_by": None,
    "unique_key": None,
    "limit_key": "",
    "batch_id": None,
    "sequence_key": None,
    "started_at": None,
    "finished_at": None,
    "created": True,
    "attempts": (),
}
#: Each field's slot setter: :func:`_new_snapshot` fills a snapshot from values that
#: are validated already, without the frozen dataclass's ``__init__``, which would
#: check them again.
_SET = {name: getattr(JobSnapshot, name).__set__ for name in JobSnapshot.__dataclass_fields__}
_SET_CONSTANTS = tuple((_SET[name], value) for name, value in _NEW_JOB_CONSTANTS.items())
(
    _set_scope_hash,
    _set_job_id,
    _set_handler,
    _set_handler_version,
    _set_payload_json,
    _set_queue,
    _set_priority,
    _set_max_attempts,
    _set_initial_not_before,
    _set_cost,
    _set_next_run_at,
    _set_created_at,
) = (_SET[name] for name in ("scope_hash", "job_id", *IDENTITY_FIELDS, "next_run_at", "created_at"))
_set_start_by = _SET["start_by"]
_set_unique_key = _SET["unique_key"]
_set_limit_key = _SET["limit_key"]
_set_sequence_key = _SET["sequence_key"]
_set_batch_id = _SET["batch_id"]
_new_object = object.__new__


def _new_snapshot(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> JobSnapshot:
    """The snapshot of a new Queued job, as its insert stores it (``created``): equal
    to ``JobSnapshot(...)`` of the same fields (a test holds them equal)."""
    job: JobSnapshot = _new_object(JobSnapshot)
    for setter, value in _SET_CONSTANTS:
        setter(job, value)
    _set_scope_hash(job, scope_hash)
    _set_job_id(job, job_id)
    _set_handler(job, sub.handler)
    _set_handler_version(job, sub.handler_version)
    _set_payload_json(job, sub.payload_json)
    _set_queue(job, sub.queue)
    _set_priority(job, sub.priority)
    _set_max_attempts(job, sub.max_attempts)
    not_before = sub.initial_not_before
    _set_initial_not_before(job, not_before)
    _set_cost(job, sub.cost)
    _set_next_run_at(job, now if not_before is None else not_before)
    _set_created_at(job, now)
    rules = sub.rules
    if rules is not NO_RULES:
        _set_start_by(job, rules.deadline(now))
        _set_unique_key(job, rules.unique_key)
        _set_limit_key(job, rules.limit_key or "")
        _set_sequence_key(job, rules.sequence_key)
        if rules.debounce is not None:
            # Trailing: due once the burst has been quiet for ``debounce`` seconds.
            _set_next_run_at(job, now + timedelta(seconds=rules.debounce))
    return job


def _isoformat(value: datetime) -> str:
    return value.isoformat()


#: The encoder of a bulk insert's rows; its only datetime, the not-before time, as ISO
#: 8601 text.
_ROWS_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_isoformat)

#: The varying columns of a new job that its snapshot shows (the others: the trace
#: context and the place in line, given apart).
_SEEN = tuple(
    name
    for name in sql_submit.NEW_JOB_VARYING
    if name not in ("trace_context", "fair_at", "start_by", "limit_key")
)


def _new_row(job: JobSnapshot, trace_context: str | None, fair_at: int) -> dict[str, Any]:
    """The values the insert of the new job ``job`` sets, by column
    (:data:`sql_submit.NEW_JOB_COLUMNS`); ``trace_context`` is the submitter's, for
    tracing; ``fair_at`` its place in line."""
    row = {name: getattr(job, name) for name in _SEEN}
    row.update(
        _shared_params(job.created_at),
        trace_context=trace_context,
        fair_at=fair_at,
        start_by=job.start_by,
        limit_key=job.limit_key,
    )
    return row


def _lane_params(
    scope_hash: str, queue: str, priority: int, units: int, now: datetime
) -> dict[str, Any]:
    """The parameters of :func:`sql_submit.reserve_lane`."""
    return {
        "queue": queue,
        "scope_hash": scope_hash,
        "priority": priority,
        "units": units,
        "quantum": float(QUANTUM),
        "now_place": place(now),
    }


def _laned(sub: JobSubmission, now: datetime) -> bool:
    """Whether a job of ``sub`` submitted at ``now`` takes its place from its scope's
    lane: due now, in a fair queue."""
    not_before = sub.initial_not_before
    return (not_before is None or not_before <= now) and fair_queue(sub.queue)


def _due_places(items: Sequence[tuple[str, str, JobSubmission]], now: datetime) -> list[int]:
    """Each item's due time as a place in line (:func:`jobs.fair_share.place`)."""
    return [
        place(now if sub.initial_not_before is None else sub.initial_not_before)
        for _scope_hash, _job_id, sub in items
    ]


def _places(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
) -> list[int]:
    """Each item's place in line: for the due jobs of fair queues, places taken from
    their scopes' lanes — one statement per (queue, scope, priority), the jobs in the
    order given —; for the others, their due time."""
    places = _due_places(items, now)
    groups: dict[tuple[str, str, int], list[int]] = {}
    for index, (scope_hash, _job_id, sub) in enumerate(items):
        if _laned(sub, now):
            groups.setdefault((sub.queue, scope_hash, sub.priority), []).append(index)
    statement = sql_submit.reserve_lane(connection.vendor)
    for (queue, scope_hash, priority), indexes in groups.items():
        params = _lane_params(scope_hash, queue, priority, len(indexes), now)
        (row,) = fetch(connection, statement, params)
        first = row["tail"] - (len(indexes) - 1) * row["step"]
        for offset, index in enumerate(indexes):
            places[index] = first + offset * row["step"]
    return places


def _trace_context() -> str | None:
    """The current span's context as stored with a new job: called inside the
    submission's span (see :mod:`.telemetry`), so its attempts become children."""
    return carrier_text(tracer("jobs").current())


def _adapted(connection: BaseDatabaseWrapper, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its datetimes as the backend stores them."""
    return {
        name: adapt_dt(connection, value) if isinstance(value, datetime) else value
        for name, value in row.items()
    }


def _check_costs(subs: Iterable[JobSubmission]) -> None:
    """A cost above the capacity of a rate the job falls under (its handler's or its
    queue's, as this process declares them) is :class:`CostOverRate`, before anything
    is written: such a job could never start."""
    limits: ClaimLimits | None = None
    for sub in subs:
        if sub.cost == 1:
            continue  # every rate lets one unit start
        if limits is None:
            limits = ClaimLimits(declared_handler_limits(), queue_limits())
        over = limits.over_capacity(sub.handler, sub.queue, sub.rules.limit_key or "", sub.cost)
        if over is not None:
            raise CostOverRate(
                f"cost {sub.cost} of a {sub.handler!r} job is above {over}: it could never"
                " start; lower the cost or raise the rate's burst"
            )


def _insert(scope_hash: str, job_id: str, sub: JobSubmission, now: datetime) -> JobSnapshot | None:
    """Insert a new Queued job in the current transaction; None if the identity exists.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent inserter of the same identity
    and then yields to it, so a race never aborts the surrounding transaction. A
    submission with a unique key may return the job that holds it instead
    (``created`` False; see :mod:`jobs.store.uniqueness`).
    """
    if sub.rules.unique_key is not None:
        return insert_unique(scope_hash, job_id, sub, now, _insert_unique_row)
    return _insert_row(scope_hash, job_id, sub, now)


def _insert_unique_row(
    scope_hash: str, job_id: str, sub: JobSubmission, now: datetime
) -> JobSnapshot | None:
    return _insert_row(scope_hash, job_id, sub, now, unique=True)


def _insert_row(
    scope_hash: str, job_id: str, sub: JobSubmission, now: datetime, *, unique: bool = False
) -> JobSnapshot | None:
    """The insert of :func:`_insert`; with ``unique``, with the submission's key,
    yielding to every unique constraint."""
    connection = connection_for(Job)
    job = _new_snapshot(scope_hash, job_id, sub, now)
    postgres = is_postgres(connection)
    wake = job.next_run_at <= now and postgres
    laned = _laned(sub, now)
    row = _new_row(job, _trace_context(), place(job.next_run_at))
    if unique:
        rules = sub.rules
        row.update(
            unique_key=rules.unique_key,
            unique_while=rules.unique_mode,
            debounce_until=None
            if rules.debounce_max is None
            else now + timedelta(seconds=rules.debounce_max),
        )
    sequence_key = sub.rules.sequence_key
    member = sequence_key is not None
    if member:
        row.update(_member_values(None, sequence_key))
    params = numbered([_adapted(connection, row)])
    if wake:
        params["channel"] = jobs_settings().NOTIFY_CHANNEL
    if laned:
        params.update(_lane_params(scope_hash, sub.queue, sub.priority, 1, now), job_id=job_id)
    if postgres or not laned:
        statement = sql_submit.insert_jobs(1, notify=wake, lane=laned, unique=unique, member=member)
        inserted = fetch(connection, statement, params, prepare=True)
    else:
        # SQLite: the lane's place, then the insert, under one write lock.
        with transaction.atomic(using=connection.alias, savepoint=False):
            taken = fetch(connection, sql_submit.reserve_lane("sqlite", new_job=True), params)
            if taken:
                params["fair_at_0"] = taken[0]["tail"]
            statement = sql_submit.insert_jobs(1, unique=unique, member=member)
            inserted = fetch(connection, statement, params)
    if not inserted:
        return None
    if sequence_key is not None:
        # Inserted held; in the same transaction (the caller's), counted in its
        # sequence and released if nothing is before it.
        admit(connection, [(scope_hash, job_id, sequence_key)], now)
    return job


def _member_values(batch_id: str | None, sequence_key: str | None) -> dict[str, Any]:
    """The :data:`sql_submit.MEMBER_COLUMNS` of a new job of batch ``batch_id`` and
    sequence ``sequence_key`` (either None): a job of a sequence is inserted held."""
    return {
        "batch_id": batch_id,
        "sequence_key": sequence_key,
        "sequence_held": sequence_key is not None,
    }


#: A submission's values of a bulk insert's JSON row, in its order
#: (:data:`sql_submit.JSON_ROW` after the scope and the job id).
_submission_values = operator.attrgetter(*sql_submit.JSON_ROW[2:])


def _deadline_text(sub: JobSubmission, now: datetime) -> str | None:
    deadline = sub.rules.deadline(now)
    return None if deadline is None else deadline.isoformat()


def _json_params(
    items: Sequence[tuple[str, str, JobSubmission]],
    trace_context: str | None,
    places: Sequence[int],
    now: datetime,
    *,
    member: bool = False,
) -> dict[str, Any]:
    """The ``rows``, ``scopes`` and ``trace_context`` parameters of
    :data:`sql_submit.INSERT_JOBS_JSON`: one JSON array per item (a payload travels as its
    JSON text, and its place in line comes last), its scope hash given by its 1-based
    position in ``scopes``."""
    scopes: dict[str, int] = {}
    rows = [
        [
            scopes.get(scope_hash) or scopes.setdefault(scope_hash, len(scopes) + 1),
            job_id,
            *_submission_values(sub),
            fair_at,
            None if sub.rules is NO_RULES else _deadline_text(sub, now),
            sub.rules.limit_key or "",
            *((sub.rules.sequence_key,) if member else ()),
        ]
        for (scope_hash, job_id, sub), fair_at in zip(items, places, strict=True)
    ]
    return {
        "rows": _ROWS_ENCODER.encode(rows),
        "scopes": list(scopes),
        "trace_context": trace_context,
    }


_set_result_job_id, _set_result_snapshot, _set_result_conflict = (
    getattr(SubmitResult, name).__set__ for name in ("job_id", "snapshot", "conflict")
)


def _created_result(job_id: str, job: JobSnapshot) -> SubmitResult:
    """``SubmitResult(job_id=job_id, snapshot=job)`` filled as :func:`_new_snapshot` is."""
    result: SubmitResult = _new_object(SubmitResult)
    _set_result_job_id(result, job_id)
    _set_result_snapshot(result, job)
    _set_result_conflict(result, None)
    return result


def _shared_params(now: datetime) -> dict[str, Any]:
    """The :data:`sql_submit.NEW_JOB_SHARED` parameters of a bulk insert at ``now``."""
    return {**sql_submit.NEW_JOB_FIXED, "created_at": now, "updated_at": now}


def _insert_new(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
    *,
    batch_id: str | None = None,
) -> list[int] | None:
    """PostgreSQL, outside any transaction: insert the (distinct) identities of
    ``items`` that are not stored yet and wake the workers of their due queues, as one
    statement in autocommit (:data:`sql_submit.INSERT_NEW_JOBS_JSON`). Returns the positions
    in ``items`` that were not inserted, their identities being stored already; None
    if a concurrent insert of one of the identities won the race — the statement then
    rolled back and wrote nothing (the caller falls back on :func:`_insert_many`).

    With ``batch_id`` — inside the batch's transaction, behind a savepoint — the jobs
    of that batch; those of sequences are inserted held, for the caller to admit."""
    # Only a test case's transaction can be open here (the caller's refuses): its
    # savepoint stands in for autocommit, so that a lost race leaves it usable.
    scope: AbstractContextManager[Any] = (
        transaction.atomic(using=connection.alias) if connection.in_atomic_block else nullcontext()
    )
    member = batch_id is not None
    try:
        with scope:
            params = _shared_params(now) | _json_params(
                items, _trace_context(), _due_places(items, now), now, member=member
            )
            params["batch_id"] = batch_id
            params["channel"] = jobs_settings().NOTIFY_CHANNEL
            params["count"] = len(items)
            # The statement takes the places of the fair queues' due jobs from their lanes.
            params["fair_queues"] = sorted(
                {sub.queue for _s, _j, sub in items if fair_queue(sub.queue)}
            )
            params["quantum"], params["now_place"] = float(QUANTUM), place(now)
            statement = sql_submit.insert_new_jobs_json(member=member)
            rows = fetch(connection, statement, params, prepare=True)
    except IntegrityError:
        return None
    skipped: list[int] = rows[0]["skipped"]
    return skipped


def _sequenced(items: Sequence[tuple[str, str, JobSubmission]]) -> bool:
    """Whether a submission of ``items`` has a ``sequence_key``."""
    return any(sub.rules.sequence_key is not None for _scope_hash, _job_id, sub in items)


def _insert_many(
    connection: BaseDatabaseWrapper,
    items: Sequence[tuple[str, str, JobSubmission]],
    now: datetime,
    *,
    batch_id: str | None = None,
) -> dict[tuple[str, str], JobSnapshot]:
    """Insert the (distinct) identities of ``items`` that do not exist yet, in the
    current transaction — as jobs of batch ``batch_id`` if given, the jobs of
    sequences admitted to them —; wake workers once per queue that got due jobs.
    Returns the jobs inserted, by identity."""
    if not items:
        return {}
    inserted_rows: list[dict[str, Any]] = []
    trace_context = _trace_context()
    places = _places(connection, items, now)
    member = batch_id is not None or _sequenced(items)
    if is_postgres(connection):
        params = _shared_params(now) | _json_params(
            items, trace_context, places, now, member=member
        )
        params["batch_id"] = batch_id
        statement = sql_submit.insert_jobs_json(member=member)
        inserted_rows = fetch(connection, statement, params, prepare=True)
    else:
        for start in range(0, len(items), CHUNK_ROWS):
            chunk = []
            for offset, item in enumerate(items[start : start + CHUNK_ROWS]):
                row = _new_row(_new_snapshot(*item, now), trace_context, places[start + offset])
                if member:
                    row.update(_member_values(batch_id, item[2].rules.sequence_key))
                chunk.append(_adapted(connection, row))
            statement = sql_submit.insert_jobs(len(chunk), member=member)
            inserted_rows += fetch(connection, statement, numbered(chunk))
    keys = {(row["scope_hash"], row["job_id"]) for row in inserted_rows}
    inserted = {
        key: _new_snapshot(scope_hash, job_id, sub, now)
        for scope_hash, job_id, sub in items
        if (key := (scope_hash, job_id)) in keys
    }
    if batch_id is not None:
        inserted = {key: replace(job, batch_id=batch_id) for key, job in inserted.items()}
    admit(
        connection,
        [
            (scope_hash, job_id, sub.rules.sequence_key)
            for scope_hash, job_id, sub in items
            if sub.rules.sequence_key is not None and (scope_hash, job_id) in inserted
        ],
        now,
    )
    due_queues = {
        sub.queue
        for scope_hash, job_id, sub in items
        if (scope_hash, job_id) in inserted
        and (sub.initial_not_before is None or sub.initial_not_before <= now)
    }
    for queue in sorted(due_queues):
        notify(connection, queue)
    return inserted


def _existing_many(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], JobSnapshot]:
    """The stored jobs among ``keys`` (scope_hash, job_id), read in one query per
    scope and chunk."""
    by_scope: dict[str, list[str]] = {}
    for scope_hash, job_id in keys:
        by_scope.setdefault(scope_hash, []).append(job_id)
    found: dict[tuple[str, str], JobSnapshot] = {}
    for scope_hash, job_ids in by_scope.items():
        for start in range(0, len(job_ids), CHUNK_ROWS):
            chunk = job_ids[start : start + CHUNK_ROWS]
            for job in Job.objects.for_scope(scope_hash).filter(job_id__in=chunk):
                found[(job.scope_hash, job.job_id)] = snapshot(job)
    return found


def _same_request(existing: JobSnapshot, job_id: str, sub: JobSubmission) -> SubmitResult:
    differing = existing.submission().differing_fields(sub)
    if differing:
        return SubmitResult(
            job_id=job_id, snapshot=None, conflict=JobIdentityConflict(job_id, differing)
        )
    return SubmitResult(job_id=job_id, snapshot=existing)


def _existing_or_conflict(scope_hash: str, job_id: str, sub: JobSubmission) -> JobSnapshot | None:
    """The stored job if it is the same request; JobIdentityConflict if it differs."""
    job = Job.objects.for_scope(scope_hash).filter(job_id=job_id).first()
    if job is None:
        return None
    return _same_request(snapshot(job), job_id, sub).job()


@observed_submission("submit")
def submit(
    scope_hash: str, job_id: str, sub: JobSubmission, *, now: datetime | None = None
) -> JobSnapshot:
    """Create the job in a short transaction of its own (idempotent per identity).

    The insert, with its wake-up, is a single statement run in autocommit: it is its
    own transaction, committed in one round trip. If the identity exists, the winner
    is read by a fresh statement.
    """
    alias = alias_for(Job)
    if in_caller_atomic_block(transaction.get_connection(alias)):
        raise AmbientTransactionError()
    _check_costs([sub])
    now = current_time(now)
    # A job of a sequence is admitted to it in the insert's transaction.
    sequenced = sub.rules.sequence_key is not None
    for _ in range(3):
        with transaction.atomic(using=alias) if sequenced else nullcontext():
            created = _insert(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        existing = _existing_or_conflict(scope_hash, job_id, sub)
        if existing is not None:
            return existing
        # The conflicting row vanished between the insert and the read (deleted by
        # retention); insert again.
    raise JobIdentityUnresolved([job_id])


@observed_submission("submit")
def submit_many(
    items: Sequence[tuple[str, str, JobSubmission]], *, now: datetime | None = None
) -> list[SubmitResult]:
    """Submit many jobs: one short transaction of its own, one outcome per item.

    Each item (scope_hash, job_id, submission) behaves as ``submit`` would, in the
    order given: a new identity is created; an identical request returns the stored
    job (``created`` False) — also when the same identity appears earlier in the
    batch —; a different request gets its :class:`JobIdentityConflict` as the item's
    outcome, not raised. Database errors roll the whole batch back and propagate.
    """
    alias = alias_for(Job)
    connection = transaction.get_connection(alias)
    if in_caller_atomic_block(connection):
        raise AmbientTransactionError()
    _refuse_unique_keys(items)
    _check_costs(sub for _scope, _job_id, sub in items)
    now = current_time(now)
    first: dict[tuple[str, str], int] = {}
    for index, (scope_hash, job_id, _sub) in enumerate(items):
        first.setdefault((scope_hash, job_id), index)
    stored: dict[tuple[str, str], JobSnapshot] = {}
    results: dict[int, SubmitResult] = {}
    pending = list(first.values())
    # PostgreSQL: first one statement in autocommit that inserts the new identities;
    # a lost race with a concurrent insert, and every retry, take the transaction of
    # ON CONFLICT inserts and reads below.
    fast = is_postgres(connection) and bool(pending) and not _sequenced(items)
    skipped = _insert_new(connection, [items[i] for i in pending], now) if fast else None
    if skipped == [] and len(pending) == len(items):
        # Every item a new, distinct identity (the common bulk submit).
        return [
            _created_result(job_id, _new_snapshot(scope_hash, job_id, sub, now))
            for scope_hash, job_id, sub in items
        ]
    for _ in range(3):
        if skipped is not None:
            taken = {pending[position] for position in skipped}
            inserted = {
                items[i][:2]: _new_snapshot(*items[i], now) for i in pending if i not in taken
            }
            existing = _existing_many(items[i][:2] for i in sorted(taken))
        else:
            with transaction.atomic(using=alias):
                inserted = _insert_many(connection, [items[i] for i in pending], now)
                existing = _existing_many(
                    (items[i][0], items[i][1]) for i in pending if items[i][:2] not in inserted
                )
        skipped = None
        missing = []
        for index in pending:
            scope_hash, job_id, sub = items[index]
            key = (scope_hash, job_id)
            if key in inserted:
                stored[key] = inserted[key]
                results[index] = _created_result(job_id, stored[key])
            elif key in existing:
                stored[key] = existing[key]
                results[index] = _same_request(existing[key], job_id, sub)
            else:
                # The conflicting row vanished between the insert and the read
                # (deleted by retention); insert again.
                missing.append(index)
        pending = missing
        if not pending:
            break
    else:
        raise JobIdentityUnresolved([items[i][1] for i in pending])
    outcomes = []
    for index, (scope_hash, job_id, sub) in enumerate(items):
        result = results.get(index)
        if result is None:  # a repeated identity: compared with what its first occurrence stored
            earlier = stored[(scope_hash, job_id)]
            result = _same_request(replace(earlier, created=False), job_id, sub)
        outcomes.append(result)
    return outcomes


@observed_submission("stage")
def stage(
    scope_hash: str, job_id: str, sub: JobSubmission, *, now: datetime | None = None
) -> JobSnapshot:
    """Create the job inside the caller's open transaction, on its connection.

    Never commits and never uses a savepoint. On a conflicting request or any
    database error, the caller's transaction is marked for rollback before the error
    propagates, so the business work cannot commit without its job.
    """
    alias, _ = _callers_transaction()
    _check_costs([sub])
    now = current_time(now)
    with _rolled_back_on_error(alias):
        created = _insert(scope_hash, job_id, sub, now)
        if created is not None:
            return created
        existing = _existing_or_conflict(scope_hash, job_id, sub)
        if existing is None:
            raise JobIdentityUnresolved([job_id])
    return existing


def _callers_transaction() -> tuple[str, BaseDatabaseWrapper]:
    """The alias and connection of the caller's open transaction: a stage requires
    one (:class:`TransactionRequiredError`)."""
    alias = alias_for(Job)
    connection = transaction.get_connection(alias)
    if not in_caller_atomic_block(connection):
        raise TransactionRequiredError()
    return alias, connection


@contextmanager
def _rolled_back_on_error(alias: str) -> Iterator[None]:
    """A conflicting request or a database error marks the caller's transaction for
    rollback before it propagates: the business work cannot commit without its job."""
    try:
        yield
    except (JobIdentityConflict, JobIdentityUnresolved, DatabaseError):
        transaction.set_rollback(True, using=alias)
        raise


@observed_submission("stage")
def stage_many(
    items: Sequence[tuple[str, str, JobSubmission]], *, now: datetime | None = None
) -> list[SubmitResult]:
    """:func:`stage` for many jobs: one bulk insert inside the caller's open
    transaction (required), one outcome per item, in the order given.

    A new identity is created; an identical request returns the stored job
    (``created`` False). A different request is :class:`JobIdentityConflict` and any
    database error propagates; both mark the caller's transaction for rollback
    first, so the business work cannot commit without its jobs.
    """
    alias, connection = _callers_transaction()
    _refuse_unique_keys(items)
    _check_costs(sub for _scope, _job_id, sub in items)
    now = current_time(now)
    with _rolled_back_on_error(alias):
        distinct = _distinct(items)
        inserted = _insert_many(connection, distinct, now)
        existing = _existing_many(i[:2] for i in distinct if i[:2] not in inserted)
        results = []
        seen: set[tuple[str, str]] = set()
        for scope_hash, job_id, sub in items:
            key = (scope_hash, job_id)
            if key in inserted and key not in seen:
                results.append(_created_result(job_id, inserted[key]))
            else:
                stored = existing.get(key)
                if stored is None and key in inserted:  # a repeat of an identity of the batch
                    stored = replace(inserted[key], created=False)
                if stored is None:  # deleted between the insert and the read
                    raise JobIdentityUnresolved([job_id])
                results.append(_same_request(stored, job_id, sub))
                results[-1].job()  # a conflicting request is raised
            seen.add(key)
    return results


def _refuse_unique_keys(items: Sequence[tuple[str, str, JobSubmission]]) -> None:
    """A bulk submit takes no unique key (each needs its own insert and holder read):
    ``InvalidSubmission`` before anything is written."""
    if any(sub.rules.unique_key is not None for _scope, _job_id, sub in items):
        raise InvalidSubmission(
            "a bulk submit takes no unique_key (nor debounce): submit such jobs one by one"
            " with submit_job or stage_job"
        )


def _distinct(
    items: Sequence[tuple[str, str, JobSubmission]],
) -> list[tuple[str, str, JobSubmission]]:
    """The first item of each identity (a repeat is compared with what it stored)."""
    first: dict[tuple[str, str], tuple[str, str, JobSubmission]] = {}
    for item in items:
        first.setdefault(item[:2], item)
    return list(first.values())
