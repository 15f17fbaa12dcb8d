"""Every state transition of saga instances.

Each transition is one guarded ``UPDATE`` — it succeeds only from the states that
allow it, for the version its caller read and, while an instance is driven, for the
runner holding its lease — inside ``transaction.atomic``. It returns the new version
or raises :class:`~sagas.exceptions.SagaConcurrencyError` (or its subclass
:class:`~sagas.exceptions.SagaLeaseLost`) and changes nothing. Every change but a
lease renewal moves the version on, which fences off any writer that read before it.

    create ............... (new) -> RUNNING (leased to the caller, or free)     create
    claim ................ RUNNING | COMPENSATING, lease free -> leased to me   claim
    renew ................ leased to me -> lease extended (version unchanged)   renew
    complete a step ...... RUNNING -> RUNNING (+ step, data)                    complete_step
                           last step: -> SUCCEEDED (lease released)
    a step failed ........ RUNNING -> COMPENSATING (failed step, error)         begin_compensation
    compensate a step .... COMPENSATING -> COMPENSATING (+ compensated step)    record_compensation
    no compensation ...... COMPENSATING -> COMPENSATING (+ uncompensated)       skip_compensation
    all compensated ...... COMPENSATING -> COMPENSATED (lease released)         finish_compensation
    compensation gave up . COMPENSATING -> FAILED (needs attention)             give_up
    retry compensation ... FAILED -> COMPENSATING (leased to me)                reopen
    stop driving ......... leased to me -> lease released                       release
    retention ............ SUCCEEDED | COMPENSATED, finished before a cutoff
                           -> (deleted)                                         purge_finished

By id, many at a time (the admin's "all N matching" actions), each one guarded update
per rule and batch, leaving the instances unleased for the runners to drive:

    compensate many ...... RUNNING, lease free -> COMPENSATING                  compensate_many
                           FAILED -> COMPENSATING
    resume many .......... RUNNING | COMPENSATING, lease expired (or
                           taken over before) -> lease released, takeovers 0    resume_many

``complete_step`` and ``record_compensation`` run inside the step's own transaction,
so the completion mark commits with the step's work or not at all.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Case, Count, F, PositiveIntegerField, Q, QuerySet, When

from ledon.bulk import BatchOutcome, lock_batch
from ledon.clock import current_time
from ledon.db import alias_for
from ledon.errors import MAX_ERROR_LENGTH
from ledon.retention import delete_oldest
from ledon.values import from_row

from . import validation
from .exceptions import (
    InvalidInput,
    SagaConcurrencyError,
    SagaIdentityConflict,
    SagaLeaseLost,
    SagaNotFound,
)
from .models import SagaInstance, SagaInstanceQuerySet, lease_free_at
from .types import ACTIVE_STATUSES, SagaSnapshot, SagaStatus

logger = logging.getLogger(__name__)


#: The time a transition is recorded at: ``now`` checked, or the current time.
_now = functools.partial(current_time, error=InvalidInput)


def _alias() -> str:
    return alias_for(SagaInstance)


def _rows() -> SagaInstanceQuerySet:
    return SagaInstance.objects.using(_alias())


# --------------------------------------------------------------------------- reads


def snapshot(row: SagaInstance, *, created: bool = False) -> SagaSnapshot:
    return from_row(
        SagaSnapshot,
        row,
        status=SagaStatus(row.status),
        data=dict(row.data),
        steps=tuple(row.steps),
        completed_steps=tuple(row.completed_steps),
        compensated_steps=tuple(row.compensated_steps),
        uncompensated_steps=tuple(row.uncompensated_steps),
        created=created,
    )


def get(instance_id: uuid.UUID | str) -> SagaSnapshot | None:
    """The instance as stored now, or None."""
    row = _rows().filter(instance_id=_instance_id(instance_id)).first()
    return None if row is None else snapshot(row)


def require(instance_id: uuid.UUID | str) -> SagaSnapshot:
    """The instance as stored now, or :class:`SagaNotFound`."""
    state = get(instance_id)
    if state is None:
        raise SagaNotFound(f"no saga instance has the id {instance_id}")
    return state


def get_by_key(name: str, idempotency_key: str) -> SagaSnapshot | None:
    row = _rows().filter(name=name, idempotency_key=idempotency_key).first()
    return None if row is None else snapshot(row)


def _instance_id(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidInput(f"a saga instance id is a UUID, got {value!r}") from None


def claimable(
    now: datetime,
    *,
    names: Iterable[str] | None = None,
    exclude_names: Iterable[str] = (),
    exclude_ids: Iterable[uuid.UUID] = (),
    limit: int = 20,
) -> list[SagaSnapshot]:
    """Active instances whose lease is free or expired, least recently changed first.
    Grants nothing: :func:`claim` decides."""
    qs = _rows().claimable(now)
    if names is not None:
        qs = qs.filter(name__in=list(names))
    excluded = list(exclude_names)
    if excluded:
        qs = qs.exclude(name__in=excluded)
    ids = list(exclude_ids)
    if ids:
        qs = qs.exclude(instance_id__in=ids)
    return [snapshot(row) for row in qs.order_by("updated_at", "id")[:limit]]


# --------------------------------------------------------------------------- creation


def create(
    name: str,
    steps: Sequence[str],
    data: dict[str, Any],
    *,
    idempotency_key: str | None,
    owner: str,
    lease_seconds: float,
    now: datetime | None = None,
) -> SagaSnapshot:
    """Record a new RUNNING instance, leased to ``owner`` (or free, for ``owner=""``).

    With an ``idempotency_key`` already used for ``name``, nothing is written and the
    existing instance is returned (``created`` false) — if it was started with the
    same ``data``; with other data, :class:`~sagas.exceptions.SagaIdentityConflict`.
    Inside a caller's transaction the row commits with it; a failed insert only rolls
    back its own savepoint.
    """
    now = _now(now)
    alias = _alias()
    digest = validation.request_digest(data)
    try:
        with transaction.atomic(using=alias):
            row = SagaInstance.objects.using(alias).create(
                name=name,
                idempotency_key=idempotency_key,
                steps=list(steps),
                data=data,
                request_digest=digest,
                status=SagaStatus.RUNNING,
                leased_by=owner,
                leased_until=now + timedelta(seconds=lease_seconds) if owner else None,
                created_at=now,
                updated_at=now,
            )
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = get_by_key(name, idempotency_key)
        if existing is None:
            raise
        stored = (
            _rows()
            .filter(instance_id=existing.instance_id)
            .values_list("request_digest", flat=True)
            .first()
        )
        if stored and stored != digest:
            raise SagaIdentityConflict(name, idempotency_key) from None
        return existing
    return snapshot(row, created=True)


# --------------------------------------------------------------------------- transitions


def _conflict(instance_id: uuid.UUID, owner: str, version: int) -> SagaConcurrencyError:
    """The precise error for a guarded update that matched no row."""
    row = _rows().filter(instance_id=instance_id).first()
    if row is None:
        return SagaConcurrencyError(
            f"saga instance {instance_id} no longer exists", instance_id=instance_id
        )
    if owner and row.leased_by != owner:
        holder = f"leased by {row.leased_by!r}" if row.leased_by else "not leased"
        return SagaLeaseLost(
            f"saga instance {instance_id} is {holder} now, not by {owner!r} "
            f"(status {row.status}, version {row.version})",
            instance_id=instance_id,
        )
    return SagaConcurrencyError(
        f"saga instance {instance_id} changed since it was read: version {version} is "
        f"stale (now {row.version}, status {row.status})",
        instance_id=instance_id,
    )


def _transition(
    state: SagaSnapshot,
    owner: str,
    statuses: Sequence[SagaStatus],
    now: datetime,
    **values: Any,
) -> int:
    """The guarded update every transition shares: this version, these states, this
    lease holder. Joins the caller's transaction when one is open."""
    new_version = state.version + 1
    # Every transition but a release moves the instance on: takeovers count again
    # from zero.
    values.setdefault("takeovers", 0)
    with transaction.atomic(using=_alias(), savepoint=False):
        updated = (
            _rows()
            .filter(
                instance_id=state.instance_id,
                version=state.version,
                leased_by=owner,
                status__in=list(statuses),
            )
            .update(version=new_version, updated_at=now, **values)
        )
        if updated != 1:
            raise _conflict(state.instance_id, owner, state.version)
    return new_version


def _released(now: datetime, status: SagaStatus) -> dict[str, Any]:
    return {"status": status, "leased_by": "", "leased_until": None, "finished_at": now}


def claim(
    state: SagaSnapshot, owner: str, *, lease_seconds: float, now: datetime | None = None
) -> SagaSnapshot | None:
    """Take an active instance whose lease is free or expired; None if another runner
    was first (or the instance changed since ``state`` was read)."""
    now = _now(now)
    validation.text(owner, "runner id", validation.MAX_OWNER_LENGTH)
    with transaction.atomic(using=_alias()):
        updated = (
            _rows()
            .lease_free(now)
            .filter(
                instance_id=state.instance_id,
                version=state.version,
                status__in=ACTIVE_STATUSES,
            )
            .update(
                leased_by=owner,
                leased_until=now + timedelta(seconds=lease_seconds),
                version=F("version") + 1,
                updated_at=now,
                # A lease that expired (not one a runner released) means its runner
                # died or hung while driving the instance: count the takeover.
                takeovers=Case(
                    When(leased_until__lt=now, then=F("takeovers") + 1),
                    default=F("takeovers"),
                    output_field=PositiveIntegerField(),
                ),
            )
        )
    return get(state.instance_id) if updated else None


def renew(
    instance_id: uuid.UUID, owner: str, *, lease_seconds: float, now: datetime | None = None
) -> bool:
    """Extend ``owner``'s lease; False if the instance is no longer leased to it.

    The only change that keeps the version: renewals run beside a step whose
    completion mark is guarded by the version it started from.
    """
    now = _now(now)
    with transaction.atomic(using=_alias()):
        updated = (
            _rows()
            .filter(instance_id=instance_id, leased_by=owner, status__in=ACTIVE_STATUSES)
            .update(leased_until=now + timedelta(seconds=lease_seconds))
        )
    return updated == 1


def complete_step(
    state: SagaSnapshot, owner: str, step: str, data: dict[str, Any], *, now: datetime | None = None
) -> int:
    """Mark ``step`` completed with the data it left; call it inside the step's own
    transaction. Completing the last step ends the instance SUCCEEDED."""
    now = _now(now)
    completed = [*state.completed_steps, step]
    values: dict[str, Any] = {"completed_steps": completed, "data": data}
    if len(completed) == len(state.steps):
        values.update(_released(now, SagaStatus.SUCCEEDED))
    return _transition(state, owner, [SagaStatus.RUNNING], now, **values)


def begin_compensation(
    state: SagaSnapshot, owner: str, failed_step: str, error: str, *, now: datetime | None = None
) -> int:
    """A step failed (or an operator asked to compensate): start undoing."""
    now = _now(now)
    return _transition(
        state,
        owner,
        [SagaStatus.RUNNING],
        now,
        status=SagaStatus.COMPENSATING,
        failed_step=failed_step,
        error=error[:MAX_ERROR_LENGTH],
    )


def _compensating(state: SagaSnapshot, owner: str, now: datetime, **values: Any) -> int:
    """A transition of a COMPENSATING instance (guarded as every one: :func:`_transition`)."""
    return _transition(state, owner, [SagaStatus.COMPENSATING], now, **values)


def record_compensation(
    state: SagaSnapshot, owner: str, step: str, data: dict[str, Any], *, now: datetime | None = None
) -> int:
    """Mark ``step`` compensated; call it inside the compensation's own transaction."""
    now = _now(now)
    return _compensating(
        state, owner, now, compensated_steps=[*state.compensated_steps, step], data=data
    )


def skip_compensation(
    state: SagaSnapshot, owner: str, step: str, *, now: datetime | None = None
) -> int:
    """Record that ``step`` has no compensation: its effects remain."""
    now = _now(now)
    return _compensating(state, owner, now, uncompensated_steps=[*state.uncompensated_steps, step])


def finish_compensation(state: SagaSnapshot, owner: str, *, now: datetime | None = None) -> int:
    now = _now(now)
    return _compensating(
        state, owner, now, compensation_error="", **_released(now, SagaStatus.COMPENSATED)
    )


def give_up(
    state: SagaSnapshot, owner: str, compensation_error: str, *, now: datetime | None = None
) -> int:
    """A compensation kept failing: leave the instance FAILED, for a person to look at."""
    now = _now(now)
    return _compensating(
        state,
        owner,
        now,
        compensation_error=compensation_error[:MAX_ERROR_LENGTH],
        **_released(now, SagaStatus.FAILED),
    )


def reopen(
    state: SagaSnapshot, owner: str, *, lease_seconds: float, now: datetime | None = None
) -> SagaSnapshot | None:
    """FAILED -> COMPENSATING, leased to ``owner``, to try the compensations again;
    None if the instance changed since ``state`` was read."""
    now = _now(now)
    validation.text(owner, "runner id", validation.MAX_OWNER_LENGTH)
    with transaction.atomic(using=_alias()):
        updated = (
            _rows()
            .filter(instance_id=state.instance_id, version=state.version, status=SagaStatus.FAILED)
            .update(
                status=SagaStatus.COMPENSATING,
                leased_by=owner,
                leased_until=now + timedelta(seconds=lease_seconds),
                finished_at=None,
                version=F("version") + 1,
                updated_at=now,
            )
        )
    return get(state.instance_id) if updated else None


def release(state: SagaSnapshot, owner: str, *, now: datetime | None = None) -> int:
    """Stop driving an active instance: free its lease so another runner may go on."""
    now = _now(now)
    return _transition(
        state,
        owner,
        ACTIVE_STATUSES,
        now,
        leased_by="",
        leased_until=None,
        takeovers=F("takeovers"),
    )


# --------------------------------------------------------------------------- retention


def purge_finished(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` Succeeded or Compensated instances that
    finished before ``older_than``, oldest first; returns how many. Running,
    compensating and failed (needs attention) instances are never touched."""
    return delete_oldest(_rows().finished(), "finished_at", older_than, limit, error=InvalidInput)


# --------------------------------------------------------------------------- many instances

#: The outcomes of the bulk operations, as :class:`ledon.bulk.BatchOutcome` counts them.
COMPENSATION_STARTED = "compensation started"
COMPENSATION_RETRIED = "compensation tried again"
HANDED_TO_RUNNERS = "handed to the runners"

#: Active instances that wait for a runner as they are: never leased, or released,
#: and never taken over since they last moved on.
_WAITING = Q(status__in=ACTIVE_STATUSES, leased_until__isnull=True, takeovers=0)


def _resumable(now: datetime) -> Q:
    """Active instances no runner holds (lease free or expired), but for those that
    wait as they are (:data:`_WAITING`)."""
    return Q(status__in=ACTIVE_STATUSES) & lease_free_at(now) & ~_WAITING


def _to_compensate(now: datetime) -> Q:
    return Q(status=SagaStatus.RUNNING) & lease_free_at(now)


def _handed_over(now: datetime) -> dict[str, Any]:
    """For the next runner to claim: unleased, its takeovers counted from zero again,
    its version moved on (fencing off any writer that read it before)."""
    return {
        "leased_by": "",
        "leased_until": None,
        "takeovers": 0,
        "version": F("version") + 1,
        "updated_at": now,
    }


def compensate_many(
    ids: Sequence[int], *, reason: str = "", now: datetime | None = None
) -> BatchOutcome:
    """Compensate the instances of ``ids`` (primary keys) as :func:`sagas.api.compensate_saga`
    would, but for the saga runners to drive, in one transaction of two guarded
    updates: a Running instance whose lease is free or expired starts compensating
    (no failed step, ``reason`` as its error); a Failed one tries its compensations
    again. Both are left unleased for the next runner. Instances a runner holds,
    compensating ones (a runner goes on with them) and finished ones are left. On
    PostgreSQL a row another transaction holds is returned as held
    (:func:`ledon.bulk.lock_batch`)."""
    now = _now(now)
    error = (reason or "compensation requested by an operator")[:MAX_ERROR_LENGTH]
    with transaction.atomic(using=_alias()):
        ids, held = lock_batch(SagaInstance, ids)
        rows = _rows().filter(pk__in=ids)
        started = rows.filter(_to_compensate(now)).update(
            status=SagaStatus.COMPENSATING, failed_step="", error=error, **_handed_over(now)
        )
        retried = rows.filter(status=SagaStatus.FAILED).update(
            status=SagaStatus.COMPENSATING, finished_at=None, **_handed_over(now)
        )
    return BatchOutcome(
        changed={COMPENSATION_STARTED: started, COMPENSATION_RETRIED: retried}, held=held
    )


def resume_many(ids: Sequence[int], *, now: datetime | None = None) -> BatchOutcome:
    """Hand the instances of ``ids`` (primary keys) back to the saga runners, in one
    guarded update: a Running or Compensating instance whose lease expired, or that
    was taken over before, is released with its takeovers counted from zero (the
    operator's word that what stopped its runners is fixed), so that the next runner
    claims it without counting a takeover. Instances a runner holds, those already
    waiting for one, and the others are left. Held rows as for
    :func:`compensate_many`."""
    now = _now(now)
    with transaction.atomic(using=_alias()):
        ids, held = lock_batch(SagaInstance, ids)
        resumed = _rows().filter(_resumable(now), pk__in=ids).update(**_handed_over(now))
    return BatchOutcome(changed={HANDED_TO_RUNNERS: resumed}, held=held)


_HELD_BY_RUNNER = "leased to a runner now"
_FINISHED = "finished"
_FINISHED_STATUSES = (SagaStatus.SUCCEEDED, SagaStatus.COMPENSATED)


def compensate_preview(
    rows: QuerySet[SagaInstance], *, now: datetime | None = None
) -> Mapping[str, int]:
    """What :func:`compensate_many` would do to ``rows`` now, counted in one read."""
    now = _now(now)
    counts = rows.order_by().aggregate(
        started=Count("pk", filter=_to_compensate(now)),
        retried=Count("pk", filter=Q(status=SagaStatus.FAILED)),
        leased=Count("pk", filter=Q(status__in=ACTIVE_STATUSES) & ~lease_free_at(now)),
        going_on=Count("pk", filter=Q(status=SagaStatus.COMPENSATING) & lease_free_at(now)),
        finished=Count("pk", filter=Q(status__in=_FINISHED_STATUSES)),
    )
    return {
        COMPENSATION_STARTED: counts["started"],
        COMPENSATION_RETRIED: counts["retried"],
        _HELD_BY_RUNNER: counts["leased"],
        "compensating already (a runner goes on with them)": counts["going_on"],
        _FINISHED: counts["finished"],
    }


def resume_preview(
    rows: QuerySet[SagaInstance], *, now: datetime | None = None
) -> Mapping[str, int]:
    """What :func:`resume_many` would do to ``rows`` now, counted in one read."""
    now = _now(now)
    counts = rows.order_by().aggregate(
        resumed=Count("pk", filter=_resumable(now)),
        waiting=Count("pk", filter=_WAITING),
        leased=Count("pk", filter=Q(status__in=ACTIVE_STATUSES) & ~lease_free_at(now)),
        other=Count("pk", filter=~Q(status__in=ACTIVE_STATUSES)),
    )
    return {
        HANDED_TO_RUNNERS: counts["resumed"],
        "waiting for a runner already": counts["waiting"],
        _HELD_BY_RUNNER: counts["leased"],
        "not running or compensating": counts["other"],
    }
