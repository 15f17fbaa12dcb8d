"""Database helpers every engine shares: which errors mean "not now", dropping a
broken connection, and the start-up check that tells an unreachable database (wait
for it) from one that answers without the app's tables (a fatal, clear error)."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError, connections

#: Every error a database step may raise (Django's ``InterfaceError`` is not a
#: ``DatabaseError``).
DATABASE_ERRORS = (DatabaseError, InterfaceError)

#: Database errors that say "not now" rather than "never": the server is unreachable,
#: the connection broke, the transaction lost a race. Retried until they pass.
TRANSIENT_ERRORS = (OperationalError, InterfaceError)


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
    if connection.in_atomic_block:
        return
    try:
        usable = connection.connection is not None and connection.is_usable()
    except Exception:
        usable = False
    if not usable:
        connection.close()


def missing_tables(alias: str, tables: Sequence[str]) -> list[str]:
    """Those of ``tables`` that do not exist in ``alias``, read through the
    connection's introspection. Raises the database error if it cannot be reached."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    return [table for table in tables if table not in present]
