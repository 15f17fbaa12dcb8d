"""Finding runs by their tags: the runs that carry every pair asked for.

PostgreSQL answers with the JSON containment operator (``tags @> '{...}'``), served
by the GIN index the migration creates there. SQLite has no containment operator for
JSON: each pair is looked for among the run's pairs (``json_each``, any key however
it is spelt), which reads the rows the other conditions leave (a scope's runs, say)
without an index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connections
from django.db.models import BooleanField, F, Func, QuerySet

from ledon.db import alias_for

from ..models import WorkflowRun


class _Carries(Func):
    """Whether a JSON object column holds ``key`` with the text ``value`` (SQLite)."""

    output_field = BooleanField()

    def __init__(self, column: str, key: str, value: str) -> None:
        super().__init__(F(column))
        self.pair = (key, value)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        column, params = compiler.compile(self.source_expressions[0])
        sql = (
            f"EXISTS (SELECT 1 FROM json_each({column}) AS pair WHERE pair.key = %s"
            " AND pair.type = 'text' AND pair.value = %s)"
        )
        return sql, (*params, *self.pair)


def carrying(rows: QuerySet[WorkflowRun], tags: Mapping[str, str]) -> QuerySet[WorkflowRun]:
    """``rows`` (runs) that carry every pair of ``tags`` (checked already); all of
    them when ``tags`` is empty."""
    if not tags:
        return rows
    if connections[alias_for(rows.model)].features.supports_json_field_contains:
        return rows.filter(tags__contains=dict(tags))
    for key, value in tags.items():
        rows = rows.filter(_Carries("tags", key, value))
    return rows
