"""The bounds of a map: how many items it may be given, and how large its results
may grow as one JSON list (checked as items end, and before a resume)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Func, Sum

from ..conf import workflows_settings
from ..exceptions import ResultsTooLarge, ResumeWouldFail, TooManyItems
from ..models import WorkflowItem, WorkflowRun, WorkflowStep
from ..types import StepKind, StepStatus
from .fanning import left, recorded_jobs


def check_item_count(key: str, count: int) -> None:
    """:class:`TooManyItems` if a map of ``count`` items is over
    ``WORKFLOWS["MAX_MAP_ITEMS"]`` (before anything is serialised or written)."""
    bound = workflows_settings().MAX_MAP_ITEMS
    if count > bound:
        raise TooManyItems(
            f"map {key!r}: {count} items, more than WORKFLOWS['MAX_MAP_ITEMS'] ({bound}); "
            "split them over several maps (or child runs), or raise the bound"
        )


class _OctetLength(Func):
    """Bytes of a text column's UTF-8 (``MAX_VALUE_BYTES`` counts bytes)."""

    function = "OCTET_LENGTH"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))")


def _results_bytes(
    step_id: int, scope_hash: str, *, excluding: int | None = None
) -> tuple[int, int]:
    """(items succeeded, bytes of their results' JSON) of step ``step_id``: on their
    rows, and in their jobs for those their jobs recorded (see :mod:`.fanning`; the
    step's run is of ``scope_hash``)."""
    rows = WorkflowItem.objects.filter(step_id=step_id)
    if excluding is not None:
        rows = rows.exclude(pk=excluding)
    on_rows = rows.filter(status=StepStatus.SUCCEEDED).aggregate(
        count=Count("id"), size=Sum(_OctetLength("result_json"))
    )
    in_jobs = recorded_jobs(rows, scope_hash).aggregate(
        count=Count("id"), size=Sum(_OctetLength("result_ref"))
    )
    count = (on_rows["count"] or 0) + (in_jobs["count"] or 0)
    return count, (on_rows["size"] or 0) + (in_jobs["size"] or 0)


def check_results_size(item_pk: int, result_json: str, count: int | None = None) -> None:
    """:class:`ResultsTooLarge` if item ``item_pk``'s result would make its map's results,
    as one JSON list, larger than ``WORKFLOWS["MAX_VALUE_BYTES"]`` (checked as each
    item ends, not once they all ran: the map fails on the item that does not fit).

    A result within its share of the bound (the bound over the map's item count,
    ``count`` if the caller knows it) always fits: no query. A larger one is added
    to the results recorded so far, counting every item not ended yet as the
    shortest result."""
    bound = workflows_settings().MAX_VALUE_BYTES
    size = len(result_json.encode("utf-8"))
    # A list of n results is "[" + n results joined by "," + "]": 1 + sum(size + 1).
    if count is not None and (count <= 1 or 1 + (size + 1) * count <= bound):
        return
    found = (
        WorkflowItem.objects.filter(pk=item_pk)
        .values_list("step_id", "step__item_count", "step__run__scope_hash")
        .first()
    )
    if found is None:
        return
    step_id, count, scope_hash = found
    if count <= 1 or 1 + (size + 1) * count <= bound:
        return
    ended, ended_bytes = _results_bytes(step_id, scope_hash, excluding=item_pk)
    least = 1 + (ended_bytes + ended) + (size + 1) + 2 * (count - ended - 1)
    if least > bound:
        raise ResultsTooLarge(
            f"its result ({size} bytes) makes the results of the map's {count} items "
            f"at least {least} bytes of JSON, more than "
            f"WORKFLOWS['MAX_VALUE_BYTES'] ({bound}); return less per item (a reference "
            "to data stored elsewhere), or map fewer items"
        )


def refuse_hopeless_resume(run_pk: int, run_id: str) -> None:
    """:class:`ResumeWouldFail` if resuming run ``run_pk`` (``run_id``) would fail it
    again the same way:
    a map whose items all succeeded but whose results are larger than
    ``WORKFLOWS["MAX_VALUE_BYTES"]`` (recorded before the bound was checked as
    items end, or under a larger bound) would be replayed to the same failure."""
    bound = workflows_settings().MAX_VALUE_BYTES
    scope_hash = WorkflowRun.objects.filter(pk=run_pk).values_list("scope_hash", flat=True)[0]
    running = WorkflowStep.objects.filter(
        run_id=run_pk, kind=StepKind.MAP, status=StepStatus.RUNNING
    ).values_list("pk", "key", "item_count")
    for step_pk, key, count in running:
        if left(WorkflowItem.objects.filter(step_id=step_pk), scope_hash).exists():
            continue
        succeeded, size = _results_bytes(step_pk, scope_hash)
        if succeeded == count and 1 + size + count > bound:
            raise ResumeWouldFail(
                f"run {run_id!r}: the results of map {key!r} are {1 + size + count} "
                f"bytes of JSON, more than WORKFLOWS['MAX_VALUE_BYTES'] ({bound}); a resume "
                "would fail the same way: raise the bound first, or cancel the run"
            )
