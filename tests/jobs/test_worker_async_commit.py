"""``JOBS["ASYNCHRONOUS_COMMIT"]``: the worker's own claims and finishes commit with
``synchronous_commit = off`` on PostgreSQL (that transaction only: the handlers' own
transactions stay durable); off by default; ignored on SQLite. The jobs' outcomes,
attempt rows and tokens are the same either way."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs import execution as execution_module
from jobs.conf import jobs_settings
from jobs.db import fetch
from jobs.exceptions import JobsConfigurationError
from jobs.handlers import RetryPolicy
from jobs.models import JobAttempt
from jobs.store import asynchronous_commit
from jobs.types import AttemptStatus, FinishOutcome
from jobs.worker import Worker

SCOPE = "async-commit"
SETTING = "SELECT current_setting('synchronous_commit') AS value"


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def database_default(value: str | None) -> None:
    """Set (or with None reset) what new connections to the test database start with."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        if value is None:
            cursor.execute(f"ALTER DATABASE {name} RESET synchronous_commit")
        else:
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = {value}")


def current_setting(*, prepare: bool = True) -> str:
    return fetch(connection, SETTING, {}, prepare=prepare)[0]["value"]


@pytest.fixture
def durable_session():
    """This connection's own transactions commit durably (the test server's default
    may be off), so that a transaction that says ``off`` is told apart."""
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET synchronous_commit")


def test_it_is_off_by_default_and_must_be_a_bool(settings):
    settings.JOBS = {}
    assert jobs_settings().ASYNCHRONOUS_COMMIT is False
    settings.JOBS = {"ASYNCHRONOUS_COMMIT": "yes"}
    with pytest.raises(JobsConfigurationError, match="ASYNCHRONOUS_COMMIT"):
        jobs_settings()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("durable_session")
class TestTheTransaction:
    def test_one_statement_runs_in_a_pipeline_whose_commit_is_not_waited_for(self):
        with asynchronous_commit(True, one_statement=True):
            inside = current_setting()
        assert inside == "off"
        assert current_setting() == "on"  # the session's own setting is untouched

    def test_several_statements_run_in_one_transaction_that_sets_it_locally(self):
        with asynchronous_commit(True):
            assert connection.in_atomic_block
            inside = [current_setting(prepare=False), current_setting()]
        assert inside == ["off", "off"]
        assert not connection.in_atomic_block
        assert current_setting() == "on"

    def test_finishes_alone_in_the_pipeline_are_read_back(self, make_job):
        """A settle that claims nothing is the finishing statement alone."""
        claim = make_job.running()
        with asynchronous_commit(True, one_statement=True):
            outcomes = execution_module.complete_many([(claim, "r")])
        assert outcomes == {claim.token: FinishOutcome.SUCCEEDED}
        assert make_job.get().status == JobStatus.SUCCEEDED
        assert make_job.get().result_ref == "r"

    def test_disabled_it_changes_nothing(self):
        with asynchronous_commit(False, one_statement=True):
            assert not connection.in_atomic_block
            assert current_setting() == "on"

    def test_an_error_inside_rolls_back_and_leaves_the_session_as_it_was(self, make_job):
        make_job.queued()

        def claim_then_fail() -> None:
            with asynchronous_commit(True):
                assert len(execution_module.claim_due("w", limit=1)) == 1
                raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):
            claim_then_fail()
        assert JobAttempt.objects.count() == 0  # the claim was rolled back
        assert make_job.get().status == JobStatus.QUEUED
        assert current_setting() == "on"

    def test_inside_an_open_transaction_it_sets_it_for_that_transaction(self):
        with transaction.atomic():
            with asynchronous_commit(True, one_statement=True):
                inside = current_setting()
            after = current_setting()
        assert (inside, after) == ("off", "off")  # SET LOCAL lasts to the outer commit
        assert current_setting() == "on"


def run_until_finished(count: int, **kwargs: Any) -> Worker:
    """Run a worker until ``count`` jobs reached a final state (a retry is due at once,
    but a burst worker may look for due jobs just before it is queued again)."""
    finished = threading.Event()
    ends: list[str] = []

    def on_event(event: str, claim: Any, detail: str) -> None:
        if event in ("succeeded", "failed"):
            ends.append(event)
            if len(ends) == count:
                finished.set()

    worker = Worker(listen=False, on_event=on_event, **kwargs)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert finished.wait(60), ends
    finally:
        worker.stop()
        thread.join(30)
    return worker


def seen_by(monkeypatch: pytest.MonkeyPatch, name: str, log: list[str]) -> None:
    """Record the ``synchronous_commit`` that the worker's ``execution.<name>`` runs
    under (read in its transaction, just before it)."""
    original: Callable[..., Any] = getattr(execution_module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        log.append(current_setting() if is_postgres() else "sqlite")
        return original(*args, **kwargs)

    monkeypatch.setattr(execution_module, name, wrapped)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize(
    ("limited", "prepared"),
    [(False, True), (True, True), (False, False)],
    ids=["unlimited", "limits", "unprepared"],
)
def test_a_worker_with_it_on_finishes_every_job_as_without_it(
    handler, settings, monkeypatch, concurrency, limited, prepared
):
    """Successes (settled with the next claim), failures with a retry and a permanent
    failure (finished on their own): every job ends as it would with durable commits,
    with one attempt row per attempt; on PostgreSQL the worker's claims and finishes
    ran with ``synchronous_commit = off`` and the handler's own transaction did not."""
    # A job claimed ahead is given back (an attempt row Released) once it waited
    # PREFETCH_MAX_WAIT for a slot: on a loaded machine it may, and this test counts
    # attempt rows, not look-ahead.
    jobs: dict[str, Any] = {
        "ASYNCHRONOUS_COMMIT": True,
        "PREPARED_STATEMENTS": prepared,
        "PREFETCH_MAX_WAIT": 120,
    }
    if limited:
        jobs["QUEUES"] = {"default": {"max_running": 5}}  # the claim is several statements
    settings.JOBS = jobs
    if is_postgres():
        database_default("on")
        connection.close()  # every new connection commits durably unless told
    settled: list[str] = []
    failed: list[str] = []
    in_handler: list[str] = []
    seen_by(monkeypatch, "complete_and_claim", settled)
    seen_by(monkeypatch, "fail", failed)

    @handler("ac.mixed", retry=RetryPolicy(base_delay=0, jitter=0))
    def run(ctx):
        in_handler.append(current_setting(prepare=False) if is_postgres() else "sqlite")
        if ctx.payload["kind"] == "flaky" and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        if ctx.payload["kind"] == "broken":
            raise RuntimeError("always fails")
        return f"done {ctx.payload['n']}"

    kinds = ["ok"] * 6 + ["flaky"] * 2 + ["broken"]
    for n, kind in enumerate(kinds):
        submit_job(
            SCOPE, f"j{n}", JobSubmission.create("ac.mixed", {"n": n, "kind": kind}, max_attempts=2)
        )
    try:
        worker = run_until_finished(len(kinds), concurrency=concurrency)
    finally:
        if is_postgres():
            database_default(None)
    scope = JobScope(SCOPE)
    for n, kind in enumerate(kinds):
        snap = scope.get(f"j{n}")
        expected = JobStatus.FAILED if kind == "broken" else JobStatus.SUCCEEDED
        assert snap.status == expected, (n, kind)
        statuses = [a.status for a in snap.attempts]
        if kind == "ok":
            assert statuses == [AttemptStatus.SUCCEEDED]
            assert snap.result_ref == f"done {n}"
        elif kind == "flaky":
            assert statuses == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
        else:
            assert statuses == [AttemptStatus.FAILED, AttemptStatus.FAILED]
    tokens = list(JobAttempt.objects.values_list("token", flat=True))
    assert len(tokens) == len(set(tokens)) == 6 + 2 * 2 + 2  # a fresh token per attempt
    assert worker.stats.succeeded == 8
    assert worker.stats.retried == 3
    assert worker.stats.failed == 1
    assert settled
    assert failed
    if is_postgres():
        assert set(settled) == {"off"}
        assert set(failed) == {"off"}
        assert set(in_handler) == {"on"}
