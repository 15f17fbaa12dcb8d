"""The engines while the database fails, in process: they back off instead of
spinning, say it once, keep what they know (a finished attempt, a published batch)
and write it when the database is back — on SQLite and PostgreSQL.

The database "goes down" for the statements of one store function only (it raises
``OperationalError`` as a lost connection does) and comes back after a given number
of back-off waits, so that each test is deterministic. Real outages, with real
processes and a PostgreSQL server stopped with ``-m immediate``, are in
test_outage_processes.py."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import OperationalError

from jobs import JobScope, JobStatus, JobSubmission, execution, job_handler, store, submit_job
from jobs.handlers import unregister
from jobs.types import AttemptStatus
from jobs.worker import Worker
from ledon.backoff import Backoff
from outbox import IntegrationEvent, unit_of_work
from outbox import store as outbox_store
from outbox.bus import event_bus
from outbox.dispatcher import Dispatcher
from outbox.models import OutboxMessage
from outbox.testing import RecordingTransport
from outbox.transports.in_process import InProcessTransport
from outbox.types import MessageStatus
from sagas import SagaStatus, start_saga
from sagas import store as sagas_store
from sagas.models import SagaInstance
from sagas.runner import SagaRunner
from sagas.testing import temporary_saga

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "outage-tests"


class Outage(Backoff):
    """The engine's back-off, tiny, that also ends a simulated outage: the database
    is "down" until the engine has backed off ``waits`` times (each back-off wait
    counted by :meth:`waited`, or each delay handed out, with ``count_delays``)."""

    def __init__(self, waits: int, *, count_delays: bool = True) -> None:
        super().__init__(base=0.001, cap=0.002, jitter=0)
        self.waits = waits
        self.count_delays = count_delays
        self.down = True
        self.timeline: list[str] = []
        #: The thread of each entry of the timeline.
        self.threads: list[int] = []
        self._timeline_lock = threading.Lock()

    def record(self, what: str) -> None:
        with self._timeline_lock:
            self.timeline.append(what)
            self.threads.append(threading.get_ident())

    def waited(self) -> None:
        self.record("backed off")
        self.waits -= 1
        if self.waits <= 0:
            self.down = False

    def next_delay(self) -> float:
        if self.count_delays:
            self.waited()
        return super().next_delay()

    def fail_while_down(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.record("failed")
                raise OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)

        return call


@dataclass(frozen=True)
class Pinged(IntegrationEvent, name="test.outage.pinged"):
    n: int


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_worker_backs_off_while_finishing_fails_and_finishes_each_attempt_once(
    settings, monkeypatch, caplog
):
    """Before the fix a failed finish-and-claim woke the loop at once (hundreds of
    tracebacks a second). Now every failure is followed by a back-off before the
    next attempt, the finished attempts wait (leases renewed), and each job ends
    Succeeded with its one attempt."""
    settings.JOBS = {
        "POLL_INTERVAL": 0.05,
        "CANCEL_POLL_INTERVAL": 60,
        "HEARTBEAT_SECONDS": 30,
        "LEASE_SECONDS": 60,
        "RECOVERY_INTERVAL": 60,
    }
    caplog.set_level(logging.INFO, logger="jobs")
    ran: list[str] = []
    job_handler("outage.quick", version=1)(lambda ctx: ran.append(ctx.job_id) or "done")
    try:
        for n in range(3):
            submit_job(SCOPE, f"q{n}", JobSubmission.create("outage.quick"))
        worker = Worker(burst=True, listen=False, concurrency=1)
        outage = Outage(waits=8, count_delays=False)
        worker.backoff = outage
        real_pause = worker.pause

        def pause(timeout: float, *, until: threading.Event | None = None) -> None:
            if worker.backing_off:
                outage.waited()
            real_pause(timeout, until=until)

        monkeypatch.setattr(worker, "pause", pause)
        real = execution.complete_and_claim
        first_claim = threading.Event()

        def down_after_the_first_claim(*args: Any, **kwargs: Any) -> Any:
            if not first_claim.is_set():
                first_claim.set()
                return real(*args, **kwargs)
            return outage.fail_while_down(real)(*args, **kwargs)

        # Down for every statement the worker sends while the handler's job waits.
        monkeypatch.setattr(execution, "complete_and_claim", down_after_the_first_claim)
        monkeypatch.setattr(execution, "heartbeat", outage.fail_while_down(execution.heartbeat))
        monkeypatch.setattr(
            store, "execution_statuses", outage.fail_while_down(store.execution_statuses)
        )
        stats = worker.run()
    finally:
        unregister("outage.quick", 1)
    failures = [i for i, what in enumerate(outage.timeline) if what == "failed"]
    assert len(failures) >= 8
    # Never two failed attempts of one thread without a back-off between them: no
    # spin. (A slot that settles the batch it completed may fail at the same moment
    # as the main loop, once: it settles alone only while the worker is not backing
    # off.)
    for thread in set(outage.threads):
        own = [i for i in failures if outage.threads[i] == thread]
        for before, after in itertools.pairwise(own):
            assert "backed off" in outage.timeline[before + 1 : after]
    for n in range(3):
        snap = JobScope(SCOPE).get(f"q{n}")
        assert snap is not None
        assert snap.status == JobStatus.SUCCEEDED
        assert [a.status for a in snap.attempts] == [AttemptStatus.SUCCEEDED]
    assert sorted(ran) == ["q0", "q1", "q2"]
    assert stats.succeeded == 3
    assert len(error_lines(caplog)) == 1
    assert "finishing and claiming jobs failed" in error_lines(caplog)[0]
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def outbox_outage(settings, monkeypatch, caplog, *, messages: int, waits: int) -> Outage:
    """``messages`` integration events in the outbox, and recording a published batch
    failing until the dispatcher has backed off ``waits`` times."""
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    caplog.set_level(logging.INFO, logger="outbox")
    with unit_of_work() as uow:
        for n in range(messages):
            uow.add_integration_event(Pinged(n), key=f"k{n}")
    outage = Outage(waits=waits)
    monkeypatch.setattr(
        outbox_store, "record_deliveries", outage.fail_while_down(outbox_store.record_deliveries)
    )
    return outage


def test_a_dispatcher_records_a_published_batch_once_the_database_is_back(
    settings, monkeypatch, caplog
):
    """The batch was published; recording it fails while the database is down. The
    dispatcher retries the record with the back-off instead of leaving the batch to
    its lease, so nothing is published twice."""
    outage = outbox_outage(settings, monkeypatch, caplog, messages=5, waits=4)
    transport = RecordingTransport()
    dispatcher = Dispatcher(transport=transport, burst=True, listen=False)
    dispatcher.backoff = outage
    stats = dispatcher.run()
    assert outage.timeline.count("failed") == 4
    assert len(transport.published) == 5  # each message once
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {MessageStatus.SENT}
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}
    assert stats.sent == 5
    assert len(error_lines(caplog)) == 1


def test_a_subscriber_and_the_dispatcher_failing_in_one_outage_are_one_error_line(
    settings, monkeypatch, caplog
):
    """The database goes while an in-process subscriber runs: the subscriber fails,
    then recording the batch fails. The dispatcher reports the outage once; the bus
    says the subscriber's failure as a warning, not as a second outage."""
    outage = outbox_outage(settings, monkeypatch, caplog, messages=3, waits=3)

    def bill(event: Pinged) -> None:
        if outage.down:
            raise OperationalError("server closed the connection unexpectedly")

    event_bus.subscribe(Pinged, bill)
    try:
        dispatcher = Dispatcher(transport=InProcessTransport(), burst=True, listen=False)
        dispatcher.backoff = outage
        dispatcher.dispatch_batch()
    finally:
        event_bus.unsubscribe(Pinged, bill)
    assert outage.timeline.count("failed") == 3  # recording failed while down
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {MessageStatus.PENDING}
    assert set(OutboxMessage.objects.values_list("attempts", flat=True)) == {1}
    assert len(error_lines(caplog)) == 1, error_lines(caplog)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("subscriber" in line for line in warnings), warnings


def test_a_saga_runner_releases_the_instance_an_outage_interrupted(monkeypatch, caplog):
    """Driving fails on the database mid-saga: the step's completion mark cannot be
    written. That is not the step failing — nothing is compensated. When the
    database is back the runner releases its own lease (no waiting for it to expire,
    no takeover counted) and drives the instance on."""
    caplog.set_level(logging.INFO, logger="sagas")
    done: list[str] = []
    outage = Outage(waits=1)
    real_complete = sagas_store.complete_step
    calls = 0

    def second_step_fails_while_down(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        call = outage.fail_while_down(real_complete) if calls > 1 else real_complete
        return call(*args, **kwargs)

    monkeypatch.setattr(sagas_store, "complete_step", second_step_fails_while_down)
    with temporary_saga("outage.order") as definition:
        definition.step("first", lambda ctx: done.append("first"))
        definition.step("second", lambda ctx: done.append("second"))
        state = start_saga("outage.order", {"n": 1})
        runner = SagaRunner(burst=True, inline=False)
        runner.backoff = outage
        stats = runner.run()
    row = SagaInstance.objects.get(instance_id=state.instance_id)
    assert row.status == SagaStatus.SUCCEEDED
    assert row.takeovers == 0
    assert row.completed_steps == ["first", "second"]
    assert done == ["first", "second", "second"]  # the interrupted run rolled back
    assert outage.timeline == ["failed", "backed off"]
    assert row.compensated_steps == []
    assert (stats.claimed, stats.errors, stats.succeeded) == (2, 1, 1)
    assert len(error_lines(caplog)) == 1


def test_a_worker_whose_database_lacks_the_sagas_tables_runs_its_jobs_and_says_so(
    monkeypatch, caplog
):
    """The jobs' tables are there, the sagas' are not (``migrate sagas`` not run yet):
    the worker runs its jobs; the saga recovery beside it says why it does not run."""
    from django.db import connection

    introspection = type(connection.introspection)
    real = introspection.table_names
    monkeypatch.setattr(
        introspection,
        "table_names",
        lambda self, *a, **k: [t for t in real(self, *a, **k) if not t.startswith("sagas_")],
    )
    caplog.set_level(logging.INFO, logger="sagas")
    events: list[tuple[str, str]] = []
    job_handler("outage.plain", version=1)(lambda ctx: "done")
    try:
        submit_job(SCOPE, "plain", JobSubmission.create("outage.plain"))
        worker = Worker(burst=True, listen=False, on_event=lambda e, c, d: events.append((e, d)))
        worker.run()
    finally:
        unregister("outage.plain", 1)
    snap = JobScope(SCOPE).get("plain")
    assert snap is not None
    assert snap.status == JobStatus.SUCCEEDED
    assert error_lines(caplog) == [
        "saga recovery does not run in this worker: database 'default' lacks the tables "
        "of the 'sagas' app (sagas_sagainstance): its migrations have not been applied.\n"
        "Run 'python manage.py migrate', then start the saga runner again."
    ]
    assert ("saga recovery off", error_lines(caplog)[0].split(": ", 1)[1].splitlines()[0]) in events
