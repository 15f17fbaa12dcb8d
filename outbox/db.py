"""The outbox store's own database helpers: the claim's lock clause, UUID and JSON
adapters. (The alias, vendor switch, datetime adapters and the caller-atomic check
every app shares live in :mod:`ledon.db`.)

Raw SQL is used where the ORM cannot say a statement in one round trip
(``UPDATE … RETURNING``, ``INSERT … ON CONFLICT DO NOTHING RETURNING``,
``FOR UPDATE SKIP LOCKED`` inside an update); SQLite >= 3.35 and PostgreSQL accept
these forms, and the differences are switched on ``connection.vendor``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import is_postgres


def adapt_uuid(connection: BaseDatabaseWrapper, value: uuid.UUID) -> Any:
    """A UUID as the backend stores it (SQLite: 32 hex characters)."""
    return value if is_postgres(connection) else value.hex


def read_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def read_json(value: Any) -> Any:
    """A JSON column read by raw SQL: text on both backends, or already decoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)
