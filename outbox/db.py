"""The few database helpers the outbox store needs: alias, vendor switch, adapters.

Raw SQL is used where the ORM cannot say a statement in one round trip
(``UPDATE … RETURNING``, ``INSERT … ON CONFLICT DO NOTHING RETURNING``,
``FOR UPDATE SKIP LOCKED`` inside an update); SQLite >= 3.35 and PostgreSQL accept
these forms, and the differences are switched on ``connection.vendor``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.dateparse import parse_datetime


def alias_for(model: type[Any]) -> str:
    return router.db_for_write(model) or "default"


def connection_for(model: type[Any]) -> BaseDatabaseWrapper:
    return connections[alias_for(model)]


def is_postgres(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql"


def skip_locked(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL: let concurrent claimers pass each other's rows. SQLite has one
    writer at a time, so the clause is neither needed nor accepted there."""
    return " FOR UPDATE SKIP LOCKED" if is_postgres(connection) else ""


def adapt_dt(connection: BaseDatabaseWrapper, value: datetime | None) -> Any:
    """A datetime as the backend stores it (SQLite: sortable UTC text)."""
    return None if value is None else connection.ops.adapt_datetimefield_value(value)


def adapt_uuid(connection: BaseDatabaseWrapper, value: uuid.UUID) -> Any:
    """A UUID as the backend stores it (SQLite: 32 hex characters)."""
    return value if is_postgres(connection) else value.hex


def read_dt(value: Any) -> datetime:
    """A datetime read by raw SQL: PostgreSQL gives aware values, SQLite gives text."""
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def read_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def read_json(value: Any) -> Any:
    """A JSON column read by raw SQL: text on both backends, or already decoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def in_caller_atomic_block(connection: BaseDatabaseWrapper) -> bool:
    """Whether the caller has an ``atomic`` block open on ``connection``.

    The blocks Django's ``TestCase`` (and pytest-django's ``django_db``) wrap around
    each test do not count, exactly as for ``atomic(durable=True)``, so code behaves
    in an ordinary test as in production.
    """
    return any(not block._from_testcase for block in connection.atomic_blocks)  # type: ignore[attr-defined]
