"""The upkeep's pass over items whose job ended unheard reads the Running items and
their jobs as one set, in one bounded statement: each item is joined to its job
through the jobs' identity index (scope hash, job id), never looked up on its own
by a subquery per item (four of them, each ordered by the jobs' creation time,
which let the planner walk a scope's jobs in that order for every item)."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import execution
from jobs.models import Job
from tests.support.factories import write_job_rows
from workflows import StepStatus, start_workflow, store
from workflows.engine import Advanced, advance
from workflows.models import WorkflowItem, WorkflowRun, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-upkeep-reads"


def open_map(run_id: str, items: int) -> list[Job]:
    """A run whose map's ``items`` item jobs are queued (its first advance ran; no
    item job ran)."""
    start_workflow(SCOPE, run_id, "checks.fanout", {"items": list(range(items))})
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    assert advance(pk) is Advanced.WAITING
    jobs = Job.objects.filter(job_id__startswith=f"{store.ITEM_JOB_PREFIX}{pk}.")
    return list(jobs.exclude(handler=store.ITEMS_ENDED_HANDLER).order_by("pk"))


def end_unheard(job: Job) -> None:
    """``job`` fails for good, and no one hears of it (no ``attempt_finished``)."""
    claim = execution.try_start(job.scope_hash, job.job_id, worker_id="w")
    assert claim is not None
    execution.fail(claim.token, "RuntimeError: lost", retry_at=None)


def pass_statements() -> tuple[int, list[str]]:
    """One pass over the items of ended jobs: how many it ended, and its statements."""
    with CaptureQueriesContext(connection) as queries:
        ended = store.end_items_of_ended_jobs(timezone.now())
    return ended, [query["sql"] for query in queries.captured_queries]


def test_a_pass_reads_the_items_and_their_jobs_in_one_statement_however_many():
    open_map("few", 5)
    ended, few = pass_statements()
    assert ended == 0
    jobs = open_map("many", 50)
    ended, many = pass_statements()
    assert ended == 0
    assert len(few) == len(many) == 1, many
    end_unheard(jobs[7])
    ended, statements = pass_statements()
    assert ended == 1
    assert statements[0] == many[0]  # the one read, then the item's own end
    (item,) = WorkflowItem.objects.filter(job_id=jobs[7].job_id)
    assert (item.status, item.error_type) == (StepStatus.FAILED, "ActivityJobEnded")
    assert item.error.endswith("RuntimeError: lost")
    assert pass_statements()[0] == 0  # nothing left to end


def test_a_pass_is_bounded():
    jobs = open_map("bounded", 6)
    for job in jobs[:5]:
        end_unheard(job)
    now = timezone.now()
    assert store.end_items_of_ended_jobs(now, limit=2) == 2
    assert store.end_items_of_ended_jobs(now, limit=2) == 2
    assert store.end_items_of_ended_jobs(now, limit=2) == 1
    assert store.end_items_of_ended_jobs(now, limit=2) == 0
    running = WorkflowItem.objects.filter(status=StepStatus.RUNNING)
    assert list(running.values_list("job_id", flat=True)) == [jobs[5].job_id]


def test_a_job_of_another_scope_ends_no_item():
    (job,) = open_map("scoped", 1)
    end_unheard(job)
    now = timezone.now()
    assert store.end_items_of_ended_jobs(now, job=("b" * 64, job.job_id)) == 0
    assert store.end_items_of_ended_jobs(now, job=(job.scope_hash, "not-an-item")) == 0
    assert store.end_items_of_ended_jobs(now, job=(job.scope_hash, job.job_id)) == 1


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgres_only
def test_the_pass_reads_each_items_job_through_the_jobs_identity_index():
    """The statement a pass runs, asked how PostgreSQL would run it beside a history
    of the scope's jobs: the Running items through their partial index, each one's
    job through the jobs' identity index, and no subquery run per item for each of
    its job's columns. Sequential scans are turned off for the question, as the
    claim's index tests do: what must hold is that the indexes can serve it at all,
    whatever the statistics say today."""
    jobs = open_map("planned", 20)
    write_job_rows(3000, "history", scope_hash=jobs[0].scope_hash, status="succeeded")
    _, (statement,) = pass_statements()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = explain(statement)
    assert "jobs_job_identity" in plan, plan
    assert "workflows_item_running" in plan, plan
    assert "SubPlan" not in plan, plan


def copy_as_history(job: Job, count: int) -> str:
    """An ``INSERT`` that writes ``count`` Succeeded copies of ``job`` (ids
    ``history-{n}``, in no batch): a long history of its scope, in one statement."""
    q = connection.ops.quote_name
    replaced = {
        "job_id": "'history-' || n",
        "status": "'succeeded'",
        "finished_at": "now()",
        "batch_id": "NULL",
    }
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    picked = ", ".join(replaced.get(column, q(column)) for column in columns)
    return (
        f"INSERT INTO {q(Job._meta.db_table)} ({', '.join(q(c) for c in columns)})"
        f" SELECT {picked} FROM {q(Job._meta.db_table)}, generate_series(1, {count}) AS n"
        f" WHERE {q('id')} = {job.pk}"
    )


@pytest.mark.postgres_only
def test_statistics_lagging_behind_the_jobs_table_do_not_make_the_pass_scan_it():
    """The jobs' statistics taken while a map's 2,000 item jobs were all Queued,
    then 30,000 finished jobs written that no ANALYZE has seen (autovacuum is kept
    from it by the lock ANALYZE takes, held to the end of the transaction): the
    planner takes finished jobs for rare. A plain join of the items to their jobs
    then read every job of the scope (through its index of creation times), a cost
    that grows with the history, not with the items; the pass reads each item's job
    by its identity, as many probes as Running items."""
    jobs = open_map("lagging", 2000)
    _, (statement,) = pass_statements()
    with transaction.atomic(), connection.cursor() as cursor:
        for model in (Job, WorkflowItem, WorkflowStep, WorkflowRun):
            cursor.execute(f"LOCK TABLE {model._meta.db_table} IN SHARE UPDATE EXCLUSIVE MODE")
            cursor.execute(f"ANALYZE {model._meta.db_table}")
        cursor.execute(copy_as_history(jobs[0], 30_000))
        plan = explain(statement)
    assert "jobs_job_identity" in plan, plan
    # Before: a bitmap scan of every job of the scope (jobs_job_scope_created_idx).
    other_reads = r"(?:on|using) jobs_job_(?!identity\b)\w+|Seq Scan on jobs_job\b"
    assert not re.search(other_reads, plan), plan
