"""Small database helpers shared by the store: the alias, vendor switches, adapters.

The store writes raw SQL where the ORM cannot express a statement in one round
trip (``INSERT … ON CONFLICT DO NOTHING RETURNING``, ``UPDATE … RETURNING``,
``FOR UPDATE SKIP LOCKED`` inside an update). SQLite >= 3.35 and PostgreSQL both
accept these forms; the few differences are switched on ``connection.vendor``.
"""

from __future__ import annotations

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


def adapt_dt(connection: BaseDatabaseWrapper, value: datetime | None) -> Any:
    """A datetime as the backend stores it (SQLite: sortable UTC text)."""
    if value is None:
        return None
    return connection.ops.adapt_datetimefield_value(value)


def read_dt(value: Any) -> datetime | None:
    """A datetime read by raw SQL: PostgreSQL gives aware values, SQLite gives text."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def random_token_sql(connection: BaseDatabaseWrapper) -> str:
    """SQL for a fresh random token (32 hex characters; 122 random bits on PostgreSQL,
    128 on SQLite) from the database server's cryptographic random source."""
    if is_postgres(connection):
        return "replace(gen_random_uuid()::text, '-', '')"
    return "lower(hex(randomblob(16)))"


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)
