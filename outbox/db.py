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


def skip_locked(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL: let concurrent claimers pass each other's rows. SQLite has one
    writer at a time, so the clause is neither needed nor accepted there."""
    return " FOR UPDATE SKIP LOCKED" if is_postgres(connection) else ""


def id_among_locked(connection: BaseDatabaseWrapper, select: str) -> str:
    """``id`` is one of those ``select`` picks and locks (``SELECT id … LIMIT n``).

    On PostgreSQL the pick runs once for the whole statement (``= ANY(ARRAY(…))``, an
    init plan). As ``id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` the planner may
    run it again for each row of the outer table (a nested-loop semi-join); each run
    then skips the rows the update has changed so far and picks n more, so that one
    claim takes more than n rows. SQLite locks nothing and runs the sub-select once.
    """
    if is_postgres(connection):
        return f"id = ANY(ARRAY({select}{skip_locked(connection)}))"
    return f"id IN ({select})"


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
