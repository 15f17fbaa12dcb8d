"""System checks for the outbox app (ids ``outbox.E0xx``)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError, connections

from .exceptions import OutboxConfigurationError

HINT = "See the OUTBOX settings reference in docs/outbox.md."


@checks.register()
def check_outbox_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .conf import outbox_settings
    from .transports import transport_class

    outbox_settings.cache_clear()
    try:
        settings = outbox_settings()
    except OutboxConfigurationError as exc:
        return [checks.Error(str(exc), hint=HINT, id="outbox.E001")]
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


@checks.register(checks.Tags.database)
def check_outbox_table(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """With the outbox enabled, its table should exist (``manage.py migrate outbox``).

    Database checks run with ``manage.py check --database …``, before ``migrate``
    and when the dispatcher starts. They are warnings, so that they never stop the
    ``migrate`` that creates the table; ``dispatch_outbox`` refuses to start on them.
    """
    from .conf import outbox_settings
    from .db import alias_for
    from .models import OutboxMessage

    try:
        enabled = outbox_settings().ENABLED
    except OutboxConfigurationError:
        return []  # reported by check_outbox_settings
    alias = alias_for(OutboxMessage)
    if not enabled or not databases or alias not in databases:
        return []
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
