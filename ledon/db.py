"""Database helpers every app shares.

- where a model's rows live (:func:`alias_for`, :func:`connection_for`) and the vendor
  switch of the raw SQL (:func:`is_postgres`);
- datetimes in and out of raw SQL (:func:`adapt_dt`, :func:`read_dt`): PostgreSQL
  takes and gives aware values, SQLite sortable UTC text;
- whether the caller holds a transaction open (:func:`in_caller_atomic_block`), the
  test case's own blocks left out;
- which errors mean "not now", dropping a broken connection (after an error, or
  before a handler runs on a thread whose connection the server closed), and the
  start-up check
  that tells an unreachable database (wait for it) from one that answers without the
  app's tables (a fatal, clear error).
"""

from __future__ import annotations

import select
import threading
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.utils.dateparse import parse_datetime

#: Every error a database step may raise (Django's ``InterfaceError`` is not a
#: ``DatabaseError``).
DATABASE_ERRORS = (DatabaseError, InterfaceError)

#: Database errors that say "not now" rather than "never": the server is unreachable,
#: the connection broke, the transaction lost a race. Retried until they pass.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)


#: PostgreSQL: a one-row query that makes the transaction it runs in commit without
#: waiting for its WAL to reach the disk (``synchronous_commit = off`` for that
#: transaction alone). For a statement in autocommit — its own transaction — whose
#: loss in a crash of the database server harms nothing: what it wrote is read again
#: from rows that were already durable, and any later durable commit (of any session)
#: flushes it first. Referenced from the statement (a ``FROM`` item), so that it runs.
UNFLUSHED_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"


def alias_for(model: type[Any]) -> str:
    """The database alias ``model``'s rows are written to (the router's choice)."""
    return router.db_for_write(model) or "default"


def connection_for(model: type[Any]) -> BaseDatabaseWrapper:
    return connections[alias_for(model)]


def is_postgres(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql"


def id_among_locked(vendor: str, select: str) -> str:
    """``id`` is one of those ``select`` picks and locks (``SELECT id … LIMIT n``).

    On PostgreSQL the pick runs once for the whole statement (``= ANY(ARRAY(…))``, an
    init plan) and its rows are locked, skipping those another claim holds. As
    ``id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` the planner may run it again
    for each row of the outer table (a nested-loop semi-join), each run skipping the
    rows the update has changed so far, so that one claim takes more than n rows; or
    plan it as a hash join over the whole table. SQLite locks nothing and runs the
    sub-select once.
    """
    if vendor == "postgresql":
        return f"id = ANY(ARRAY({select} FOR UPDATE SKIP LOCKED))"
    return f"id IN ({select})"


def adapt_dt(connection: BaseDatabaseWrapper, value: datetime | None) -> Any:
    """A datetime as the backend stores it (SQLite: sortable UTC text)."""
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def read_dt(value: Any) -> datetime:
    """A datetime read by raw SQL, as an aware UTC value: PostgreSQL gives aware
    values, SQLite gives text."""
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def in_caller_atomic_block(connection: BaseDatabaseWrapper) -> bool:
    """Whether the caller has an ``atomic`` block open on ``connection``.

    The blocks Django's ``TestCase`` (and pytest-django's ``django_db``) wrap around
    each test do not count, exactly as for ``atomic(durable=True)``: code that refuses
    (or requires) the caller's transaction behaves in an ordinary test as in
    production.
    """
    return any(not block._from_testcase for block in connection.atomic_blocks)  # type: ignore[attr-defined]


def in_test_case_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the only open ``atomic`` blocks are those of a test case: other
    connections cannot see this transaction's rows."""
    return bool(connection.atomic_blocks) and not in_caller_atomic_block(connection)


class DatabaseNotMigrated(ImproperlyConfigured):
    """The database answers but lacks tables an engine needs: run ``migrate``."""

    def __init__(self, alias: str, app_label: str, missing: Sequence[str], engine: str) -> None:
        self.alias = alias
        self.missing = list(missing)
        tables = ", ".join(self.missing)
        super().__init__(
            f"database {alias!r} lacks the tables of the {app_label!r} app ({tables}): "
            "its migrations have not been applied.\n"
            f"Run 'python manage.py migrate', then start the {engine} again."
        )


def reset_connection(alias: str) -> None:
    """After a database error: close this thread's connection to ``alias`` if it is
    broken, so that the next statement reconnects. A connection inside an atomic
    block (a caller's or a test's transaction) is left to that block."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        _close_if_unusable(connection)


def _close_if_unusable(connection: BaseDatabaseWrapper) -> bool:
    """Close ``connection`` unless it is open and answers; whether it was kept."""
    try:
        usable = connection.connection is not None and connection.is_usable()
    except Exception:
        usable = False
    if not usable:
        connection.close()
    return usable


#: libpq's ``CONNECTION_OK`` (``psycopg.pq.ConnStatus.OK``), without importing the
#: driver where no PostgreSQL connection is used.
_CONNECTION_OK = 0

#: This thread's connection wrappers that have opened a connection (held weakly), so
#: that :func:`drop_closed_connections` looks at them without going through
#: ``connections``, whose per-thread lookups cost more than the check itself.
_opened = threading.local()


def _remember_opened(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    # Weak: under ASGI a thread serves many contexts, each with wrappers of its own.
    opened: weakref.WeakSet[BaseDatabaseWrapper] = _opened.__dict__.setdefault(
        "wrappers", weakref.WeakSet()
    )
    opened.add(connection)


connection_created.connect(_remember_opened, dispatch_uid="ledon.db.remember_opened")


def drop_closed_connections() -> None:
    """Before a handler runs on a long-lived thread: close this thread's connections
    that the server has closed since their last use (a restart, a failover, an idle
    timeout), so that the handler's first statement opens a new one rather than
    failing on the old — which would cost the job an attempt. A connection that saw
    an error is checked with a round trip (and kept, its error forgotten, if it
    answers); any other costs one poll of its socket, and a round trip only when the
    server has sent something while it was idle (a closing connection's last words).
    Connections inside an atomic block are left alone."""
    for connection in getattr(_opened, "wrappers", ()):
        if connection.connection is None or connection.in_atomic_block:
            continue
        if not connection.errors_occurred and not _server_spoke(connection):
            continue
        if _close_if_unusable(connection):
            connection.errors_occurred = False


def _server_spoke(connection: BaseDatabaseWrapper) -> bool:
    """Whether an idle PostgreSQL connection's socket has something to read: the
    server sent a message (or closed it) since the last statement."""
    if not is_postgres(connection):
        return False
    try:
        pgconn = connection.connection.pgconn
        if pgconn.status != _CONNECTION_OK:
            return True
        return bool(select.select([pgconn.socket], [], [], 0)[0])
    except Exception:  # a closed pgconn has no socket
        return True


def missing_tables(alias: str, tables: Sequence[str]) -> list[str]:
    """Those of ``tables`` that do not exist in ``alias``, read through the
    connection's introspection. Raises the database error if it cannot be reached."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    return [table for table in tables if table not in present]
