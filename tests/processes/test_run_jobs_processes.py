"""``run_jobs --processes N`` with real processes, on SQLite and PostgreSQL: one
supervisor runs N workers, each with its own id and registry row; SIGTERM stops them
all gracefully and loses no job; a child killed with SIGKILL is logged and started
again under the same id (which recovers its attempts at once); ``--burst`` exits once
nothing is due. Every wait is for a row or an output line, never a sleep."""

from __future__ import annotations

import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from jobs import JobStatus, JobSubmission, submit_job
from jobs.models import Job, JobAttempt
from jobs.observability.models import WorkerRecord
from jobs.supervisor import MAX_PROCESSES
from jobs.types import AttemptStatus
from tests.support.procs import ManageProcess, WorkerProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "supervised"
#: Leases far longer than any test: only a restarted child's recovery of its own
#: attempts can take a killed child's work back.
LONG_LEASES = {"JOBS_LEASE_SECONDS": "60", "JOBS_HEARTBEAT_SECONDS": "5"}
ENV = {**LONG_LEASES, "JOBS_POLL_INTERVAL": "0.2"}


@pytest.fixture
def supervisor(tmp_path: Path):
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, "--worker-id", "sup", *args, env=ENV)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.signal(signal.SIGTERM)
            proc.wait(60)
        proc.close()


def _held_jobs(tmp_path: Path, count: int) -> Path:
    """``count`` jobs whose handlers wait until the returned file exists."""
    gate = tmp_path / "gate"
    for n in range(count):
        started = tmp_path / f"started-{n}"
        payload = {"n": n, "hold_file": str(gate), "started_file": str(started)}
        submit_job(SCOPE, f"job-{n}", JobSubmission.create("test.record", payload, max_attempts=3))
    return gate


def _running(worker_id: str) -> int:
    return JobAttempt.objects.filter(worker_id=worker_id, status=AttemptStatus.RUNNING).count()


def _statuses() -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Job.objects.values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def _both_children_full(proc: WorkerProcess, gate: Path) -> None:
    """Until each child runs two jobs — their handlers started, not only claimed: a
    claim whose handler has not started is given back at a graceful shutdown — and has
    its registry row (written by a thread of its own once the database answered, so
    not necessarily before its first claim)."""
    for worker_id in ("sup-1", "sup-2"):
        wait_until(lambda w=worker_id: _running(w) == 2, 90, f"{worker_id} to run 2 jobs", proc)
        wait_until(
            lambda w=worker_id: WorkerRecord.objects.filter(kind="worker", engine_id=w).exists(),
            90,
            f"{worker_id}'s registry row",
            proc,
        )
    started = gate.parent
    wait_until(lambda: len(list(started.glob("started-*"))) >= 4, 90, "4 handlers", proc)


def test_each_child_runs_jobs_under_its_own_id_and_registry_row(supervisor, tmp_path):
    gate = _held_jobs(tmp_path, 12)
    proc = supervisor("--processes", "2", "--concurrency", "2")
    _both_children_full(proc, gate)
    rows = {r.engine_id: r for r in WorkerRecord.objects.filter(kind="worker")}
    assert set(rows) == {"sup-1", "sup-2"}
    assert rows["sup-1"].pid != rows["sup-2"].pid
    assert proc.pid not in {rows["sup-1"].pid, rows["sup-2"].pid}
    assert {r.concurrency for r in rows.values()} == {2}

    gate.touch()
    wait_until(lambda: _statuses() == {JobStatus.SUCCEEDED: 12}, 90, "every job done", proc)
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output
    assert "supervisor sup stopped: 2 processes started, 0 restarted" in proc.output
    assert not WorkerRecord.objects.filter(kind="worker").exists()  # each child removed its row


def test_sigterm_stops_every_child_gracefully_and_loses_no_job(supervisor, tmp_path):
    gate = _held_jobs(tmp_path, 10)
    proc = supervisor("--processes", "2", "--concurrency", "2", "--shutdown-timeout", "60")
    _both_children_full(proc, gate)
    proc.signal(signal.SIGTERM)
    for worker_id in ("sup-1", "sup-2"):
        proc.wait_for_output(f"worker {worker_id}: SIGTERM, stopping gracefully", 60)
    # Stopping gracefully: the four running handlers are let finish, nothing new starts.
    gate.touch()
    assert proc.wait(90) == 0, proc.output
    assert _statuses() == {JobStatus.SUCCEEDED: 4, JobStatus.QUEUED: 6}
    assert not JobAttempt.objects.exclude(status=AttemptStatus.SUCCEEDED).exists()
    assert "restarting" not in proc.output


def test_a_second_sigterm_cancels_every_childs_handlers_and_requeues_them(supervisor, tmp_path):
    gate = _held_jobs(tmp_path, 10)  # the gate never opens: only a cancellation ends them
    proc = supervisor("--processes", "2", "--concurrency", "2", "--shutdown-timeout", "600")
    _both_children_full(proc, gate)
    proc.signal(signal.SIGTERM)
    for worker_id in ("sup-1", "sup-2"):
        proc.wait_for_output(f"worker {worker_id}: SIGTERM, stopping gracefully", 60)
    proc.signal(signal.SIGTERM)
    assert proc.wait(90) == 0, proc.output
    for worker_id in ("sup-1", "sup-2"):
        assert f"worker {worker_id}: SIGTERM, cancelling running handlers now" in proc.output
    # Nothing lost: the four cancelled attempts' jobs are queued again with the rest.
    assert _statuses() == {JobStatus.QUEUED: 10}
    assert not JobAttempt.objects.filter(status=AttemptStatus.RUNNING).exists()
    assert JobAttempt.objects.count() == 4


def test_a_child_killed_with_sigkill_is_logged_and_restarted_under_its_id(supervisor, tmp_path):
    gate = _held_jobs(tmp_path, 10)
    proc = supervisor("--processes", "2", "--concurrency", "2")
    _both_children_full(proc, gate)
    victim = WorkerRecord.objects.get(kind="worker", engine_id="sup-1").pid
    os.kill(victim, signal.SIGKILL)
    proc.wait_for_output(f"worker sup-1 (pid {victim}) killed by SIGKILL; restarting in", 60)
    wait_until(
        lambda: WorkerRecord.objects.filter(engine_id="sup-1").exclude(pid=victim).exists(),
        90,
        "sup-1 to be back with a new process",
        proc,
    )
    gate.touch()
    wait_until(lambda: _statuses() == {JobStatus.SUCCEEDED: 10}, 90, "every job done", proc)
    # The restart took back the killed child's two attempts at once (the leases run
    # for a minute): they are interrupted, their jobs ran again and succeeded.
    interrupted = JobAttempt.objects.filter(worker_id="sup-1", status=AttemptStatus.INTERRUPTED)
    assert interrupted.count() == 2
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output
    assert "3 processes started, 1 restarted" in proc.output


def test_burst_with_processes_exits_once_nothing_is_due(supervisor):
    for n in range(30):
        submit_job(SCOPE, f"burst-{n}", JobSubmission.create("test.record", {"n": n}))
    proc = supervisor("--processes", "2", "--concurrency", "2", "--burst")
    assert proc.wait(120) == 0, proc.output
    assert _statuses() == {JobStatus.SUCCEEDED: 30}
    assert "2 processes started, 0 restarted" in proc.output


def test_one_metrics_port_counts_every_child(supervisor):
    for n in range(20):
        submit_job(SCOPE, f"m-{n}", JobSubmission.create("test.record", {"n": n}, queue="m"))
    proc = supervisor("--processes", "2", "--metrics-port", "0", "--queue", "m")
    found = wait_until(
        lambda: re.search(r"metrics on http://0\.0\.0\.0:(\d+)/metrics", proc.output),
        60,
        "the metrics address",
        proc,
    )
    url = f"http://127.0.0.1:{found.group(1)}/metrics"
    finished = 'ledon_jobs_finished_total{handler="test.record",outcome="succeeded",queue="m"}'

    live = 'ledon_workers{kind="worker",state="live"} 2.0'

    def scraped() -> str | None:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return text if f"{finished} 20.0" in text and live in text else None

    wait_until(lambda: _statuses() == {JobStatus.SUCCEEDED: 20}, 90, "every job done", proc)
    text = wait_until(scraped, 60, "20 succeeded jobs in one scrape", proc)
    # Whichever child ran a job, it counted into the one port, beside the database
    # gauges read once (the supervisor is no worker: two live, not three).
    assert set(JobAttempt.objects.values_list("worker_id", flat=True)) <= {"sup-1", "sup-2"}
    assert text.count("# TYPE ledon_jobs_queued gauge") == 1


def test_a_killed_supervisor_leaves_no_worker_behind(supervisor, tmp_path):
    gate = _held_jobs(tmp_path, 4)
    proc = supervisor("--processes", "2", "--concurrency", "2", "--shutdown-timeout", "60")
    _both_children_full(proc, gate)
    pids = list(WorkerRecord.objects.filter(kind="worker").values_list("pid", flat=True))
    proc.kill()
    gate.touch()
    # Orphaned, each child stops gracefully: its handlers finish, its row goes.
    wait_until(lambda: _statuses() == {JobStatus.SUCCEEDED: 4}, 90, "the held jobs to finish")
    wait_until(lambda: not WorkerRecord.objects.filter(kind="worker").exists(), 90, "rows gone")
    for pid in pids:
        wait_until(lambda p=pid: not _alive(p), 30, f"worker pid {pid} to exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("processes", ["0", "-1", str(MAX_PROCESSES + 1)])
def test_processes_out_of_bounds_is_refused_before_anything_starts(processes):
    with pytest.raises(CommandError, match="--processes must be between 1 and"):
        call_command("run_jobs", "--processes", processes)
    assert not WorkerRecord.objects.exists()


def test_a_worker_id_too_long_for_its_childrens_ids_is_refused():
    from jobs.validation import MAX_NAME_LENGTH

    longest = "w" * MAX_NAME_LENGTH  # valid alone; "<id>-2" is not
    with pytest.raises(CommandError, match="worker id"):
        call_command("run_jobs", "--processes", "2", "--worker-id", longest)


def test_children_that_refuse_to_start_are_not_restarted(tmp_path):
    """A database without the tables: each child says so and exits; the supervisor
    does not restart them in a loop, and fails with status 1."""
    empty = f"sqlite:///{tmp_path / 'not-migrated.sqlite3'}"
    argv = ("--processes", "2", "--worker-id", "sup")
    proc = ManageProcess(tmp_path, "run_jobs", *argv, database=empty)
    try:
        assert proc.wait(90) == 1, proc.output
        assert proc.output.count("Run 'python manage.py migrate'") == 2
        assert "a worker refused to start" in proc.output
        assert "; restarting in" not in proc.output
        assert proc.output.count("refused to start; not restarting it") == 2
    finally:
        proc.close()
