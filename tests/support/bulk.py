"""What the tests of every app's bulk operations share: a row another transaction
holds while a bulk run goes, and the admin's "all N matching" action as Django posts
it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.test import Client


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
