"""Retention of finished jobs: ``purge_finished``, the worker's clean-up, ``purge_jobs``."""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from jobs import JobStatus, execution
from jobs.conf import jobs_settings
from jobs.exceptions import InvalidInput, JobsConfigurationError
from jobs.models import Job, JobAttempt
from jobs.store import sql
from jobs.worker import Worker
from tests.support.factories import write_job_rows
from tests.support.procs import database_url

DAY = timedelta(days=1)


def age(make_job, job_id: str, finished: timedelta) -> None:
    """Move a finished job's end into the past (as time passing would)."""
    Job.objects.filter(pk=make_job.row(job_id).pk).update(finished_at=timezone.now() - finished)


def history(make_job) -> None:
    """Four old finished jobs (one per finished state), a recent one, and live ones."""
    for n, status in enumerate(
        (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)
    ):
        make_job.finished(status, f"old-{n}")
        age(make_job, f"old-{n}", 10 * DAY)
    make_job.finished(JobStatus.SUCCEEDED, "recent")
    make_job.queued("queued")
    make_job.running("running")


def remaining() -> set[str]:
    return set(Job.objects.values_list("job_id", flat=True))


@pytest.mark.django_db
class TestPurgeFinished:
    def test_deletes_old_finished_jobs_with_their_attempts_only(self, make_job) -> None:
        history(make_job)
        old_ids = [make_job.row(f"old-{n}").pk for n in range(4)]
        assert execution.purge_finished(older_than=timezone.now() - DAY) == 4
        assert remaining() == {"recent", "queued", "running"}
        assert not JobAttempt.objects.filter(job_id__in=old_ids).exists()
        assert JobAttempt.objects.count() == 2  # the recent job's and the running one's

    def test_oldest_first_in_batches_of_the_limit(self, make_job) -> None:
        for n in range(5):
            make_job.finished(JobStatus.SUCCEEDED, f"old-{n}")
            age(make_job, f"old-{n}", (10 - n) * DAY)
        cutoff = timezone.now() - DAY
        assert execution.purge_finished(older_than=cutoff, limit=2) == 2
        assert remaining() == {"old-2", "old-3", "old-4"}
        assert execution.purge_finished(older_than=cutoff, limit=2) == 2
        assert execution.purge_finished(older_than=cutoff, limit=2) == 1
        assert execution.purge_finished(older_than=cutoff, limit=2) == 0
        assert remaining() == set()

    def test_a_retried_job_is_no_longer_finished_and_stays(self, make_job, scope) -> None:
        make_job.finished(JobStatus.FAILED, "job-1", max_attempts=2)
        age(make_job, "job-1", 10 * DAY)
        scope.retry("job-1")
        assert execution.purge_finished(older_than=timezone.now()) == 0
        assert len(make_job.attempts("job-1")) == 1

    @pytest.mark.parametrize(
        ("older_than", "limit"),
        [(datetime(2020, 1, 1), 10), ("yesterday", 10), (timezone.now(), 0)],
    )
    def test_bad_input_is_a_typed_error_and_deletes_nothing(
        self, make_job, older_than, limit
    ) -> None:
        history(make_job)
        with pytest.raises(InvalidInput):
            execution.purge_finished(older_than=older_than, limit=limit)
        assert len(remaining()) == 7


@pytest.mark.django_db
@pytest.mark.postgres_only
def test_reads_the_index_of_finished_jobs() -> None:
    now = timezone.now()
    write_job_rows(
        3000,
        "old",
        status=JobStatus.SUCCEEDED,
        attempt_count=1,
        finished_at=lambda n: now - timedelta(seconds=n),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"EXPLAIN {sql.oldest_finished(connection.vendor)}",
            {"older_than": now - timedelta(seconds=2900), "limit": 1000},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobs_job_finished_idx" in plan, plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres_only
def test_skips_a_job_another_transaction_holds(make_job) -> None:
    """A retry (or any transition) under way holds the job's row: the purge leaves the
    job, with its attempts, to a later run instead of waiting or deleting under it."""
    history(make_job)
    held = make_job.row("old-0").pk
    with psycopg.connect(database_url()) as other:
        other.execute(f"SELECT 1 FROM {Job._meta.db_table} WHERE id = %s FOR UPDATE", [held])
        assert execution.purge_finished(older_than=timezone.now() - DAY) == 3
    assert remaining() == {"old-0", "recent", "queued", "running"}
    assert JobAttempt.objects.filter(job_id=held).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_worker_cleans_up_past_the_retention(make_job, settings) -> None:
    settings.JOBS = {**settings.JOBS, "RETENTION_SECONDS": 3 * 86_400}
    history(make_job)
    events: list[str] = []
    worker = Worker(
        burst=True, listen=False, on_event=lambda event, claim, detail: events.append(event)
    )
    worker.run()
    assert worker.stats.purged == 4
    assert "purged" in events
    # The burst also ran the queued job; nothing recent was deleted.
    assert {"recent", "queued"} <= remaining()
    assert not any(job_id.startswith("old-") for job_id in remaining())


@pytest.mark.django_db(transaction=True)
def test_retention_is_on_by_default_for_fourteen_days(make_job) -> None:
    assert jobs_settings().RETENTION_SECONDS == 14 * 86_400
    history(make_job)  # finished ten days ago: kept
    age(make_job, "old-0", 15 * DAY)
    worker = Worker(burst=True, listen=False)
    worker.run()
    assert worker.stats.purged == 1
    assert "old-0" not in remaining()
    assert {"old-1", "old-2", "old-3", "recent"} <= remaining()


@pytest.mark.django_db(transaction=True)
def test_none_keeps_finished_jobs_for_ever(make_job, settings) -> None:
    settings.JOBS = {**settings.JOBS, "RETENTION_SECONDS": None}
    history(make_job)
    for n in range(4):
        age(make_job, f"old-{n}", 3650 * DAY)
    worker = Worker(burst=True, listen=False)
    worker.run()
    assert worker.stats.purged == 0
    assert {f"old-{n}" for n in range(4)} <= remaining()


@pytest.mark.django_db
class TestPurgeJobsCommand:
    def test_deletes_and_says_how_many(self, make_job, capsys) -> None:
        history(make_job)
        call_command("purge_jobs", "--older-than-days", "5", "--batch-size", "3")
        assert "deleted 4 finished job(s)" in capsys.readouterr().out
        assert remaining() == {"recent", "queued", "running"}

    def test_dry_run_counts_and_deletes_nothing(self, make_job, capsys) -> None:
        history(make_job)
        call_command("purge_jobs", "--older-than-days", "5", "--dry-run")
        assert "4 finished job(s)" in capsys.readouterr().out
        assert len(remaining()) == 7

    def test_falls_back_to_the_retention_setting(self, make_job, settings, capsys) -> None:
        settings.JOBS = {**settings.JOBS, "RETENTION_SECONDS": 86_400}
        history(make_job)
        call_command("purge_jobs")
        assert "deleted 4" in capsys.readouterr().out

    def test_without_an_argument_uses_the_default_retention(self, make_job, capsys) -> None:
        history(make_job)
        age(make_job, "old-2", 15 * DAY)
        call_command("purge_jobs")
        assert "deleted 1 finished job(s)" in capsys.readouterr().out
        assert "old-2" not in remaining()
        assert len(remaining()) == 6

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ([], "RETENTION_SECONDS"),
            (["--older-than-days", "0"], "positive"),
            (["--older-than-days", "1", "--batch-size", "0"], "batch-size"),
        ],
    )
    def test_bad_arguments_change_nothing(self, make_job, settings, args, message) -> None:
        settings.JOBS = {**settings.JOBS, "RETENTION_SECONDS": None}
        history(make_job)
        with pytest.raises(CommandError, match=message):
            call_command("purge_jobs", *args)
        assert len(remaining()) == 7


@pytest.mark.parametrize("value", [0, -5, "7d", True])
def test_retention_setting_is_none_or_positive(settings, value) -> None:
    settings.JOBS = {"RETENTION_SECONDS": value}
    with pytest.raises(JobsConfigurationError, match="RETENTION_SECONDS"):
        jobs_settings()
