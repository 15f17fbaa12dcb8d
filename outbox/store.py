"""Every state transition of outbox and inbox messages.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to these tables.

    stage ................ (new) -> PENDING                         stage_message
    claim ................ PENDING, no lease, due -> PENDING + lease (attempt n+1)
    renew ................ PENDING + this lease -> PENDING + longer   renew_batch
    record delivered ..... PENDING + this lease -> SENT             record_deliveries
    record failure ....... PENDING + this lease -> PENDING later | PARKED
    recover .............. PENDING + lease expired (or of a restarted dispatcher)
                           -> PENDING | PARKED (attempts used up)   recover_*
    redeliver (operator) . PENDING | PARKED, no lease -> PENDING now (parked: attempts 0)
    park (operator) ...... PENDING, no lease -> PARKED
    retention ............ SENT | PARKED older than their retention -> (deleted)
                           inbox records older than theirs -> (deleted)

    inbox ................ (consumer, message id) new -> recorded  record_inbox
"""

from __future__ import annotations

import functools
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, F, PositiveIntegerField, Value, When

from ledon.clock import current_time
from ledon.db import (
    adapt_dt,
    alias_for,
    connection_for,
    id_among_locked,
    in_caller_atomic_block,
    is_postgres,
    read_dt,
)
from ledon.errors import MAX_ERROR_LENGTH, storable_text
from ledon.retention import delete_oldest

from .conf import outbox_settings
from .db import adapt_uuid, placeholders, read_json, read_uuid
from .exceptions import (
    InvalidInput,
    InvalidTransition,
    MessageNotFound,
    TransactionRequired,
)
from .models import InboxMessage, OutboxMessage
from .types import (
    Batch,
    DeliveryReport,
    Envelope,
    MessageStatus,
    RecordOutcome,
    RecoveryResult,
)
from .validation import MAX_DISPATCHER_ID_LENGTH, text

logger = logging.getLogger(__name__)

OUTBOX = OutboxMessage._meta.db_table
INBOX = InboxMessage._meta.db_table


PENDING, SENT, PARKED = (s.value for s in MessageStatus)


#: The time a transition is recorded at: ``now`` checked, or the current time.
_now = functools.partial(current_time, error=InvalidInput)


def _notify(connection: BaseDatabaseWrapper) -> None:
    """Wake PostgreSQL dispatchers. Sent inside the writing transaction: delivered on
    commit, and not at all on rollback."""
    if is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [outbox_settings().NOTIFY_CHANNEL])


# --------------------------------------------------------------------------- staging


def stage_message(envelope: Envelope, *, using: str) -> None:
    """Store a Pending message in the caller's open transaction on ``using``.

    Never commits and never uses a savepoint. On a database error the caller's
    transaction is marked for rollback before the error propagates, so the business
    work cannot commit without its message.
    """
    connection = transaction.get_connection(using)
    if not in_caller_atomic_block(connection):
        raise TransactionRequired("integration events are stored inside the unit of work")
    try:
        OutboxMessage.objects.using(using).create(
            message_id=envelope.message_id,
            event_type=envelope.event_type,
            key=envelope.key,
            payload_json=envelope.payload_json,
            headers=dict(envelope.headers),
            status=MessageStatus.PENDING,
            available_at=envelope.created_at,
            created_at=envelope.created_at,
            updated_at=envelope.created_at,
        )
        _notify(connection)
    except DatabaseError:
        transaction.set_rollback(True, using=using)
        raise


# --------------------------------------------------------------------------- dispatching


def claim_sql(vendor: str) -> str:
    """A dispatcher's claim: lease up to a batch of due pending messages, returning
    what publishing needs."""
    return (
        f"UPDATE {OUTBOX} SET attempts = attempts + 1, leased_by = %s, lease_token = %s,"
        " lease_expires_at = %s, updated_at = %s"
        " WHERE "
        + id_among_locked(
            vendor,
            f"SELECT id FROM {OUTBOX}"
            " WHERE status = %s AND lease_token IS NULL AND available_at <= %s"
            " ORDER BY available_at, id LIMIT %s",
        )
        + " RETURNING id, message_id, event_type, key, payload_json, headers, attempts,"
        " created_at"
    )


def claim_batch(
    dispatcher_id: str,
    *,
    limit: int,
    lease_seconds: float | None = None,
    now: datetime | None = None,
) -> Batch | None:
    """Lease up to ``limit`` due messages to one dispatcher; attempt n+1 each.

    On PostgreSQL, ``SKIP LOCKED`` lets several dispatchers claim at once without
    waiting for or taking each other's messages. None when nothing is due.
    """
    dispatcher_id = text(dispatcher_id, "dispatcher id", MAX_DISPATCHER_ID_LENGTH)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidInput(f"limit must be an integer from 1 to 10000, got {limit!r}")
    now = _now(now)
    expires = now + timedelta(seconds=lease_seconds or outbox_settings().LEASE_SECONDS)
    token = secrets.token_hex(16)
    alias = alias_for(OutboxMessage)
    connection = connection_for(OutboxMessage)
    params: list[Any] = [
        dispatcher_id,
        token,
        adapt_dt(connection, expires),
        adapt_dt(connection, now),
        PENDING,
        adapt_dt(connection, now),
        limit,
    ]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(claim_sql(connection.vendor), params)
        rows = cursor.fetchall()
    if not rows:
        return None
    rows.sort(key=lambda r: r[0])
    return Batch(
        token=token,
        dispatcher_id=dispatcher_id,
        lease_expires_at=expires,
        messages=tuple(
            Envelope(
                message_id=read_uuid(r[1]),
                event_type=r[2],
                key=r[3],
                payload_json=r[4],
                headers=read_json(r[5]) or {},
                attempt=r[6],
                created_at=read_dt(r[7]),
            )
            for r in rows
        ),
    )


def renew_batch(
    token: str, *, lease_seconds: float | None = None, now: datetime | None = None
) -> int:
    """Extend the lease of a batch still being published: every Pending message still
    leased under ``token`` gets ``lease_seconds`` more. Returns how many kept their
    lease (0: the batch was recovered elsewhere; its late record will be fenced).
    Like a recovery, it is one statement: whichever commits first decides."""
    now = _now(now)
    expires = now + timedelta(seconds=lease_seconds or outbox_settings().LEASE_SECONDS)
    connection = connection_for(OutboxMessage)
    with transaction.atomic(using=alias_for(OutboxMessage)), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {OUTBOX} SET lease_expires_at = %s WHERE lease_token = %s AND status = %s",
            [adapt_dt(connection, expires), token, PENDING],
        )
        return int(cursor.rowcount)


def record_deliveries(
    token: str,
    reports: Sequence[DeliveryReport],
    *,
    retry_at: Mapping[uuid.UUID, datetime],
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> dict[uuid.UUID, RecordOutcome]:
    """Record a batch's confirmations, one transaction, each fenced by the lease.

    Delivered -> Sent. Failed -> Pending again from ``retry_at[message_id]``, or
    Parked with the error once ``max_attempts`` attempts are used or the failure is
    permanent. A message whose lease this batch lost is left alone: STALE.
    """
    now = _now(now)
    max_attempts = max_attempts or outbox_settings().MAX_ATTEMPTS
    alias = alias_for(OutboxMessage)
    connection = connection_for(OutboxMessage)
    outcomes = {r.message_id: RecordOutcome.STALE for r in reports}
    delivered = [r.message_id for r in reports if r.ok]
    failed = [r for r in reports if not r.ok]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if delivered:
            cursor.execute(
                f"UPDATE {OUTBOX} SET status = %s, sent_at = %s, updated_at = %s,"
                " last_error = '', leased_by = '', lease_token = NULL, lease_expires_at = NULL"
                " WHERE lease_token = %s AND status = %s"
                f" AND message_id IN ({placeholders(len(delivered))}) RETURNING message_id",
                [
                    SENT,
                    adapt_dt(connection, now),
                    adapt_dt(connection, now),
                    token,
                    PENDING,
                    *(adapt_uuid(connection, m) for m in delivered),
                ],
            )
            for (message_id,) in cursor.fetchall():
                outcomes[read_uuid(message_id)] = RecordOutcome.SENT
        for report in failed:
            cursor.execute(
                f"UPDATE {OUTBOX} SET"
                " status = CASE WHEN %s OR attempts >= %s THEN %s ELSE %s END,"
                " available_at = %s, last_error = %s, updated_at = %s,"
                " leased_by = '', lease_token = NULL, lease_expires_at = NULL"
                " WHERE lease_token = %s AND status = %s AND message_id = %s RETURNING status",
                [
                    report.permanent,
                    max_attempts,
                    PARKED,
                    PENDING,
                    adapt_dt(connection, retry_at.get(report.message_id, now)),
                    storable_text(report.error),
                    adapt_dt(connection, now),
                    token,
                    PENDING,
                    adapt_uuid(connection, report.message_id),
                ],
            )
            row = cursor.fetchone()
            if row is not None:
                outcomes[report.message_id] = (
                    RecordOutcome.PARKED if row[0] == PARKED else RecordOutcome.RETRY_SCHEDULED
                )
    return outcomes


#: The guards of a recovery: a lease that expired, and a dispatcher's leases.
RECOVERY_GUARDS = ("lease_expires_at < %s", "leased_by = %s")


def recover_sql(vendor: str, guard: str) -> str:
    """Release the leased messages ``guard`` (one of :data:`RECOVERY_GUARDS`) selects,
    or park those whose attempts are used up, returning each one's new status."""
    return (
        f"UPDATE {OUTBOX} SET status = CASE WHEN attempts >= %s THEN %s ELSE %s END,"
        " last_error = CASE WHEN attempts >= %s THEN %s ELSE last_error END,"
        " leased_by = '', lease_token = NULL, lease_expires_at = NULL, updated_at = %s"
        " WHERE "
        + id_among_locked(
            vendor,
            f"SELECT id FROM {OUTBOX} WHERE status = %s AND lease_token IS NOT NULL"
            f" AND {guard} ORDER BY lease_expires_at, id LIMIT %s",
        )
        + " RETURNING status"
    )


def _recover(
    guard: str, guard_params: list[Any], reason: str, now: datetime, limit: int
) -> RecoveryResult:
    """Release leased messages matching ``guard`` — or park those whose attempts are
    used up — in one statement."""
    alias = alias_for(OutboxMessage)
    connection = connection_for(OutboxMessage)
    max_attempts = outbox_settings().MAX_ATTEMPTS
    sql = recover_sql(connection.vendor, guard)
    params = [
        max_attempts,
        PARKED,
        PENDING,
        max_attempts,
        storable_text(reason),
        adapt_dt(connection, now),
        PENDING,
        *guard_params,
        limit,
    ]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(sql, params)
        statuses = [r[0] for r in cursor.fetchall()]
    parked = statuses.count(PARKED)
    return RecoveryResult(released=len(statuses) - parked, parked=parked)


def recover_expired(*, now: datetime | None = None, limit: int = 1000) -> RecoveryResult:
    """Messages whose batch lease expired (their dispatcher stopped mid-batch) become
    claimable again; a message that used up its attempts this way is parked."""
    now = _now(now)
    connection = connection_for(OutboxMessage)
    return _recover(
        RECOVERY_GUARDS[0],
        [adapt_dt(connection, now)],
        "the dispatcher stopped while delivering this message; attempts used up",
        now,
        limit,
    )


def recover_dispatcher(
    dispatcher_id: str, *, now: datetime | None = None, limit: int = 10_000
) -> RecoveryResult:
    """At a dispatcher's start: release what an earlier run with the same id left
    leased, without waiting for the lease to expire. Never run two live dispatchers
    with one id."""
    dispatcher_id = text(dispatcher_id, "dispatcher id", MAX_DISPATCHER_ID_LENGTH)
    return _recover(
        RECOVERY_GUARDS[1],
        [dispatcher_id],
        "the dispatcher stopped while delivering this message; attempts used up",
        _now(now),
        limit,
    )


def purge_sent(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` Sent messages sent before ``older_than``."""
    return delete_oldest(
        OutboxMessage.objects.sent(), "sent_at", older_than, limit, error=InvalidInput
    )


def purge_parked(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` Parked messages parked before ``older_than``
    (a parked message changes no more until redelivered, so ``updated_at`` is when it
    was parked). A message redelivered meanwhile is Pending again and stays."""
    return delete_oldest(
        OutboxMessage.objects.parked(), "updated_at", older_than, limit, error=InvalidInput
    )


def purge_inbox(*, older_than: datetime, limit: int = 1000) -> int:
    """Retention: delete up to ``limit`` inbox records processed before ``older_than``.

    A redelivery of a message whose record was purged is processed again.
    """
    return delete_oldest(
        InboxMessage.objects.all(), "processed_at", older_than, limit, error=InvalidInput
    )


# --------------------------------------------------------------------------- operators


def _refusal(message_id: uuid.UUID, action: str) -> InvalidTransition | MessageNotFound:
    row = OutboxMessage.objects.filter(message_id=message_id).values("status", "lease_token")
    found = row.first()
    if found is None:
        return MessageNotFound(f"no outbox message has id {message_id}")
    if found["lease_token"] is not None:
        return InvalidTransition(
            f"message {message_id} is being delivered right now; {action} it later"
        )
    return InvalidTransition(f"message {message_id} is {found['status']}; it cannot be {action}")


def redeliver(message_id: uuid.UUID, *, now: datetime | None = None) -> None:
    """Pending (waiting for a retry) or Parked -> Pending, due now. A parked message
    gets a fresh set of attempts. Raises if it is Sent or being delivered."""
    now = _now(now)
    alias = alias_for(OutboxMessage)
    with transaction.atomic(using=alias):
        updated = (
            OutboxMessage.objects.using(alias)
            .filter(message_id=message_id, status__in=[PENDING, PARKED], lease_token__isnull=True)
            .update(
                status=PENDING,
                available_at=now,
                updated_at=now,
                attempts=Case(
                    When(status=PARKED, then=Value(0)),
                    default=F("attempts"),
                    output_field=PositiveIntegerField(),
                ),
            )
        )
        if not updated:
            raise _refusal(message_id, "redelivered")
        _notify(connection_for(OutboxMessage))


def park(message_id: uuid.UUID, reason: str, *, now: datetime | None = None) -> None:
    """Pending (not being delivered) -> Parked, with ``reason`` as its last error."""
    reason = text(reason, "reason", MAX_ERROR_LENGTH)
    now = _now(now)
    alias = alias_for(OutboxMessage)
    with transaction.atomic(using=alias):
        updated = (
            OutboxMessage.objects.using(alias)
            .filter(message_id=message_id, status=PENDING, lease_token__isnull=True)
            .update(status=PARKED, last_error=reason, updated_at=now)
        )
        if not updated:
            raise _refusal(message_id, "parked")


# --------------------------------------------------------------------------- inbox


def record_inbox(
    consumer: str, message_id: str, *, using: str, now: datetime | None = None
) -> bool:
    """Record that ``consumer`` processes ``message_id``, in the caller's open
    transaction; False if it is already recorded (a redelivery).

    ``ON CONFLICT DO NOTHING`` waits for a concurrent transaction recording the same
    message and then yields to it (or takes over if that one rolled back), so two
    deliveries of one message never both see it as new.
    """
    connection = transaction.get_connection(using)
    if not in_caller_atomic_block(connection):
        raise TransactionRequired()
    now = _now(now)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {INBOX} (consumer, message_id, processed_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (consumer, message_id) DO NOTHING RETURNING id",
                [consumer, message_id, adapt_dt(connection, now)],
            )
            return cursor.fetchone() is not None
    except DatabaseError:
        transaction.set_rollback(True, using=using)
        raise
