"""An item that succeeds is recorded by its job's own finish: it costs no statement
beyond its job's claim and finish, the run's picture counts it as its job stands
until the fan-in copies it onto its row, and the fan-in reads the item jobs as one
set, whatever the map's size. The advance that queues the items never reads them
back, and the statement that ends the last item job queues the run's advance itself
(a map staged by an older version has a job of its own that wakes the run after two
reads)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import JobContext, execution, job_handler
from jobs.api import submit_batch
from jobs.models import Batch, Job
from jobs.signals import finished_attempt
from jobs.testing import run_jobs_inline
from jobs.types import FinishOutcome, JobSubmission
from workflows import StepStatus, WorkflowContext, WorkflowScope, activity, start_workflow, workflow
from workflows.models import WorkflowItem, WorkflowStep
from workflows.store import ADVANCE_HANDLER, ITEMS_ENDED_HANDLER, advance_scope_hash

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-item-records"
QUEUE = "itemrecords"


@activity("itemrecords.same", queue=QUEUE)
def same(value: int) -> int:
    return value


@job_handler("itemrecords.plain", version=1)
def plain(ctx: JobContext) -> None:
    return None


@workflow("itemrecords.map", version=1)
def mapped(wf: WorkflowContext) -> Any:
    return wf.map("same", same, list(range(wf.input["items"])))


def statements(run: Any) -> int:
    with CaptureQueriesContext(connection) as queries:
        run()
    return len(queries.captured_queries)


def item_statements(items: int) -> int:
    """The statements of ``items`` item jobs of a map (queued by its first advance)."""
    run_jobs_inline(queues=["default"])  # what an earlier map left: its fan-in
    start_workflow(SCOPE, f"map-{items}", "itemrecords.map", {"items": items})
    run_jobs_inline(queues=["default"], max_attempts_run=1)  # the first advance
    return statements(lambda: run_jobs_inline(queues=[QUEUE]))


def plain_statements(jobs: int) -> int:
    """The statements of ``jobs`` plain jobs that do nothing, on the same queue, in
    one batch as a map's item jobs are (on SQLite what follows a batch's job's end
    is a statement of its own)."""
    sub = JobSubmission.create("itemrecords.plain", {}, queue=QUEUE)
    submit_batch(SCOPE, f"plain-{jobs}", [(f"plain-{jobs}-{n}", sub) for n in range(jobs)])
    return statements(lambda: run_jobs_inline(queues=[QUEUE]))


def test_an_item_that_succeeds_costs_no_statement_beyond_its_jobs_own():
    # Before, each item also counted its try on its row, read its map's item count,
    # wrote its end on its row and asked whether any item was left: four more.
    per_item = (item_statements(30) - item_statements(10)) / 20
    per_job = (plain_statements(30) - plain_statements(10)) / 20
    assert per_item == per_job


def test_a_map_is_fanned_in_in_the_same_statements_whatever_its_size():
    def fan_in(items: int) -> int:
        item_statements(items)
        return statements(lambda: run_jobs_inline(queues=["default"]))

    assert fan_in(40) == fan_in(10)


def reads_of_items(sql: list[str]) -> list[str]:
    """Of ``sql``, the reads of a map's items, steps, runs and jobs batches."""
    tables = ('"workflows_workflowitem"', '"workflows_workflowstep"', '"workflows_workflowrun"')
    return [
        text
        for text in sql
        if text.lstrip().upper().startswith("SELECT")
        and (any(table in text for table in tables) or "jobs_batch" in text)
    ]


def test_the_advance_that_queues_a_maps_items_never_reads_them_back():
    # Before, it asked whether any had ended yet (three reads) before it waited.
    start_workflow(SCOPE, "queued", "itemrecords.map", {"items": 5})
    with CaptureQueriesContext(connection) as queries:
        run_jobs_inline(queues=["default"], max_attempts_run=1)
    assert WorkflowItem.objects.count() == 5
    reads = reads_of_items([query["sql"] for query in queries.captured_queries])
    assert not [text for text in reads if "workflowitem" in text or "jobs_batch" in text]


def test_the_statement_that_ends_a_maps_last_item_queues_its_runs_advance():
    # Before, it queued a job of its own, which read the map and its batch and
    # queued the advance: one more claim, two reads, a transaction and a finish.
    start_workflow(SCOPE, "woken", "itemrecords.map", {"items": 4})
    run_jobs_inline(queues=["default"], max_attempts_run=1)
    run_jobs_inline(queues=[QUEUE])
    queued = Job.objects.filter(status="queued")
    assert list(queued.values_list("scope_hash", "handler")) == [
        (advance_scope_hash(), ADVANCE_HANDLER)
    ]
    assert ":items:" in queued.get().job_id
    assert not Job.objects.filter(handler=ITEMS_ENDED_HANDLER).exists()
    run_jobs_inline(queues=["default"], max_attempts_run=1)  # that advance alone
    assert WorkflowScope(SCOPE).get("woken").output == [0, 1, 2, 3]


def as_an_older_version_staged(run_id: str) -> None:
    """Make the items' batch of run ``run_id``'s map what an older version staged: a
    ``then`` job of its own, in the run's scope, that wakes the run."""
    step = WorkflowStep.objects.get(run__run_id=run_id)
    updated = Batch.objects.filter(batch_id__startswith=f"wf-item:{step.run_id}.").update(
        then_scope_hash=None,
        then_job_id=None,
        then_handler=ITEMS_ENDED_HANDLER,
        then_payload_json=f'{{"step": {step.pk}}}',
    )
    assert updated == 1


def test_an_older_versions_job_after_a_maps_items_wakes_its_run_after_two_reads():
    start_workflow(SCOPE, "older", "itemrecords.map", {"items": 4})
    run_jobs_inline(queues=["default"], max_attempts_run=1)
    as_an_older_version_staged("older")
    run_jobs_inline(queues=[QUEUE])
    assert Job.objects.filter(handler=ITEMS_ENDED_HANDLER, status="queued").count() == 1
    with CaptureQueriesContext(connection) as queries:
        run_jobs_inline(queues=["default"], max_attempts_run=1)  # the then job alone
    assert Job.objects.get(handler=ITEMS_ENDED_HANDLER).status == "succeeded"
    assert len(reads_of_items([query["sql"] for query in queries.captured_queries])) == 2
    assert Job.objects.filter(job_id__contains=":items:", status="queued").count() == 1
    run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("older").output == [0, 1, 2, 3]


def transactions(queries: CaptureQueriesContext) -> list[list[str]]:
    """The statements of ``queries``, grouped by the transaction they ran in."""
    grouped: list[list[str]] = [[]]
    for query in queries.captured_queries:
        sql = query["sql"]
        if sql == "BEGIN":
            grouped.append([])
        grouped[-1].append(sql)
        if sql == "COMMIT":
            grouped.append([])
    return [statements for statements in grouped if statements]


def test_what_a_map_writes_that_is_read_again_commits_unflushed(pg_only: None) -> None:
    """PostgreSQL: the map's checkpoint with its items and their jobs, and the fan-in,
    do not wait for the disk (lost in a crash of the server, each is made again from
    rows already durable, and the advance's next durable commit flushes them first).
    The run's advance after the items is inserted by the last item job's own finish,
    which waits for it (a handler's last write must: a worker that finishes a job
    after an outage does not run it again). The run's end, whose output only the run
    holds, waits too."""
    start_workflow(SCOPE, "unflushed", "itemrecords.map", {"items": 3})
    with CaptureQueriesContext(connection) as first:
        run_jobs_inline(queues=["default"], max_attempts_run=1)
    run_jobs_inline(queues=[QUEUE])
    with CaptureQueriesContext(connection) as last:
        run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("unflushed").output == [0, 1, 2]  # type: ignore[union-attr]
    unflushed = "set_config('synchronous_commit', 'off', true)"

    def the_one(queries: CaptureQueriesContext, text: str) -> list[str]:
        """The one transaction of ``queries`` (but the jobs' own finishes) with a
        statement that holds ``text``."""
        found = [
            sql
            for sql in transactions(queries)
            if any(text in line for line in sql)
            and not any(line.startswith("WITH done") for line in sql)
        ]
        assert len(found) == 1, (text, found)
        return found[0]

    items = the_one(first, 'INSERT INTO "workflows_workflowitem"')
    fan_in = the_one(last, 'UPDATE "workflows_workflowitem" SET "status"')
    end = the_one(last, 'UPDATE "workflows_workflowrun" SET "status" = \'succeeded\'')
    assert [unflushed in " ".join(sql) for sql in (items, fan_in, end)] == [True, True, False]


def test_the_picture_counts_items_as_their_jobs_stand_until_the_fan_in():
    start_workflow(SCOPE, "picture", "itemrecords.map", {"items": 3})
    run_jobs_inline(queues=["default"], max_attempts_run=1)
    run_jobs_inline(queues=[QUEUE], max_attempts_run=2)
    # Two items' jobs recorded them; their rows wait for the fan-in.
    assert list(WorkflowItem.objects.values_list("status", flat=True)) == ["running"] * 3
    step = WorkflowScope(SCOPE).get("picture").step("same")
    assert step.items is not None
    assert (step.items.succeeded, step.items.running) == (2, 1)

    run_jobs_inline(queues=[QUEUE])  # the last one: its finish queues the advance
    assert Job.objects.filter(job_id__contains=":items:", status="queued").count() == 1
    run_jobs_inline(queues=["default"])
    snap = WorkflowScope(SCOPE).get("picture")
    assert snap.output == [0, 1, 2]
    assert snap.step("same").status == StepStatus.SUCCEEDED
    assert snap.step("same").items.succeeded == 3
    assert list(WorkflowItem.objects.values_list("status", flat=True)) == ["succeeded"] * 3
    # Each item's try, counted by its job alone, is on its row after the fan-in.
    assert list(WorkflowItem.objects.values_list("attempts", flat=True)) == [1] * 3


def fail_for_good_on_an_outage(job: Job) -> None:
    """``job``'s tries spent on an outage: it ends Failed, and its worker tells."""
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="w")
    assert claim is not None
    outcome = execution.fail(claim.token, "OperationalError: the database went away")
    assert outcome is FinishOutcome.FAILED
    assert not Job.objects.filter(status="queued").exists()
    finished_attempt(claim, outcome, retry_scheduled=False)  # as the worker does


def test_the_advance_after_a_maps_items_failing_for_good_before_its_take_wakes_it_again():
    start_workflow(SCOPE, "wake-fails", "itemrecords.map", {"items": 2})
    run_jobs_inline(queues=["default"], max_attempts_run=1)
    run_jobs_inline(queues=[QUEUE])
    fail_for_good_on_an_outage(Job.objects.get(job_id__contains=":items:", status="queued"))
    run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("wake-fails").output == [0, 1]


def test_an_older_versions_job_that_wakes_the_run_failing_for_good_still_wakes_it():
    start_workflow(SCOPE, "then-fails", "itemrecords.map", {"items": 2})
    run_jobs_inline(queues=["default"], max_attempts_run=1)
    as_an_older_version_staged("then-fails")
    run_jobs_inline(queues=[QUEUE])
    fail_for_good_on_an_outage(Job.objects.get(handler=ITEMS_ENDED_HANDLER))
    run_jobs_inline(queues=["default"])
    assert WorkflowScope(SCOPE).get("then-fails").output == [0, 1]
