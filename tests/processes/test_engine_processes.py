"""The engines as real processes at start-up and on signals — ``run_jobs``,
``dispatch_outbox``, ``recover_sagas`` (and ``consume_events`` where a broker client
is installed) — on SQLite and PostgreSQL:

- before ``migrate``: a clear error of two lines naming ``manage.py migrate``, exit
  status 1, no traceback — not a spin, not an exit 0;
- a database that is not there yet (unreachable; PostgreSQL only — a SQLite file
  cannot be down, and one that cannot be opened is refused by Django's own system
  checks before any engine starts): each engine says so once, waits with back-off,
  and runs normally as soon as it appears;
- SIGTERM sent at many points of the loop never hangs (each wait is bounded by the
  test); a second SIGTERM cancels running handlers at once, a third stops waiting.

Everything waits for output lines or database rows, never for a sleep."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from jobs import JobStatus, JobSubmission, submit_job
from jobs.models import Job
from jobs.types import AttemptStatus
from sagas import SagaStatus, start_saga
from sagas.models import SagaInstance
from testproject.orders.services import place_order
from tests.support.brokers import _conninfo
from tests.support.procs import ROOT, ManageProcess, database_url, manage, wait_until
from tests.support.sagas import order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

OUTBOX_ON = {"OUTBOX_ENABLED": "true"}
ERROR_LINE = re.compile(r"^\S+ \S+ ERROR ", re.MULTILINE)

#: How many times the SIGTERM soaks stop ``run_jobs`` (the outbox's and the sagas'
#: engines: two fifths of it each): 100 on the newest leg of the whole check, fewer on
#: the older ones (``LEDON_SOAK_RUNS``, set by scripts/test.sh), where the same
#: signal handling runs on another Python or Django and each run costs the same CPU.
SOAK_RUNS = int(os.environ.get("LEDON_SOAK_RUNS", "100"))

#: Short intervals everywhere: the loop turns over every millisecond or so.
TINY = {
    "JOBS_POLL_INTERVAL": "0.001",
    "JOBS_HEARTBEAT_SECONDS": "0.005",
    "JOBS_RECOVERY_INTERVAL": "0.005",
    "JOBS_LEASE_SECONDS": "5",
    "OUTBOX_POLL_INTERVAL": "0.001",
    "OUTBOX_RECOVERY_INTERVAL": "0.005",
    "SAGAS_POLL_INTERVAL": "0.001",
    "OUTBOX_ENABLED": "true",
}


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if ERROR_LINE.match(line)]


class Later:
    """A database beside the test database that does not exist until the test says
    so: a SQLite file in a folder not yet there, or a database not yet created on the
    test's PostgreSQL server. On PostgreSQL it can appear at once, already migrated
    (and seeded): it is prepared under another name and renamed."""

    def __init__(self, tmp_path: Path) -> None:
        base = database_url()
        self.sqlite = base.startswith("sqlite")
        tag = uuid.uuid4().hex[:10]
        if self.sqlite:
            self.folder = tmp_path / "later"
            self.url = f"sqlite:///{self.folder / 'db.sqlite3'}"
        else:
            self.name, self.staging_name = f"ledon_later_{tag}", f"ledon_staging_{tag}"
            parts = urlsplit(base)
            self.admin_url = base
            self.url = parts._replace(path=f"/{self.name}").geturl()
            self.staging_url = parts._replace(path=f"/{self.staging_name}").geturl()

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(_conninfo(self.admin_url), autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def create_empty(self) -> None:
        """The database answers, with no table at all (before ``migrate``)."""
        if self.sqlite:
            self.folder.mkdir()
        else:
            self._admin(f'CREATE DATABASE "{self.name}"')

    def appear(self, seed: str = "") -> None:
        """Migrate (and seed, with ``manage.py shell -c seed``) under the staging
        name, then give it its name: the engines find it complete or not at all."""
        assert not self.sqlite
        self._admin(f'CREATE DATABASE "{self.staging_name}"')
        manage(self.staging_url, "migrate", "-v", "0", env=OUTBOX_ON)
        if seed:
            manage(self.staging_url, "shell", "-c", seed, env=OUTBOX_ON)
        self._admin(f'ALTER DATABASE "{self.staging_name}" RENAME TO "{self.name}"')

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(_conninfo(self.url)) as conn:
            return list(conn.execute(query).fetchall())  # type: ignore[arg-type]

    def drop(self) -> None:
        if self.sqlite:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        for name in (self.name, self.staging_name):
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def later(tmp_path: Path) -> Iterator[Later]:
    db = Later(tmp_path)
    yield db
    db.drop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[ManageProcess] = []

    def start(
        command: str,
        *args: str,
        env: dict[str, str] | None = None,
        database: str | None = None,
        real: bool = False,
    ) -> ManageProcess:
        proc = ManageProcess(tmp_path, command, *args, env=env, database=database, real=real)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


# --------------------------------------------------------------------------- start-up

BEFORE_MIGRATE = [
    ("run_jobs", "--burst"),
    ("run_jobs",),
    ("dispatch_outbox", "--burst"),
    ("dispatch_outbox",),
    ("recover_sagas", "--burst"),
    ("recover_sagas",),
    ("consume_events", "--group", "billing"),
]


@pytest.mark.parametrize("command", BEFORE_MIGRATE, ids=" ".join)
def test_before_migrate_every_engine_stops_with_a_short_error_naming_migrate(command, later, spawn):
    env = dict(TINY)
    if command[0] == "consume_events":
        if importlib.util.find_spec("pika") is None:
            pytest.skip("consume_events needs a broker client (pip install '.[rabbitmq]')")
        # The broker is never reached: the database check comes first.
        env.update({"OUTBOX_TRANSPORT": "rabbitmq", "RABBITMQ_URL": "amqp://127.0.0.1:1/"})
    later.create_empty()
    proc = spawn(*command, env=env, database=later.url, real=True)  # start-up itself
    assert proc.wait(60) == 1, proc.output
    output = proc.output
    assert "Traceback" not in output
    assert "CommandError: database 'default' lacks the tables of the " in output
    assert "Run 'python manage.py migrate', then start the " in output
    assert len(output.strip().splitlines()) <= 3, output


@pytest.mark.postgres_only
def test_engines_started_before_their_database_exists_wait_for_it_then_work(later, spawn):
    """A worker, a dispatcher and a saga runner start while their database does not
    exist (connecting fails, as with a server that is down).
    Each logs one ERROR line and keeps trying; the database appears, migrated, with
    jobs, orders and sagas in it; every burst finishes the work and exits 0."""
    env = dict(TINY)
    procs = [  # start-up itself: fresh interpreters
        spawn("run_jobs", "--burst", "-v", "2", env=env, database=later.url, real=True),
        spawn("dispatch_outbox", "--burst", "-v", "2", env=env, database=later.url, real=True),
        spawn("recover_sagas", "--burst", "-v", "2", env=env, database=later.url, real=True),
    ]
    for proc in procs:
        proc.wait_for_output("database unreachable: connecting to database 'default' failed")
        assert proc.proc.poll() is None, proc.output
    later.appear(
        seed=(
            "from decimal import Decimal\n"
            "from jobs import JobSubmission, submit_job\n"
            "from sagas import start_saga\n"
            "from testproject.orders.services import place_order\n"
            "for n in range(3):\n"
            "    submit_job('later', f'job-{n}', JobSubmission.create('test.record', {}))\n"
            "    place_order(f'L-{n}', Decimal('1.00'))\n"
            f"    start_saga('fulfilment.order', {order()!r})\n"
        )
    )
    for proc in procs:
        assert proc.wait(120) == 0, proc.output
        assert len(error_lines(proc.output)) == 1, proc.output
        # One traceback (the error and the psycopg error it wraps), not one per attempt.
        assert proc.output.count("\ndjango.db.utils.OperationalError: ") == 1, proc.output
        assert "database reachable again after" in proc.output
    assert (
        later.rows("SELECT status FROM jobs_job WHERE job_id LIKE 'job-%'") == [("succeeded",)] * 3
    )
    assert (
        later.rows("SELECT status FROM outbox_outboxmessage WHERE event_type = 'orders.placed'")
        == [("sent",)] * 3
    )
    assert later.rows("SELECT status FROM sagas_sagainstance") == [("succeeded",)] * 3


# --------------------------------------------------------------------------- signals


class Soak(ManageProcess):
    """``tests/support/soak_signals.py COUNT COMMAND ARG …``: the command run COUNT times in
    one process (see that script)."""

    def argv(self, command: str, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, str(ROOT / "tests" / "support" / "soak_signals.py"), *args]


def soak(tmp_path: Path, count: int, command: str, *args: str, started: str) -> int:
    """Run ``command`` ``count`` times; SIGTERM each run once it printed ``started``
    and wait for its end. Returns the number of signals sent; fails (with the output)
    if a run does not end within 30 s of its signal."""
    proc = Soak(tmp_path, "soak", str(count), command, *args, env=TINY)
    try:
        for n in range(count):
            wait_until(
                lambda n=n: proc.output.count(started) > n or f"soak {n} raised" in proc.output,
                60,
                f"run {n} to start",
                proc,
            )
            assert f"soak {n} raised" not in proc.output, proc.output[-3000:]
            proc.signal(signal.SIGTERM)
            wait_until(
                lambda n=n: f"soak {n} end" in proc.output or proc.proc.poll() is not None,
                30,
                f"run {n} to end after its SIGTERM (a hang)",
                proc,
            )
            assert f"soak {n} end" in proc.output, proc.output[-3000:]
        assert proc.wait(30) == 0, proc.output[-3000:]
        return count
    finally:
        proc.close()


@pytest.mark.timeout(600)
def test_run_jobs_never_hangs_on_sigterm_at_any_point_of_its_loop(tmp_path):
    """``SOAK_RUNS`` runs of ``run_jobs`` with tiny intervals, each stopped by SIGTERM
    a few milliseconds into its loop — claiming, finishing, renewing leases,
    recovering, waiting for work, or shutting down. Before the fix the handler could
    deadlock on the lock of the Event the main thread was waiting on. (Every CI leg
    runs it on both databases.)"""
    for n in range(2 * SOAK_RUNS):
        submit_job("soak", f"job-{n}", JobSubmission.create("demo.report", {"month": str(n)}))
    sent = soak(
        tmp_path, SOAK_RUNS, "run_jobs", "--concurrency", "2", "--shutdown-timeout", "5",
        started="\nstarted queues=",
    )  # fmt: skip
    assert sent == SOAK_RUNS
    assert not Job.objects.filter(status=JobStatus.RUNNING).exists()


@pytest.mark.timeout(600)
def test_dispatch_outbox_and_recover_sagas_never_hang_on_sigterm(tmp_path, settings):
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    for n in range(120):
        place_order(f"S-{n:03}", 1 + n)
    for n in range(20):
        start_saga("fulfilment.order", order(order_id=n))
    runs = max(1, SOAK_RUNS * 2 // 5)
    assert soak(tmp_path, runs, "dispatch_outbox", "-v", "2", started="\nstarted transport") == runs
    assert soak(tmp_path, runs, "recover_sagas", started="\nstarted sagas:") == runs
    assert (
        not SagaInstance.objects.exclude(leased_by="")
        .filter(status__in=[SagaStatus.RUNNING, SagaStatus.COMPENSATING])
        .exists()
    )


def test_a_second_sigterm_cancels_running_handlers_at_once(spawn, tmp_path):
    """With a shutdown timeout of ten minutes, only the second signal can end the
    handler (which waits on its cancellation) within the test's bound. The grace after
    it is as long: the handler is given back because it stopped on the signal, not
    because it happened to stop within a few seconds."""
    hold, started = tmp_path / "never", tmp_path / "started"
    payload = {"hold_file": str(hold), "started_file": str(started), "obey_cancel": True}
    submit_job("esc", "long", JobSubmission.create("test.record", payload, max_attempts=3))
    env = {**TINY, "JOBS_SHUTDOWN_GRACE_SECONDS": "600"}
    worker = spawn("run_jobs", "--shutdown-timeout", "600", env=env)
    wait_until(started.exists, 60, "the handler to start", worker)
    worker.signal(signal.SIGTERM)
    worker.wait_for_output("SIGTERM, stopping gracefully")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
    assert "SIGTERM, cancelling running handlers now" in worker.output
    job = Job.objects.get(job_id="long")
    # It stopped on the shutdown's signal: given back, its attempt unused.
    assert (job.status, job.attempt_count) == (JobStatus.QUEUED, 0), worker.output
    assert list(job.attempts.values_list("status", flat=True)) == [AttemptStatus.RELEASED]


def test_a_third_sigterm_stops_waiting_for_a_handler_that_ignores_cancellation(spawn, tmp_path):
    hold, started = tmp_path / "never", tmp_path / "started"
    payload = {"hold_file": str(hold), "started_file": str(started), "obey_cancel": False}
    submit_job("esc", "deaf", JobSubmission.create("test.record", payload, max_attempts=3))
    env = {**TINY, "JOBS_SHUTDOWN_GRACE_SECONDS": "600"}
    worker = spawn("run_jobs", "--shutdown-timeout", "600", env=env)
    wait_until(started.exists, 60, "the handler to start", worker)
    for line in ("stopping gracefully", "cancelling running handlers now", "no more waiting"):
        worker.signal(signal.SIGTERM)
        worker.wait_for_output(f"SIGTERM, {line}")
    assert worker.wait(60) == 0, worker.output
    job = Job.objects.get(job_id="deaf")
    assert job.status == JobStatus.QUEUED, worker.output
    assert list(job.attempts.values_list("status", flat=True)) == [AttemptStatus.INTERRUPTED]


@pytest.mark.parametrize("obey", [True, False], ids=["step-stops", "step-ignores-cancel"])
def test_a_second_sigterm_cancels_a_saga_step_and_releases_the_instance(spawn, tmp_path, obey):
    """The step holds; the first SIGTERM waits for it (``stopping after the current
    step``). The second cancels it — the instance is released, not compensated; a
    step deaf to cancellation needs the third, which stops waiting for it. (The grace
    after the cancellation is ten minutes: only the step, or the third signal, ends
    the wait — never a busy machine's clock.)"""
    hold, started = tmp_path / "never", tmp_path / "started"
    hold_spec = {"step": "charge", "file": str(hold), "started_file": str(started)}
    state = start_saga("fulfilment.order", order(hold={**hold_spec, "obey_cancel": obey}))
    env = {**TINY, "SAGAS_STEP_TIMEOUT": "600", "SAGAS_CANCEL_GRACE_SECONDS": "600"}
    runner = spawn("recover_sagas", "-v", "2", env=env)
    wait_until(started.exists, 60, "the step to start", runner)
    lines = ["stopping after the current step", "cancelling the current step"]
    if not obey:
        lines.append("no more waiting for the step")
    for line in lines:
        runner.signal(signal.SIGTERM)
        runner.wait_for_output(f"SIGTERM, {line}")
    assert runner.wait(60) == 0, runner.output
    row = SagaInstance.objects.get(instance_id=state.instance_id)
    assert row.status == SagaStatus.RUNNING, runner.output
    assert row.leased_by == ""
    assert row.completed_steps == ["reserve"]
    assert row.compensated_steps == []
    assert row.takeovers == 0


def test_a_third_sigterm_ends_a_process_whose_main_thread_is_stuck(spawn, tmp_path, settings):
    """The dispatcher's main thread blocks for ever inside the transport (a fault
    point). Two signals cannot help; after the third, the process exits with status
    1 once ``run()`` has not returned for 10 s — the batch's lease then expires."""
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    place_order("STUCK-1", 10)
    marker = tmp_path / "blocked"
    fault = {"ORDERS_FAULT": f"outbox.in_process.delivered@1:block:{marker}"}
    dispatcher = spawn("dispatch_outbox", env={**TINY, **fault})
    wait_until(marker.exists, 60, "the dispatcher to block in its transport", dispatcher)
    for line in ("stopping after the current batch", "stopping after the current batch (a"):
        dispatcher.signal(signal.SIGTERM)
        dispatcher.wait_for_output(f"SIGTERM, {line}")
    dispatcher.signal(signal.SIGTERM)
    assert dispatcher.wait(60) == 1, dispatcher.output
    assert "SIGTERM, no more waiting" in dispatcher.output
    assert "dispatcher did not stop within 10 s of the last signal; exiting now" in (
        dispatcher.output
    )
