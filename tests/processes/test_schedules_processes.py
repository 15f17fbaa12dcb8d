"""Schedules with real ``run_jobs`` processes: the scheduler thread sleeps until the next
period and enqueues it (counted statement by statement: no polling in between), a
SIGKILL between enqueueing a period and recording it loses and doubles nothing, and
``--burst`` runs what is due at its start — on SQLite and PostgreSQL.

The test project declares its schedules only when ``TIMETABLE`` asks for them
(testproject/timetable/tasks.py), and logs every statement of a worker with
``STATEMENT_LOG`` (testproject/timetable/statements.py)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest

from jobs import JobStatus, execution, periodic
from jobs.schedules import store as schedule_store
from jobs.schedules.timetable import job_id_time
from tests.processes import test_worker_processes
from tests.support.procs import wait_until
from tests.support.schedules import period_jobs, row, schedules  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("schedules"),
    pytest.mark.slow,
]

PERIODIC = execution.reserved_scope("periodic")

worker_processes = test_worker_processes.workers  # a fixture: run_jobs processes


def succeeded(name: str) -> list[str]:
    return [
        job_id
        for job_id in period_jobs(name)
        if (snap := PERIODIC.get(job_id)) is not None and snap.status == JobStatus.SUCCEEDED
    ]


def period_of(job_id: str) -> datetime:
    return datetime.strptime(job_id.partition("@")[2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def test_the_worker_sleeps_until_each_period_and_enqueues_it_without_polling(
    worker_processes, tmp_path
):
    log = tmp_path / "statements.log"
    worker = worker_processes(
        "--worker-id",
        "ticker",
        env={
            "TIMETABLE": "tick",
            "TIMETABLE_EVERY": "2",
            "STATEMENT_LOG": str(log),
            # Nothing else to notice: only the periods wake the scheduler.
            "JOBS_SCHEDULE_REFRESH_SECONDS": "3600",
            # Prepared statements run on the raw connection, past the statement log
            # (testproject/timetable/statements.py): this test counts every one.
            "JOBS_PREPARED_STATEMENTS": "false",
        },
    )
    wait_until(lambda: len(succeeded("tick")) >= 3, 60, "three periods run", worker)
    worker.kill()  # how it stops does not matter here (SIGTERM is the worker tests' subject)

    jobs = period_jobs("tick")
    for job_id in jobs:
        snap = PERIODIC.get(job_id)
        assert snap is not None
        assert snap.created_at >= period_of(job_id)  # never before its period
        assert snap.initial_not_before == period_of(job_id)
    periods = [period_of(job_id) for job_id in jobs]
    assert periods == [periods[0] + timedelta(seconds=2 * n) for n in range(len(periods))]

    # The scheduler thread's statements, in order: a pass is one read of the schedule
    # rows; a pass that enqueues follows it with the jobs' insert.
    statements = [
        line.split("\t")[2]
        for line in log.read_text().splitlines()
        if line.split("\t")[1] == "jobs-scheduler"
    ]
    passes: list[list[str]] = []
    for sql in statements:
        if sql.startswith("SELECT") and '"jobs_schedule"' in sql and '"name" IN' in sql:
            passes.append([])
        elif passes:
            passes[-1].append(sql)
    enqueuing = [
        p for p in passes if any(s.startswith(("INSERT INTO jobs_job", "WITH")) for s in p)
    ]
    idle = [p for p in passes if p not in enqueuing]
    assert len(enqueuing) == len(jobs)  # one pass per period, each enqueueing it
    # Besides the start-up sync's read and the first pass (before the first period),
    # not one wake-up without a period to enqueue: the thread slept, it did not poll.
    assert len(idle) <= 2, passes
    assert all(p == [] for p in idle)  # and a pass with nothing due writes nothing


def test_sigkill_between_enqueue_and_state_update_loses_no_period_and_doubles_none(
    worker_processes,
):
    env = {"TIMETABLE": "tick", "TIMETABLE_EVERY": "1", "TIMETABLE_CATCH_UP": "all"}
    victim = worker_processes(
        "--worker-id", "victim", env={**env, "JOBS_FAULT": "jobs.schedules.enqueued@2:kill"}
    )
    assert victim.wait() == -signal.SIGKILL
    # Killed after the second period's job committed, before the schedule recorded it.
    killed_at = row("tick").next_run_at
    assert period_jobs("tick")[-1] == f"tick@{job_id_time(killed_at)}"
    assert row("tick").last_period == killed_at - timedelta(seconds=1)

    survivor = worker_processes("--worker-id", "survivor", env=env)
    wait_until(
        lambda: (
            row("tick").last_period is not None
            and row("tick").last_period >= killed_at + timedelta(seconds=3)
        ),
        60,
        "the restarted worker to go on past the killed period",
        survivor,
    )
    survivor.kill()

    jobs = period_jobs("tick")
    periods = [period_of(job_id) for job_id in jobs]
    # catch_up="all": every period from the first one on has exactly one job (the
    # job identity makes doubling impossible; a gap would be a lost period).
    assert periods == [periods[0] + timedelta(seconds=n) for n in range(len(periods))]
    assert killed_at in periods
    # The survivor was killed too, at any point: its last period's job may be there
    # without the schedule recording it yet — harmless, as the next pass shows.
    assert row("tick").last_period in periods[-2:]
    periodic(timedelta(seconds=1), name="tick", handler="timetable.tick", catch_up="all")
    again = execution.enqueue_due_schedules(now=periods[-1] + timedelta(milliseconds=500))
    assert all(not job.created for job in again)
    assert period_jobs("tick") == jobs
    assert row("tick").last_period == periods[-1]


def test_burst_runs_what_is_due_at_its_start(worker_processes):
    # A schedule every minute, last seen an hour ago: its latest period is due.
    spec = periodic(timedelta(minutes=1), name="tick", handler="timetable.tick")
    schedule_store.create_missing([spec], now=datetime.now(UTC) - timedelta(hours=1))
    worker = worker_processes(
        "--burst", env={"TIMETABLE": "tick", "TIMETABLE_EVERY": "60", "JOBS_POLL_INTERVAL": "0.2"}
    )
    assert worker.wait() == 0
    (job_id,) = period_jobs("tick")
    snap = PERIODIC.get(job_id)
    assert snap is not None
    assert snap.status == JobStatus.SUCCEEDED
    assert snap.result_ref == job_id
    assert "schedule enqueued " + job_id in worker.output


def test_the_scheduler_setting_turns_it_off(worker_processes):
    spec = periodic(timedelta(minutes=1), name="tick", handler="timetable.tick")
    schedule_store.create_missing([spec], now=datetime.now(UTC) - timedelta(hours=1))
    worker = worker_processes(
        "--burst",
        env={"TIMETABLE": "tick", "TIMETABLE_EVERY": "60", "JOBS_SCHEDULER": "false"},
    )
    assert worker.wait() == 0
    assert period_jobs("tick") == []
