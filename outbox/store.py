"""Every state transition of outbox and inbox messages.

Each transition is one guarded statement — it succeeds only from the states that
allow it — inside ``transaction.atomic``, and returns a typed outcome or raises a
typed error. Nothing else in the app writes to these tables.

    stage ................ (new) -> PENDING, held if its key has an unsent message,
                           whose last one becomes followed          stage_message
    claim ................ PENDING, no lease, not held, due -> PENDING + lease (n+1)
    renew ................ PENDING + this lease -> PENDING + longer   renew_batch
    record delivered ..... PENDING + this lease -> SENT; if it was followed, the
                           key's next message is no longer held     record_deliveries
    record failure ....... PENDING + this lease -> PENDING later | PARKED
    recover .............. PENDING + lease expired (or of a restarted dispatcher)
                           -> PENDING | PARKED (attempts used up)   recover_*
    redeliver (operator) . PENDING | PARKED, no lease -> PENDING now (parked: attempts 0)
    park (operator) ...... PENDING, no lease -> PARKED
    discard (operator) ... PARKED -> (deleted); the key's next message is no longer held
    repair (at start) .... unsent keyed, not followed, a held one behind -> followed;
                           a key's first unsent message held -> not held  repair_keys
    retention ............ SENT, keyless PARKED older than their retention -> (deleted)
                           inbox records older than theirs -> (deleted)

Messages that carry a key go out one at a time, in the order they were stored: a
keyed message stored while its key has an unsent (Pending or Parked) message is
*held*, out of the claim's index, and the statement that ends its key's unsent
message (delivered, or discarded) releases it. Only the first unsent message of a key
is ever claimable, so two messages of one key are never in flight at once, a message
waiting for its retry holds its key, and a parked one halts it. Keyless messages are
never held. On PostgreSQL a transaction that stores a keyed message holds the key's
advisory lock until it ends (see :func:`stage_message`), which makes the id order of
one key's messages their commit order; and it marks the key's last unsent message
*followed*, a row update that a delivery of that message waits for and then reads,
so that only a delivery whose message is followed looks for a message to release
(see :func:`record_deliveries`).

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
from .faults import fault_point
from .models import UNSENT, InboxMessage, OutboxMessage
from .types import (
    Batch,
    DeliveryReport,
    DiscardedMessage,
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

#: The class of the outbox's advisory locks on PostgreSQL (the first of two int4 keys;
#: the second is the key's hash). Locks of two int4 keys never meet the jobs store's
#: bigint ones.
KEY_LOCK_CLASS = int.from_bytes(b"obxk")


#: The unsent statuses as SQL literals.
UNSENT_SQL = ", ".join(f"'{status}'" for status in UNSENT)


def unsent_keyed(alias: str) -> str:
    """The condition of the key index (``outbox_msg_key_idx``) on table ``alias``:
    keyed and unsent. Written with literal values, as the index's own condition reads,
    so that SQLite's planner sees that the index covers the rows."""
    return f"NOT ({alias}.key = '') AND {alias}.status IN ({UNSENT_SQL})"


def last_unsent_sql(alias: str, key: str) -> str:
    """The id of the last unsent message of the key ``key`` (an SQL expression), one
    probe of the key index."""
    return (
        f"(SELECT {alias}.id FROM {OUTBOX} {alias} WHERE {alias}.key = {key}"
        f" AND {unsent_keyed(alias)} ORDER BY {alias}.id DESC LIMIT 1)"
    )


def follow_sql() -> str:
    """Mark the last unsent message of the key ``%s`` followed, returning its id (no
    row when the key has no unsent message).

    A row update, so that it and a delivery of that message follow one another: a
    delivery recorded meanwhile waits for this transaction and then reads
    ``followed``; one recorded first makes the message Sent, and the status, checked
    again on the newest version of the row, leaves it out here."""
    return (
        f"UPDATE {OUTBOX} SET followed = TRUE WHERE id = {last_unsent_sql('t', '%s')}"
        f" AND status IN ({UNSENT_SQL}) RETURNING id"
    )


def _lock_key(connection: BaseDatabaseWrapper, key: str) -> None:
    """PostgreSQL: wait for, then hold until the end of this transaction, the advisory
    lock of ``key``. SQLite needs none: one transaction writes at a time."""
    if is_postgres(connection):
        with connection.cursor() as cursor:
            cursor.execute(LOCK_KEY, [KEY_LOCK_CLASS, key])


#: PostgreSQL: the advisory lock of one key (see :func:`_lock_key`).
LOCK_KEY = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
#: PostgreSQL: the advisory lock of one key, and a dispatcher wake-up.
LOCK_KEY_AND_NOTIFY = "SELECT pg_advisory_xact_lock(%s, hashtext(%s)), pg_notify(%s, '')"


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

    A keyed message is stored *held* when its key has an unsent message already (it
    goes out after that one), and the key's last unsent message is marked *followed*
    (see :func:`follow_sql`). On PostgreSQL the transaction first takes the key's
    advisory lock and keeps it until it ends: transactions storing messages of one key
    follow one another, so each one's messages get higher ids than those of every
    transaction of the key that committed before it, and the key's id order is the
    order in which its messages became visible. SQLite writes one transaction at a time
    and gets the same order for free.
    """
    connection = transaction.get_connection(using)
    if not in_caller_atomic_block(connection):
        raise TransactionRequired("integration events are stored inside the unit of work")
    headers = OutboxMessage._meta.get_field("headers").get_db_prep_save(
        dict(envelope.headers), connection
    )
    created = adapt_dt(connection, envelope.created_at)
    try:
        params: list[Any] = [
            adapt_uuid(connection, envelope.message_id),
            envelope.event_type,
            envelope.key,
            envelope.payload_json,
            headers,
            PENDING,
            created,
            created,
            created,
        ]
        keyed = bool(envelope.key)
        with connection.cursor() as cursor:
            if not keyed:
                cursor.execute(insert_sql(keyed=False, vendor=connection.vendor), params)
                _notify(connection)
            elif is_postgres(connection):
                # One round trip takes the key's lock and sends the wake-up (delivered
                # on commit, wherever the transaction sends it); the insert marks the
                # key's last unsent message in the same statement.
                channel = outbox_settings().NOTIFY_CHANNEL
                cursor.execute(LOCK_KEY_AND_NOTIFY, [KEY_LOCK_CLASS, envelope.key, channel])
                cursor.execute(
                    insert_sql(keyed=True, vendor=connection.vendor), [envelope.key, *params]
                )
            else:
                cursor.execute(follow_sql(), [envelope.key])
                held = cursor.fetchone() is not None
                cursor.execute(insert_sql(keyed=True, vendor=connection.vendor), [*params, held])
    except DatabaseError:
        transaction.set_rollback(True, using=using)
        raise


def insert_sql(*, keyed: bool, vendor: str) -> str:
    """Store one Pending message, not followed; a keyed one is held if its key has an
    unsent message, the last of which it marks followed (:func:`follow_sql`: on
    PostgreSQL in the same statement, its key the first parameter; elsewhere run
    before, whether it marked one the last parameter)."""
    held, tail = "FALSE", ""
    if keyed and vendor == "postgresql":
        held, tail = "EXISTS (SELECT 1 FROM tail)", f"WITH tail AS ({follow_sql()}) "
    elif keyed:
        held = "%s"
    return (
        f"{tail}INSERT INTO {OUTBOX} (message_id, event_type, key, payload_json, headers,"
        " status, attempts, available_at, created_at, updated_at, last_error, leased_by,"
        f" held, followed) VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s, '', '', {held},"
        " FALSE)"
    )


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
            " WHERE status = %s AND lease_token IS NULL AND held = %s AND available_at <= %s"
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
    waiting for or taking each other's messages. Held messages are not in the claim's
    index: a batch holds at most one message of a key, the first unsent one, and no
    other batch holds another. None when nothing is due.
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
        False,
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
    """Record a batch's confirmations, each fenced by the lease, in one transaction.

    Delivered -> Sent, and the next message of its key is released. Failed -> Pending
    again from ``retry_at[message_id]``, or Parked with the error once ``max_attempts``
    attempts are used or the failure is permanent; either way it keeps holding its key.
    A message whose lease this batch lost is left alone: STALE.
    """
    now = _now(now)
    max_attempts = max_attempts or outbox_settings().MAX_ATTEMPTS
    connection = connection_for(OutboxMessage)
    outcomes = {r.message_id: RecordOutcome.STALE for r in reports}
    delivered = [r.message_id for r in reports if r.ok]
    failed = [r for r in reports if not r.ok]
    with transaction.atomic(using=alias_for(OutboxMessage)):
        for message_id in _record_sent(connection, token, delivered, now):
            outcomes[message_id] = RecordOutcome.SENT
        outcomes.update(_record_failures(connection, token, failed, retry_at, max_attempts, now))
        fault_point("outbox.store.recording", token=token, outcomes=outcomes)
    return outcomes


def _record_failures(
    connection: BaseDatabaseWrapper,
    token: str,
    failed: Sequence[DeliveryReport],
    retry_at: Mapping[uuid.UUID, datetime],
    max_attempts: int,
    now: datetime,
) -> dict[uuid.UUID, RecordOutcome]:
    """Failed messages still leased under ``token``: Pending again from their retry
    time, or Parked once their attempts are used or the failure is permanent."""
    outcomes = {}
    with connection.cursor() as cursor:
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


def _record_sent(
    connection: BaseDatabaseWrapper, token: str, message_ids: Sequence[uuid.UUID], now: datetime
) -> list[uuid.UUID]:
    """Mark the messages delivered (those still leased under ``token``) Sent, then
    release the next message of each of their keys that a message was stored behind;
    the ids marked.

    A message is *followed* once a transaction stored a message of its key behind it
    (:func:`follow_sql`), a row update: when that transaction is still open, marking
    the message Sent waits for it to end and then reads the newest row, followed. So a
    message that is not followed has no message behind it, now or ever (a later one
    finds it Sent), and a key without a backlog costs its delivery no more than a
    keyless message. A followed one's release is a statement of its own: it reads what
    committed before the marking ended, the message behind included.
    """
    if not message_ids:
        return []
    params: list[Any] = [
        SENT,
        adapt_dt(connection, now),
        adapt_dt(connection, now),
        token,
        PENDING,
        *(adapt_uuid(connection, m) for m in message_ids),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sent_sql(len(message_ids)), params)
        rows = cursor.fetchall()
    _release_next(connection, sorted({key for _, key, followed in rows if key and followed}), now)
    return [read_uuid(message_id) for message_id, _, _ in rows]


def sent_sql(messages: int) -> str:
    """Mark ``messages`` messages leased under one token Sent, returning their ids,
    keys and whether each is followed."""
    return (
        f"UPDATE {OUTBOX} SET status = %s, sent_at = %s, updated_at = %s,"
        " last_error = '', leased_by = '', lease_token = NULL, lease_expires_at = NULL"
        f" WHERE lease_token = %s AND status = %s AND message_id IN ({placeholders(messages)})"
        " RETURNING message_id, key, followed"
    )


def release_sql(vendor: str, keys: int) -> str:
    """Release the first held message of each of ``keys`` keys: one probe of the held
    index (``outbox_msg_held_idx``) per key, then each row by its id. (On PostgreSQL
    ``= ANY(ARRAY(…))``: as ``IN (…)`` the planner may hash the ids and scan the whole
    table for them.)"""
    values = ", ".join(["(%s)"] * keys)
    firsts = (
        f"SELECT (SELECT h.id FROM {OUTBOX} h WHERE h.key = k.column1 AND h.held = %s"
        f" ORDER BY h.id LIMIT 1) FROM (VALUES {values}) AS k"
    )
    among = f"= ANY(ARRAY({firsts}))" if vendor == "postgresql" else f"IN ({firsts})"
    return f"UPDATE {OUTBOX} SET held = %s, updated_at = %s WHERE id {among} RETURNING id"


def _release_next(connection: BaseDatabaseWrapper, keys: Sequence[str], now: datetime) -> int:
    """Release the next message of each of ``keys``, whose first unsent message this
    transaction just ended (sent or discarded); how many were released. Wakes the
    dispatchers if any was.

    The next message is the key's first held one: only a key's first unsent message is
    not held, and it is gone."""
    if not keys:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            release_sql(connection.vendor, len(keys)),
            [False, adapt_dt(connection, now), True, *keys],
        )
        released = len(cursor.fetchall())
    if released:
        _notify(connection)
    return released


#: A repair of keys after an upgrade (see :func:`repair_keys`): mark followed each
#: unsent keyed message not marked that has a held message of its key behind it.
MARK_FOLLOWED = (
    f"UPDATE {OUTBOX} SET followed = TRUE WHERE id IN (SELECT m.id FROM {OUTBOX} m"
    f" WHERE {unsent_keyed('m')} AND NOT m.followed AND EXISTS (SELECT 1 FROM {OUTBOX} h"
    " WHERE h.key = m.key AND h.held AND h.id > m.id))"
    f" AND status IN ({UNSENT_SQL}) RETURNING id"
)

#: The other half of the repair: release the first held message of each key that has
#: no message that is unsent and not held (its first unsent message is held).
RELEASE_STRANDED = (
    f"UPDATE {OUTBOX} SET held = FALSE, updated_at = %s WHERE held AND id IN"
    f" (SELECT MIN(h.id) FROM {OUTBOX} h WHERE h.held GROUP BY h.key"
    f" HAVING NOT EXISTS (SELECT 1 FROM {OUTBOX} e WHERE e.key = h.key"
    f" AND {unsent_keyed('e')} AND NOT e.held)) RETURNING id"
)


def repair_keys(*, now: datetime | None = None) -> tuple[int, int]:
    """After an upgrade: put right what a producer of the previous release's code left
    while this release's ran, and return how many messages were marked followed and
    how many were released.

    That code did not mark the message it stored a message behind (so its delivery
    would not release the next one), and its dispatchers released always: so each
    unsent keyed message with a held message behind it is marked followed, then each
    key whose first unsent message is held has that message released. Both are no-ops
    when every producer runs this release; the dispatcher runs them at its start. The
    second is a statement of its own: it reads what the first waited for."""
    now = _now(now)
    connection = connection_for(OutboxMessage)
    with transaction.atomic(using=alias_for(OutboxMessage)), connection.cursor() as cursor:
        cursor.execute(MARK_FOLLOWED)
        marked = len(cursor.fetchall())
        cursor.execute(RELEASE_STRANDED, [adapt_dt(connection, now)])
        released = len(cursor.fetchall())
        if released:
            _notify(connection)
    return marked, released


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
    """Retention: delete up to ``limit`` keyless Parked messages parked before
    ``older_than`` (a parked message changes no more until redelivered, so
    ``updated_at`` is when it was parked). A message redelivered meanwhile is Pending
    again and stays. A keyed parked message is never purged: it holds its key's later
    messages back until an operator redelivers or discards it."""
    return delete_oldest(
        OutboxMessage.objects.parked_without_key(),
        "updated_at",
        older_than,
        limit,
        error=InvalidInput,
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
    gets a fresh set of attempts. A held message stays held: it goes out once its
    key's earlier messages are sent. Raises if it is Sent or being delivered."""
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
    """Pending (not being delivered) -> Parked, with ``reason`` as its last error. A
    parked message still holds its key: once it is its key's first unsent message,
    the key halts until it is redelivered or discarded."""
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


def discard(message_id: uuid.UUID, *, now: datetime | None = None) -> DiscardedMessage:
    """Parked -> deleted, for good: a message an operator decided never to deliver.
    If it halted its key (the key's first unsent message), the key's next message is
    released. Raises if it is not Parked (park it first)."""
    now = _now(now)
    alias = alias_for(OutboxMessage)
    connection = connection_for(OutboxMessage)
    with transaction.atomic(using=alias):
        key = (
            OutboxMessage.objects.using(alias)
            .filter(message_id=message_id)
            .values_list("key", flat=True)
            .first()
        )
        if key:
            # Like a delivery, the end of a key's unsent message must see the messages
            # a producer is storing for the key: wait for it.
            _lock_key(connection, key)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {OUTBOX} WHERE message_id = %s AND status = %s"
                " RETURNING event_type, key, held, last_error",
                [adapt_uuid(connection, message_id), PARKED],
            )
            row = cursor.fetchone()
        if row is None:
            raise _refusal(message_id, "discarded")
        event_type, key, held, last_error = row
        released = 0 if held else _release_next(connection, [key] if key else [], now)
    discarded = DiscardedMessage(
        message_id=message_id,
        event_type=event_type,
        key=key,
        last_error=last_error,
        released_next=bool(released),
    )
    logger.warning(
        "outbox message %s (%s) discarded by an operator",
        message_id,
        event_type,
        extra={"message_id": str(message_id), "key": key, "event_type": event_type},
    )
    return discarded


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
