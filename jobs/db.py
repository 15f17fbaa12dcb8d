"""The jobs store's raw SQL helpers: running a statement with named parameters, the
token expression, and the builders of multi-row parameters. (The alias, vendor switch
and datetime adapters every app shares live in :mod:`ledon.db`.)

The store writes raw SQL where the ORM cannot express a statement in one round
trip (``INSERT … ON CONFLICT DO NOTHING RETURNING``, ``UPDATE … RETURNING``,
``FOR UPDATE SKIP LOCKED`` inside an update). SQLite >= 3.35 and PostgreSQL both
accept these forms; the few differences are switched on ``connection.vendor``.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ledon.db import UNFLUSHED_COMMIT, is_postgres

from .conf import jobs_settings

#: psycopg ``prepare_threshold`` that no statement reaches by repetition.
_NEVER_BY_COUNT = 2**31 - 1


def fetch(
    connection: BaseDatabaseWrapper,
    sql: str,
    params: Mapping[str, Any],
    *,
    prepare: bool = False,
) -> list[dict[str, Any]]:
    """Run one statement of the store with named parameters; its rows, by column name.

    With ``prepare`` — the hot statements — on PostgreSQL (unless
    ``JOBS['PREPARED_STATEMENTS']`` is off) the statement runs with server-side
    parameters as a prepared statement of the connection: parsed and planned once, then
    only executed — for the worker's claim-and-finish statement that is most of its
    cost. Either way it runs in the connection's current transaction, like any Django
    cursor; errors are Django's database errors, and the statement is recorded where
    Django records queries (``CaptureQueriesContext``, ``DEBUG``).
    """
    if not (prepare and is_postgres(connection) and jobs_settings().PREPARED_STATEMENTS):
        with connection.cursor() as cursor:
            if _asynchronous(connection):
                raw = connection.connection
                with connection.wrap_database_errors, raw.pipeline():
                    raw.execute(UNFLUSHED_COMMIT)
                    cursor.execute(sql, params)
            elif connection.vendor == "sqlite":
                cursor.execute(*_positional(sql, params))
            else:
                cursor.execute(sql, params)
            if not cursor.description:
                return []
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    # psycopg is the [postgres] extra: a SQLite set-up never imports it.
    import psycopg

    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django turns psycopg's automatic preparation off (for poolers); statements
        # then are never prepared, not even on request. A threshold nothing reaches
        # keeps automatic preparation off and lets an explicit request through.
        raw.prepare_threshold = _NEVER_BY_COUNT
    start = time.monotonic()
    # In PostgreSQL's own $n form, converted once per text: psycopg would parse the
    # text of a long statement (a claim that also finishes) again on every call.
    text, order = _numbered_placeholders(sql)
    values = [params[name] for name in order]
    with connection.wrap_database_errors, psycopg.RawCursor(raw, row_factory=_named_rows) as cursor:
        if _asynchronous(connection):
            with raw.pipeline():
                raw.execute(UNFLUSHED_COMMIT)
                cursor.execute(text, values, prepare=True)
        else:
            cursor.execute(text, values, prepare=True)
        result = cursor.pgresult
        # Not cursor.description: it builds a column object per column.
        rows = cursor.fetchall() if result is not None and result.nfields else []
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - start:.3f}"})
    return rows


_NAMED = re.compile(r"%\((\w+)\)s")


def _positional(sql: str, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """``sql`` with its ``%(name)s`` parameters as positional ``%s`` ones, and their
    values in order. SQLite looks each named parameter up among those the statement
    named before it, so a statement's parse grows with the square of its named
    parameters: a bulk insert of 500 jobs (10,000 of them) took half a second to
    parse, positional ones take none."""
    return _NAMED.sub("%s", sql), [params[name] for name in _NAMED.findall(sql)]


_asynchronous_commits = threading.local()


@contextmanager
def asynchronous_commits() -> Iterator[None]:
    """Inside, on this thread: each statement :func:`fetch` runs on PostgreSQL in
    autocommit — its own transaction — commits with ``synchronous_commit = off``.
    The setting and the statement go in one pipeline, ended by one ``Sync``: one
    implicit transaction, one round trip, committed before the rows are read."""
    previous = getattr(_asynchronous_commits, "on", False)
    _asynchronous_commits.on = True
    try:
        yield
    finally:
        _asynchronous_commits.on = previous


def _asynchronous(connection: BaseDatabaseWrapper) -> bool:
    return (
        getattr(_asynchronous_commits, "on", False)
        and is_postgres(connection)
        and connection.get_autocommit()
    )


def _named_rows(cursor: Any) -> Any:
    """psycopg row factory: each row as a dict by column name, like psycopg's
    ``dict_row``, with the names read straight from the result (``dict_row`` builds the
    cursor's whole ``description`` — a column object per column — for every
    statement, most of the Python a hot statement costs)."""
    result = cursor.pgresult
    if result is None or not result.nfields:
        return _no_rows
    names = [result.fname(n).decode() for n in range(result.nfields)]

    def row(values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(names, values, strict=True))

    return row


def _no_rows(values: Sequence[Any]) -> Any:
    raise TypeError("the statement returned no rows")


def fetch_results(
    connection: BaseDatabaseWrapper,
    statements: Sequence[str],
    params: Mapping[str, Any],
    *,
    prepare: Sequence[str] = (),
) -> list[list[dict[str, Any]]]:
    """PostgreSQL: run ``statements`` one after the other in one round trip — a
    pipeline, with the transaction's ``BEGIN`` if it is the first — each with a
    snapshot of its own, with server-side parameters; the rows of each, by column
    name. Those also in
    ``prepare`` run as prepared statements, as :func:`fetch` runs them (unless
    ``JOBS['PREPARED_STATEMENTS']`` is off). Recorded where Django records
    queries."""
    # psycopg is the [postgres] extra: a SQLite set-up never imports it.
    import psycopg

    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if prepare and not jobs_settings().PREPARED_STATEMENTS:
        prepare = ()
    if prepare and raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_BY_COUNT  # see fetch
    start = time.monotonic()
    with connection.wrap_database_errors:
        # Server-side parameters (Django's own cursors bind on the client), so that
        # a statement's text is the same each time and can be prepared; in
        # PostgreSQL's own $n form, converted once per text (psycopg would parse a
        # long statement's text again on every call).
        cursors = [psycopg.RawCursor(raw, row_factory=_named_rows) for _ in statements]
        try:
            with raw.pipeline():
                for cursor, statement in zip(cursors, statements, strict=True):
                    text, names = _numbered_placeholders(statement)
                    cursor.execute(
                        text,
                        [params[name] for name in names],
                        prepare=statement in prepare or None,
                    )
            results = [
                cursor.fetchall() if cursor.pgresult is not None and cursor.pgresult.nfields else []
                for cursor in cursors
            ]
        finally:
            for cursor in cursors:
                cursor.close()
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": "; ".join(statements), "time": f"{time.monotonic() - start:.3f}"}
        )
    return results


_NAMED_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s")


@functools.lru_cache(maxsize=256)
def _numbered_placeholders(statement: str) -> tuple[str, tuple[str, ...]]:
    """``statement`` with each named placeholder (``%(name)s``) as PostgreSQL's
    ``$n``, the same number for the same name, and ``%%`` as the ``%`` it stands for;
    and the names, in number order."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return _NAMED_PLACEHOLDER.sub(number, statement), tuple(names)


def random_token_sql(vendor: str) -> str:
    """SQL for a fresh token: 32 hex characters from the database server's
    cryptographic random source.

    On PostgreSQL the first 12 are the time in milliseconds and the other 20 random
    (80 bits, from two ``gen_random_uuid()`` calls): new tokens land next to each
    other in the attempt-token index instead of on a random page of a history of
    millions, which keeps claiming as cheap with a long history as without. On
    SQLite all 32 are random (128 bits).
    """
    if vendor == "postgresql":
        return (
            "lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')"
            " || left(replace(gen_random_uuid()::text, '-', ''), 12)"
            " || right(gen_random_uuid()::text, 8)"
        )
    return "lower(hex(randomblob(16)))"


# --------------------------------------------------------------------------- SQL text


def numbered(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of a multi-row statement: row ``n``'s ``name`` as ``name_n``."""
    return {f"{name}_{n}": value for n, row in enumerate(rows) for name, value in row.items()}


def values_of(names: Iterable[str], rows: int, literals: str = "") -> str:
    """``(%(a_0)s, %(b_0)s…), (%(a_1)s, …)``: the VALUES of :func:`numbered` parameters,
    each row followed by ``literals``."""
    names = tuple(names)
    return ", ".join(
        "(" + ", ".join(f"%({name}_{n})s" for name in names) + literals + ")" for n in range(rows)
    )


def in_list(name: str, count: int) -> str:
    """``%(name_0)s, %(name_1)s…``: the members of an ``IN (…)`` list of ``count``."""
    return ", ".join(f"%({name}_{n})s" for n in range(count))


def in_list_params(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The parameters of :func:`in_list`."""
    return {f"{name}_{n}": value for n, value in enumerate(values)}


def union_by_kind(
    branches: Sequence[tuple[str, str, Mapping[str, str]]],
    types: Mapping[str, str] | None = None,
) -> str:
    """One result of several kinds of row: a ``kind`` column, then the union of every
    branch's named columns (NULL where a branch has none, of its type in ``types`` if
    given). A branch is its kind, the table or CTE its rows come from and its columns,
    ``{result name: expression}``. PostgreSQL resolves a union's column types from left
    to right: a branch with typed values should come before one with NULLs only, or
    the NULLs be typed."""
    names: list[str] = []
    for _, _, columns in branches:
        names.extend(name for name in columns if name not in names)

    def column(expression: str, name: str | None) -> str:
        return expression if name in (None, expression) else f"{expression} AS {name}"

    def _null(name: str) -> str:
        return f"NULL::{types[name]}" if types and name in types else "NULL"

    return " UNION ALL ".join(
        f"SELECT '{kind}'{' AS kind' if n == 0 else ''}, "
        + ", ".join(
            column(columns.get(name, _null(name)), name if n == 0 else None) for name in names
        )
        + f" FROM {source}"
        for n, (kind, source, columns) in enumerate(branches)
    )
