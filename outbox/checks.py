"""System checks for the outbox app (ids ``outbox.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError, connections
from django.db.migrations.loader import MigrationLoader

from ledon.checks import (
    ENGINES,
    check_metrics_token,
    check_round_trip_deadline,
    check_sqlite_options,
)
from ledon.conf import settings_hint
from ledon.db import alias_for
from ledon.pglisten import check_listen_database

from .conf import outbox_settings
from .exceptions import OutboxConfigurationError
from .models import OutboxMessage
from .transports import transport_class

HINT = settings_hint("OUTBOX")


@checks.register(ENGINES)
def check_outbox_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors = outbox_settings.check("outbox.E001")
    if errors:
        return errors
    settings = outbox_settings()
    try:
        cls = transport_class(settings.TRANSPORT)
    except OutboxConfigurationError as exc:
        return [checks.Error(str(exc), hint=HINT, id="outbox.E002")]
    return [
        checks.Error(
            f"OUTBOX['TRANSPORT_OPTIONS'] for {settings.TRANSPORT!r}: {problem}",
            hint=HINT,
            id="outbox.E003",
        )
        for problem in cls.check_options(settings.TRANSPORT_OPTIONS)
    ]


def missing_outbox_table(alias: str) -> checks.CheckMessage | None:
    """A warning if the outbox table does not exist in ``alias``, else None."""
    table = OutboxMessage._meta.db_table
    try:
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
    except DatabaseError as exc:
        return checks.Warning(
            f"cannot read the tables of database {alias!r}: {exc}", id="outbox.W002"
        )
    if table in tables:
        return None
    return checks.Warning(
        f"OUTBOX['ENABLED'] is True but the table {table!r} does not exist in "
        f"database {alias!r}: storing integration events will fail",
        hint="Run 'manage.py migrate outbox', or set OUTBOX['ENABLED'] = False.",
        id="outbox.W001",
    )


def _outbox_migrations_pending(alias: str) -> bool:
    """True when some migration of the outbox app is not recorded as applied."""
    try:
        loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    except DatabaseError:
        return True
    return any(
        key[0] == "outbox" and key not in loader.applied_migrations for key in loader.graph.nodes
    )


@checks.register(checks.Tags.database)
def check_outbox_table(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """With the outbox enabled, its table should exist.

    Database checks run with ``manage.py check --database …``, before ``migrate``
    and when the dispatcher starts. While the outbox's migrations are still to be
    applied, ``migrate`` is about to create the table, so nothing is reported then
    (``dispatch_outbox`` checks for the table itself and refuses to start without
    it); once they are recorded as applied, a missing table is a warning — a
    warning, so that it never stops the ``migrate`` that could repair it.
    """
    try:
        enabled = outbox_settings().ENABLED
    except OutboxConfigurationError:
        return []  # reported by check_outbox_settings
    alias = alias_for(OutboxMessage)
    if not enabled or not databases or alias not in databases:
        return []
    problem = missing_outbox_table(alias)
    if problem is None or (problem.id == "outbox.W001" and _outbox_migrations_pending(alias)):
        return []
    return [problem]
    table = OutboxMessage._meta.db_table
    try:
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
    except DatabaseError as exc:
        return [
            checks.Warning(f"cannot read the tables of database {alias!r}: {exc}", id="outbox.W002")
        ]
    if table not in tables:
        return [
            checks.Warning(
                f"OUTBOX['ENABLED'] is True but the table {table!r} does not exist in "
                f"database {alias!r}: storing integration events will fail",
                hint="Run 'manage.py migrate outbox', or set OUTBOX['ENABLED'] = False.",
                id="outbox.W001",
            )
        ]
    return []


@checks.register(ENGINES)
def check_outbox_listen_database(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``outbox.W003``: dispatchers would only poll, their LISTEN connection being
    pooled; ``outbox.E004``: ``OUTBOX['LISTEN_DATABASE']`` is not PostgreSQL."""
    try:
        settings = outbox_settings()
    except OutboxConfigurationError:
        return []  # reported by check_outbox_settings
    if not settings.ENABLED:
        return []
    return check_listen_database(
        "OUTBOX['LISTEN_DATABASE']",
        alias_for(OutboxMessage),
        settings.LISTEN_DATABASE,
        warning_id="outbox.W003",
        error_id="outbox.E004",
    )


# The same function from every app: the check framework runs it once.
checks.register(check_sqlite_options, ENGINES)
checks.register(check_metrics_token, ENGINES)
checks.register(check_round_trip_deadline, ENGINES)
