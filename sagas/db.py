"""The deferred step transaction of the sagas app. (The alias and the caller-atomic
check every app shares live in :mod:`ledon.db`.)

Steps run in ``transaction.atomic`` blocks of their own. On SQLite the test project
(and most production set-ups) configure ``transaction_mode: IMMEDIATE``, which takes
the database's single write lock at ``BEGIN``. A step's transaction must not: a step
that hangs before its first write would otherwise hold the lock and block the
compensation that its timeout starts. :class:`StepAtomic` therefore begins a step's
transaction ``DEFERRED`` on SQLite (the lock is taken at the first write), and changes
nothing on other databases or inside an already open transaction.

A deferred transaction has one SQLite-specific cost: if another connection commits
between the step's first read and its first write, SQLite refuses to upgrade the
read to a write (``SQLITE_BUSY_SNAPSHOT``) instead of waiting. Nothing of the step
was committed then, so the runner runs the step again (see :func:`is_snapshot_conflict`).
"""

from __future__ import annotations

from django.db import transaction

#: SQLite's extended result code for "a read transaction cannot become a write
#: transaction because the database changed since it started reading".
SQLITE_BUSY_SNAPSHOT = 517


class StepAtomic(transaction.Atomic):
    """``transaction.atomic`` whose outermost block begins ``DEFERRED`` on SQLite."""

    def __init__(self, using: str) -> None:
        super().__init__(using, savepoint=True, durable=False)

    def __enter__(self) -> None:
        connection = transaction.get_connection(self.using)
        if connection.vendor != "sqlite" or connection.in_atomic_block:
            super().__enter__()
            return
        connection.ensure_connection()
        # The SQLite backend reads its ``transaction_mode`` option when it begins a
        # transaction; override it for this one BEGIN only.
        mode = getattr(connection, "transaction_mode", None)
        connection.transaction_mode = "DEFERRED"
        try:
            super().__enter__()
        finally:
            connection.transaction_mode = mode


def is_snapshot_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite refusing to upgrade a deferred transaction's read
    snapshot to a write because another connection committed meanwhile."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlite_errorcode", None) == SQLITE_BUSY_SNAPSHOT:
            return True
        current = current.__cause__ or current.__context__
    return False
