"""Shared fixtures: job set-up helpers, a row-level "nothing changed" check, and real
concurrency (threads with their own database connections, released together)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection, connections
from django.test import TransactionTestCase
from django.test.signals import setting_changed

from jobs import execution
from jobs.api import JobScope, submit_job
from jobs.models import Job, JobAttempt
from jobs.types import Claim, JobSnapshot, JobStatus
from tests.support.factories import JobSubmissionFactory
from tests.support.procs import give_children_default_sigint

SCOPE = "tenant-42"


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def pytest_configure(config: pytest.Config) -> None:
    give_children_default_sigint()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup`` (scripts/test.sh): pytest-xdist marks the id of each test of
    an ``xdist_group`` with ``@group`` so that one worker runs the whole group (the wheel
    tests share one build, the broker tests stop and start the shared brokers). Since
    pytest 9.2 the id is no longer read from where xdist writes it, and the groups are
    silently spread over the workers; this writes the id where pytest reads it."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
             for m in item.iter_markers("xdist_group")}
        )  # fmt: skip
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id  # pytest >= 9.2 only

            item._id = coerce_node_id(item.nodeid + suffix)


# --------------------------------------------------------------------------- flushing

#: What Django's flush after each transactional test spends most of its time on: the
#: post_migrate signal it sends, whose receivers (contenttypes' and auth's) write back
#: the content types and permissions of every model, one statement each, after the
#: flush emptied their tables. Those rows only ever come from the models, so the flush
#: below keeps the two tables and skips the signal, as long as they hold exactly the
#: rows they held after the last full flush; a test that changed either (a permission
#: made by hand, a content type removed) gets the full flush, signal included.
_kept_rows: dict[str, Any] = {}


def _kept_tables() -> list[str]:
    from django.apps import apps

    return [
        apps.get_model(label)._meta.db_table
        for label in ("contenttypes.ContentType", "auth.Permission")
        if apps.is_installed(f"django.contrib.{label.split('.')[0]}")
    ]


def _rows(alias: str, tables: list[str]) -> Any:
    with connections[alias].cursor() as cursor:
        found = []
        for table in tables:
            cursor.execute(f"SELECT * FROM {connections[alias].ops.quote_name(table)} ORDER BY 1")
            found.append(cursor.fetchall())
        return found


def _flush_keeping_model_rows(self: Any) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _full_fixture_teardown(self)
        return
    kept = _kept_tables()
    for alias in self._databases_names(include_mirrors=False):
        conn = connections[alias]
        if _kept_rows.get(alias) is None or _rows(alias, kept) != _kept_rows[alias]:
            _kept_rows[alias] = None
            call_command(
                "flush", verbosity=0, interactive=False, database=alias, reset_sequences=False
            )
            _kept_rows[alias] = _rows(alias, kept)
            continue
        tables = [
            t
            for t in conn.introspection.django_table_names(only_existing=True, include_views=False)
            if t not in kept
        ]
        if conn.vendor == "postgresql":
            # DELETE, not Django's TRUNCATE: the tables hold a test's few rows, and
            # TRUNCATE gives each table, index and TOAST table a new file (about a
            # tenth of a second a flush, against a few milliseconds). Foreign keys are
            # deferred, so the order does not matter; sequences go on, as with Django's.
            statements = ["SET CONSTRAINTS ALL DEFERRED"] + [
                f"DELETE FROM {conn.ops.quote_name(table)}" for table in tables
            ]
        else:
            statements = conn.ops.sql_flush(no_style(), tables, reset_sequences=False)
        conn.ops.execute_sql_flush(statements)


_full_fixture_teardown = TransactionTestCase._fixture_teardown
TransactionTestCase._fixture_teardown = _flush_keeping_model_rows  # type: ignore[method-assign]


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> None:
    """Passwords hashed with MD5 in this test process, as Django's testing docs advise
    ("Speeding up the tests"): every ``admin_client`` and staff user of the admin tests
    hashes one, and the default PBKDF2 spends about 0.75 CPU-seconds on each. Set on the
    settings themselves, not through ``override_settings``, under which
    ``settings.SETTINGS_MODULE`` reads None. Child processes (the browser test's
    server) keep the project's hashers."""
    hashers = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.PASSWORD_HASHERS = hashers
    setting_changed.send(sender=None, setting="PASSWORD_HASHERS", value=hashers, enter=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres_only") and not is_postgres():
        pytest.skip("PostgreSQL only")


@pytest.fixture
def pg_only() -> None:
    """Skip the test unless it runs on PostgreSQL (for fixtures that need it)."""
    if not is_postgres():
        pytest.skip("PostgreSQL only")


@pytest.fixture
def spans() -> Iterator[Any]:
    """OpenTelemetry's in-memory exporter: the spans the test's code ends (see
    ``tests.support.otel``)."""
    from tests.support.otel import collected

    yield from collected()


# --------------------------------------------------------------------------- job set-up


class JobMaker:
    """Brings a job into a given state through the store's own API (never by writing rows)."""

    scope = SCOPE

    @property
    def scope_hash(self) -> str:
        return JobScope(self.scope).scope_hash

    def queued(self, job_id: str = "job-1", *, scope: str | None = None, **sub: Any) -> JobSnapshot:
        return submit_job(scope or self.scope, job_id, JobSubmissionFactory(**sub))

    def running(
        self,
        job_id: str = "job-1",
        *,
        worker_id: str = "w1",
        now: datetime | None = None,
        **sub: Any,
    ) -> Claim:
        snap = self.queued(job_id, **sub)
        claim = execution.try_start(snap.scope_hash, job_id, worker_id, now=now)
        assert claim is not None
        return claim

    def finished(self, status: JobStatus, job_id: str = "job-1", **sub: Any) -> Claim:
        """A job that ran once and ended in ``status``; returns that attempt's claim."""
        claim = self.running(job_id, **sub)
        if status is JobStatus.SUCCEEDED:
            assert execution.complete(claim.token, "results/1.csv")
        elif status is JobStatus.FAILED:
            assert execution.fail(claim.token, "boom")
        elif status is JobStatus.INTERRUPTED:
            assert execution.interrupt(claim.token, "stopped")
        elif status is JobStatus.CANCELLED:
            JobScope(self.scope).cancel(job_id)
            assert execution.complete(claim.token, "results/1.csv")
        else:
            raise ValueError(f"{status} is not a finished state")
        assert self.row(job_id).status == status
        return claim

    def get(self, job_id: str = "job-1", *, scope: str | None = None) -> JobSnapshot:
        snap = JobScope(scope or self.scope).get(job_id)
        assert snap is not None
        return snap

    def row(self, job_id: str = "job-1", *, scope: str | None = None) -> Job:
        return Job.objects.get(scope_hash=JobScope(scope or self.scope).scope_hash, job_id=job_id)

    def attempts(self, job_id: str = "job-1") -> list[JobAttempt]:
        return list(JobAttempt.objects.filter(job=self.row(job_id)).order_by("number"))


@pytest.fixture(autouse=True)
def _claims_start_optimistic() -> None:
    """Each test's first claim under limits is made as a claim of a fresh process
    makes it: the limits that bound in an earlier test are forgotten."""
    from jobs.store.limits import binding

    binding.forget()


@pytest.fixture
def handler() -> Iterator[Callable[..., Any]]:
    """Register handlers for one test (``handler(name, version=1, **options)`` is
    ``job_handler``) and remove them afterwards."""
    from jobs.handlers import job_handler, unregister

    names: list[tuple[str, int]] = []

    def register(name: str, version: int = 1, **kwargs: Any) -> Any:
        names.append((name, version))
        return job_handler(name, version=version, **kwargs)

    yield register
    for name, version in names:
        unregister(name, version)


@pytest.fixture
def make_job() -> JobMaker:
    return JobMaker()


@pytest.fixture
def submission_order(settings: Any) -> None:
    """The default queue in submission order (``"fair": False``): due jobs by priority,
    then due time — for tests of that order rather than of fair share."""
    queues = dict(settings.JOBS.get("QUEUES", {}))
    queues["default"] = {**queues.get("default", {}), "fair": False}
    settings.JOBS = {**settings.JOBS, "QUEUES": queues}


@pytest.fixture
def scope() -> JobScope:
    return JobScope(SCOPE)


def table_state() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every job and attempt row, every column."""
    return (
        list(Job.objects.order_by("id").values()),
        list(JobAttempt.objects.order_by("id").values()),
    )


@pytest.fixture
def unchanged() -> Callable[[], Any]:
    """``with unchanged(): ...`` fails if the block changed any job or attempt row."""

    @contextmanager
    def check() -> Iterator[None]:
        before = table_state()
        yield
        assert table_state() == before

    return check


# --------------------------------------------------------------------------- concurrency


@dataclass
class ThreadOutcome:
    value: Any = None
    error: BaseException | None = None


def in_own_connection(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap ``fn`` for a thread: it uses (and at the end closes) its own connection."""

    def call() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    return call


def run_concurrently(*calls: Callable[[], Any], timeout: float = 60) -> list[ThreadOutcome]:
    """Run each callable in its own thread with its own database connection.

    Every thread connects first, then waits at a barrier, so all of them hit the
    database at the same moment. Returns each call's value or exception, in order.
    """
    barrier = threading.Barrier(len(calls))

    def released(fn: Callable[[], Any]) -> Callable[[], ThreadOutcome]:
        def call() -> ThreadOutcome:
            connection.ensure_connection()
            barrier.wait(timeout)
            try:
                return ThreadOutcome(value=fn())
            except Exception as exc:
                return ThreadOutcome(error=exc)

        return in_own_connection(call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(released(fn)) for fn in calls]
        return [f.result(timeout) for f in futures]


@pytest.fixture
def concurrently() -> Callable[..., list[ThreadOutcome]]:
    return run_concurrently


@pytest.fixture
def background() -> Iterator[Callable[[Callable[[], Any]], Future[Any]]]:
    """``background(fn)`` runs ``fn`` in a thread with its own connection; a Future."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield lambda fn: pool.submit(in_own_connection(fn))


@pytest.fixture
def blocked_on_lock(pg_only: None) -> Callable[..., None]:
    return wait_until_blocked_on_lock


def wait_until_blocked_on_lock(count: int = 1, timeout: float = 10) -> None:
    """PostgreSQL: return once ``count`` other backends wait for a row or tuple lock.

    This observes the database (it does not guess a delay), so a test can act exactly
    when a concurrent transaction is blocked behind its own.
    """
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid()"
            )
            (waiting,) = cursor.fetchone()
            if waiting >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"expected {count} backend(s) waiting on a lock")
            time.sleep(0.005)
