"""What the tests of every app's bulk operations share: a bulk command run and its
options, a table read whole, the check that a run changed exactly the rows its filter
selected, a row another transaction holds while a bulk run goes, and the admin's "all
N matching" action as Django posts it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime
from io import StringIO
from typing import Any

from django.core.management import call_command
from django.db import transaction
from django.db.models import QuerySet
from django.test import Client

Row = dict[str, Any]


def run_command(name: str, *args: str) -> str:
    """``manage.py NAME ARGS`` run here; what it printed."""
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def argv(options: dict[str, str]) -> list[str]:
    """A command's options as its command line spells them (``error_contains`` is
    ``--error-contains``)."""
    return [a for name, value in options.items() for a in (f"--{name.replace('_', '-')}", value)]


def written_out(
    options: dict[str, str],
    *,
    name_field: str = "name",
    error_fields: Sequence[str] = ("error",),
    scope_hash: Callable[[str], str] | None = None,
) -> Callable[[Row], bool]:
    """What a command's filter ``options`` mean, written out for one row: its
    ``status``, its name (``name_field``), its scope (``scope_hash`` of the scope
    given), its creation time, a piece of one of its ``error_fields`` in any case."""

    def scope(row: Row, value: str) -> bool:
        assert scope_hash is not None, "the rows belong to no scope"
        return bool(row["scope_hash"] == scope_hash(value))

    checks: dict[str, Callable[[Row, str], bool]] = {
        "status": lambda row, v: bool(row["status"] == v),
        "name": lambda row, v: bool(row[name_field] == v),
        "scope": scope,
        "since": lambda row, v: bool(row["created_at"] >= datetime.fromisoformat(v)),
        "until": lambda row, v: bool(row["created_at"] < datetime.fromisoformat(v)),
        "error_contains": lambda row, v: any(v.lower() in row[f].lower() for f in error_fields),
    }
    return lambda row: all(checks[name](row, value) for name, value in options.items())


def table(model: Any) -> dict[Any, Row]:
    """Every row of ``model``'s table, every column, by primary key."""
    return {row["id"]: row for row in model.objects.order_by("id").values()}


def assert_changed_exactly(
    before: dict[Any, Row],
    after: dict[Any, Row],
    *,
    selects: Callable[[Row], bool],
    rule: Callable[[Row], Row],
    ruled: Sequence[str],
) -> int:
    """Every row ``selects`` (the filter, written out for one row as it was before)
    is as ``rule`` makes it, in the columns the rules speak of (``ruled``: the others
    a transition sets as it always does); every other row is as it was, every column.
    The number of rows changed."""
    assert after.keys() == before.keys()
    changed = 0
    for pk, row in before.items():
        if selects(row):
            expected = rule(row)
            assert {c: after[pk][c] for c in ruled} == {c: expected[c] for c in ruled}, row
            changed += expected != row
        else:
            assert after[pk] == row, row
    return changed


@contextmanager
def held(
    background: Callable[[Callable[[], Any]], Future[Any]], row: QuerySet[Any]
) -> Iterator[None]:
    """``row`` (one row) locked by a transaction of another connection (the
    ``background`` fixture's thread) for as long as the block runs."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            row.select_for_update().get()
            holding.set()
            release.wait(30)

    holder = background(hold)
    assert holding.wait(30)
    try:
        yield
    finally:
        release.set()
        holder.result(30)


def across(
    client: Client, changelist: str, model: Any, action: str, query: str = "", **extra: Any
) -> Any:
    """The admin ``action`` chosen for every row the filters in ``query`` match ("Select
    all N"), with the ticked row Django posts along; ``extra``: the confirmation
    page's buttons and fields."""
    data = {
        "action": action,
        "select_across": "1",
        "_selected_action": [model.objects.order_by("id").values_list("pk", flat=True)[0]],
        **extra,
    }
    if "bulk_confirm" not in extra and "bulk_recount" not in extra:
        data["index"] = "0"
    return client.post(f"{changelist}?{query}", data)
