"""The workers registry: every engine keeps a row while it runs — live,
stopped (the row is gone) and SIGKILLed (the row stays and grows silent) — in real
processes; rows silent past retention are deleted; an engine run inside a
transaction is not recorded."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from jobs.models import WorkerRecord
from jobs.observability import reads
from jobs.observability.worker_registry import DatabaseRegistry
from ledon import registry
from ledon.backoff import Backoff
from ledon.engine import Engine
from ledon.registry import EngineRecord, package_version
from tests.support.procs import ManageProcess, WorkerProcess, wait_until

FAST = {"JOBS_WORKERS_HEARTBEAT_SECONDS": "0.2"}


def rows(**filters) -> list[WorkerRecord]:
    return list(WorkerRecord.objects.filter(**filters).order_by("kind", "engine_id"))


def admin_state(client, engine_id: str) -> str | None:
    """The state column of ``engine_id``'s row in the admin's workers list."""
    html = client.get("/admin/jobs/workerrecord/").content.decode()
    row = re.search(rf"<tr>(?:(?!</tr>).)*>{re.escape(engine_id)}<(?:(?!</tr>).)*</tr>", html, re.S)
    if row is None:
        return None
    state = re.search(r'<td class="field-state">([^<]*)</td>', row.group(0))
    return state.group(1) if state else None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_live_stopped_and_killed_engines(tmp_path, admin_client, settings):
    """Real processes: a worker and two dispatchers. The worker's row says who it is
    and renews its heartbeat; SIGKILL leaves a dispatcher's row, which the admin then
    shows as silent and a restart with the same id takes over; a clean stop deletes
    the rows; the worker's heartbeats delete a killed engine's row once it has been
    silent past the retention."""
    # The admin's view of the engines' heartbeats (every 0.2 s): silent after 5 s
    # without one, so that a busy machine's late heartbeats (a beat that finds SQLite's
    # write lock held is left to the next one) are not taken for silence; the worker
    # deletes rows silent for 15 s, which leaves the test 10 s to see a killed
    # engine's row shown silent before it goes.
    settings.JOBS = {**settings.JOBS, "WORKERS_HEARTBEAT_SECONDS": 0.2, "WORKERS_SILENT_AFTER": 25}
    worker = WorkerProcess(tmp_path, "--worker-id", "reg-w", "--concurrency", "3",
                           "--queue", "reg-a", "--queue", "reg-b",
                           env={**FAST, "JOBS_WORKERS_RETENTION_SECONDS": "15"})  # fmt: skip
    dispatcher = ManageProcess(tmp_path, "dispatch_outbox", "--dispatcher-id", "reg-d", env=FAST)
    doomed = ManageProcess(tmp_path, "dispatch_outbox", "--dispatcher-id", "reg-k", env=FAST)
    try:
        wait_until(lambda: rows(engine_id="reg-w"), 60, "the worker's row", worker)
        wait_until(lambda: rows(engine_id="reg-d"), 60, "the dispatcher's row", dispatcher)
        wait_until(lambda: rows(engine_id="reg-k"), 60, "the second dispatcher's row", doomed)
        [w] = rows(kind="worker", engine_id="reg-w")
        assert (w.pid, w.host, w.concurrency, w.queues) == (
            worker.pid,
            os.uname().nodename,
            3,
            ["reg-a", "reg-b"],
        )
        assert w.version == package_version()
        assert w.running == 0
        # The worker's saga runner is an engine of its own (started beside the worker).
        wait_until(lambda: rows(kind="saga runner", pid=worker.pid), 60, "the runner's row", worker)
        first = w.last_heartbeat_at
        wait_until(
            lambda: WorkerRecord.objects.get(pk=w.pk).last_heartbeat_at > first,
            30, "a heartbeat", worker,
        )  # fmt: skip
        assert admin_state(admin_client, "reg-w") == "live"

        # SIGKILL: the row stays, and the admin shows it silent once its heartbeats stop.
        dispatcher.kill()
        [d] = rows(engine_id="reg-d")
        assert (d.kind, d.pid) == ("dispatcher", dispatcher.pid)
        state = wait_until(
            lambda: (
                (admin_state(admin_client, "reg-d") or "").startswith("silent for")
                and admin_state(admin_client, "reg-d")
            ),
            60,
            "the killed dispatcher shown as silent",
        )
        assert state.startswith("silent for ")
        live, silent = reads.workers(timezone.now())
        assert "reg-d" in [r.engine_id for r in silent]
        assert "reg-d" not in [r.engine_id for r in live]

        # A restart with the same id takes the row over; a clean stop deletes it.
        again = ManageProcess(tmp_path, "dispatch_outbox", "--dispatcher-id", "reg-d", env=FAST)
        try:
            wait_until(lambda: rows(engine_id="reg-d", pid=again.pid), 60, "the new row", again)
            assert len(rows(engine_id="reg-d")) == 1
            assert admin_state(admin_client, "reg-d") == "live"
        finally:
            again.signal(signal.SIGTERM)
            assert again.wait() == 0
            again.close()
        assert rows(engine_id="reg-d") == []

        # Another SIGKILL: silent past the worker's retention (15 s), the row is deleted
        # by the worker's heartbeats (every CLEAN_UP_EVERY of them).
        doomed.kill()
        assert rows(engine_id="reg-k")
        wait_until(lambda: not rows(engine_id="reg-k"), 60, "the old row deleted", worker)
        assert rows(engine_id="reg-w")  # the live ones stay

        # A clean stop removes the rows of the worker and its saga runner.
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert rows(engine_id="reg-w") == []
        assert rows(pid=worker.pid) == []
    finally:
        worker.close()
        dispatcher.close()
        doomed.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_restarted_with_its_id_takes_over_every_row_of_that_id(tmp_path, admin_client):
    """kill -9 a worker, restart it with the same --worker-id: both its own row and
    its saga runner's belong to the new process, and no row of the old run is left
    to go silent (and fire the silent-worker alert until retention deletes it)."""
    first = WorkerProcess(tmp_path, "--worker-id", "reg-again", env=FAST)
    try:
        wait_until(lambda: len(rows(pid=first.pid)) == 2, 60, "the worker's two rows", first)
        assert {(r.kind, r.engine_id) for r in rows(pid=first.pid)} == {
            ("worker", "reg-again"),
            ("saga runner", "reg-again"),
        }
        first.kill()
        first.wait()
    finally:
        first.close()
    again = WorkerProcess(tmp_path, "--worker-id", "reg-again", env=FAST)
    try:
        wait_until(lambda: len(rows(pid=again.pid)) == 2, 60, "the new run's two rows", again)
        assert rows(pid=first.pid) == []
        assert {(r.kind, r.engine_id) for r in rows()} == {
            ("worker", "reg-again"),
            ("saga runner", "reg-again"),
        }
        _live, silent = reads.workers(timezone.now())
        assert silent == []
    finally:
        again.signal(signal.SIGTERM)
        assert again.wait() == 0
        again.close()
    assert rows() == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_in_a_thread_keeps_its_row_with_its_running_count(settings):
    import threading

    from jobs import JobSubmission, job_handler, submit_job
    from jobs.handlers import unregister
    from jobs.worker import Worker

    settings.JOBS = {**settings.JOBS, "WORKERS_HEARTBEAT_SECONDS": 0.05}
    release = threading.Event()
    started = threading.Event()

    @job_handler("reg.hold")
    def hold(ctx):
        started.set()
        release.wait(30)
        return None

    try:
        submit_job("reg", "hold-1", JobSubmission.create("reg.hold"))
        worker = Worker(worker_id="reg-thread", listen=False, burst=True)
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert started.wait(30)
        wait_until(lambda: rows(engine_id="reg-thread", running=1), 30, "running 1")
        release.set()
        thread.join(30)
        assert rows(engine_id="reg-thread") == []
    finally:
        release.set()
        unregister("reg.hold", 1)


@pytest.mark.django_db
def test_an_engine_run_inside_a_transaction_is_not_recorded():
    from outbox.dispatcher import Dispatcher
    from outbox.testing import RecordingTransport

    Dispatcher(transport=RecordingTransport(), burst=True, listen=False).run()
    assert rows() == []


@pytest.mark.django_db
def test_rows_silent_past_retention_are_deleted_and_a_late_heartbeat_revives_nothing(settings):
    settings.JOBS = {**settings.JOBS, "WORKERS_RETENTION_SECONDS": 3600}
    store = DatabaseRegistry()
    now = timezone.now()
    old = EngineRecord(kind="worker", engine_id="old")
    fresh = EngineRecord(kind="worker", engine_id="fresh")
    store.register(old, running=0, now=now - timedelta(hours=2))
    store.register(fresh, running=2, now=now)
    assert store.clean_up(now=now) == 1
    assert [r.engine_id for r in rows()] == ["fresh"]
    # Another run took the id over: the earlier run's heartbeat and removal miss.
    takeover = EngineRecord(kind="worker", engine_id="fresh")
    store.register(takeover, running=0, now=now)
    assert store.heartbeat(fresh, running=5, now=now) is False
    store.remove(fresh)
    [row] = rows()
    assert (row.token, row.running) == (takeover.token, 0)


def test_jobs_installs_its_store_into_the_registry():
    assert isinstance(registry.installed(), DatabaseRegistry)


class SteppingEngine(Engine):
    """An engine whose one database step fails while ``failing`` is set; its
    registry row is kept by the heartbeat thread on a connection of its own."""

    kind = "stepping engine"
    app_label = "jobs"

    def __init__(self) -> None:
        super().__init__(
            alias="default",
            log=logging.getLogger("tests.stepping"),
            backoff=Backoff(base=0.001, cap=0.004, jitter=0),
        )
        self.failing = threading.Event()

    def registry_record(self) -> EngineRecord:
        return EngineRecord(kind=self.kind, engine_id="stepping")

    def _step(self) -> bool:
        if self.failing.is_set():
            raise OperationalError("server closed the connection unexpectedly")
        return WorkerRecord.objects.exists()  # a step that reaches the database

    def run(self) -> None:
        try:
            if not self.wait_for_database():
                return
            while not self._stopping.is_set():
                self.guarded("the step", self._step)
                self.pause(0.01)
        finally:
            connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_an_engine_whose_database_steps_fail_shows_unhealthy_not_live(settings, admin_client):
    """The heartbeat thread still reaches the database, but the engine does not: the
    row, the admin, the dashboard and the metric say unhealthy until it works again."""
    # Heartbeats every 0.05 s, silent only after 10 s without one (a busy machine).
    settings.JOBS = {
        **settings.JOBS,
        "WORKERS_HEARTBEAT_SECONDS": 0.05,
        "WORKERS_SILENT_AFTER": 200,
    }
    engine = SteppingEngine()
    engine.failing.set()
    thread = threading.Thread(target=engine.run)
    thread.start()
    try:
        [row] = wait_until(
            lambda: rows(engine_id="stepping", unhealthy_since__isnull=False),
            30,
            "the row saying unhealthy",
        )
        assert row.unhealthy_reason.startswith("database steps failing")
        assert admin_state(admin_client, "stepping").startswith("unhealthy for ")
        html = admin_client.get("/admin/jobs/dashboard/").content.decode()
        assert re.search(r'<tr class="unhealthy"><td>stepping engine</td><td>stepping</td>', html)
        assert "1 unhealthy" in html
        counts = reads.worker_counts(timezone.now())
        assert (counts[("stepping engine", "unhealthy")], counts[("stepping engine", "live")]) == (
            1,
            0,
        )
        # The outage goes on: the row keeps the time it began.
        since = row.unhealthy_since
        first_beat = row.last_heartbeat_at
        wait_until(
            lambda: rows(engine_id="stepping", last_heartbeat_at__gt=first_beat), 30, "a beat"
        )
        assert rows(engine_id="stepping")[0].unhealthy_since == since

        engine.failing.clear()
        wait_until(
            lambda: rows(engine_id="stepping", unhealthy_since__isnull=True), 30, "live again"
        )
        assert admin_state(admin_client, "stepping") == "live"
    finally:
        engine.stop()
        thread.join(30)
    assert rows(engine_id="stepping") == []


def sqlite_busy_error(tmp_path) -> OperationalError:
    """The error Django raises when SQLite's write lock is held elsewhere: a real
    ``SQLITE_BUSY`` from the driver, wrapped as Django wraps it."""
    import sqlite3

    path = str(tmp_path / "busy.sqlite3")
    holder = sqlite3.connect(path, isolation_level=None)
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        try:
            waiter.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            try:
                raise OperationalError(*exc.args) from exc
            except OperationalError as wrapped:
                return wrapped
        raise AssertionError("the second writer got the lock")
    finally:
        holder.close()
        waiter.close()


class BusyFirst(DatabaseRegistry):
    """The real store, whose first ``busy`` writes find SQLite busy."""

    def __init__(self, error: OperationalError, busy: int) -> None:
        self.error, self.busy, self.tries = error, busy, 0

    @property
    def heartbeat_seconds(self) -> float:
        return 30.0  # one beat within the test: its retries are the busy wait

    def register(self, record, **kwargs) -> None:
        self.tries += 1
        if self.tries <= self.busy:
            raise self.error
        super().register(record, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_busy_sqlite_is_waited_out_quietly_and_an_outage_still_reported(tmp_path, caplog):
    """Book-keeping that finds SQLite's write lock held (Django's default SQLite
    settings, a worker's own threads writing) retries briefly and logs nothing at
    WARNING or above; another database error is still an outage, said once."""
    busy = sqlite_busy_error(tmp_path)
    assert registry.is_sqlite_busy(busy)
    assert not registry.is_sqlite_busy(OperationalError("server closed the connection"))
    store = BusyFirst(busy, busy=3)
    record = EngineRecord(kind="worker", engine_id="busy-w")
    ready = threading.Event()
    ready.set()
    with caplog.at_level(logging.DEBUG, logger="ledon.registry"):
        registration = registry.Registration(
            store, record, alias="default", running=lambda: 0, ready=ready
        )
        registration.start()
        try:
            assert registration.registered.wait(30)
        finally:
            registration.close()
    assert store.tries == 4
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert rows(engine_id="busy-w") == []  # removed at close

    # Busy past the wait: left to the next heartbeat, with a DEBUG line only.
    caplog.clear()
    store = BusyFirst(busy, busy=10**6)
    with caplog.at_level(logging.DEBUG, logger="ledon.registry"):
        registration = registry.Registration(
            store, record, alias="default", running=lambda: 0, ready=ready
        )
        registration.start()
        wait_until(
            lambda: any("found SQLite busy" in r.getMessage() for r in caplog.records),
            30,
            "the busy wait given up",
        )
        registration.close()
    assert not registration.registered.is_set()
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}

    # Another error: an outage, said at WARNING (with its traceback the first time).
    caplog.clear()
    store = BusyFirst(OperationalError("server closed the connection"), busy=10**6)
    with caplog.at_level(logging.DEBUG, logger="ledon.registry"):
        registration = registry.Registration(
            store, record, alias="default", running=lambda: 0, ready=ready
        )
        registration.start()
        wait_until(lambda: store.tries >= 1 and caplog.records, 30, "the outage said")
        registration.close()
    [line] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "workers registry unreachable: recording the engine failed" in line.getMessage()
