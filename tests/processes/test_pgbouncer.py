"""Behind PgBouncer: the web side and every engine through a PgBouncer in
transaction pooling mode (Debian's 1.18: no LISTEN, no server-side prepared
statements), with the settings docs/deployment.md gives — DATABASES["default"] at the
pooler with DISABLE_SERVER_SIDE_CURSORS, an alias straight to PostgreSQL for LISTEN
only (JOBS and OUTBOX ``LISTEN_DATABASE``), ``JOBS["PREPARED_STATEMENTS"] = False``.

Real processes: ``runserver`` takes orders (order, invoice job, event and saga in one
transaction), ``manage.py shell`` submits and cancels, and ``recover_sagas``,
``dispatch_outbox`` and ``run_jobs`` do the rest, all through the pooler; the test
reads the outcome over its own direct connection, and PgBouncer's own statistics
show the traffic went through it.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobs import JobScope, JobStatus
from sagas.models import SagaInstance
from sagas.types import SagaStatus
from testproject.shop.models import Notification, Order, Payment, Product, Shipment
from tests.support.procs import ROOT, ManageProcess, database_url, manage, wait_until

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

SCRIPT = ROOT / "scripts" / "pgbouncer.sh"
GOOD_CARD = "4242 4242 4242 4242"


@dataclass
class Pooler:
    """A running PgBouncer in front of the test database's server."""

    port: int
    directory: Path

    @property
    def url(self) -> str:
        """The test database through the pooler, as docs/deployment.md configures it."""
        s = connection.settings_dict
        return (
            f"postgres://{s['USER']}@127.0.0.1:{self.port}/{s['NAME']}"
            "?disable_server_side_cursors=true"
        )

    def transactions(self) -> int:
        """Transactions PgBouncer has run for the test database (``SHOW STATS``)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=connection.settings_dict["USER"],
            dbname="pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,  # the admin console speaks simple queries
        ) as admin:
            cursor = admin.cursor()
            cursor.execute("SHOW STATS")
            names = [column.name for column in cursor.description or ()]
            for row in cursor.fetchall():
                stats = dict(zip(names, row, strict=True))
                if stats["database"] == connection.settings_dict["NAME"]:
                    return int(stats["total_xact_count"])
        return 0


@pytest.fixture
def pooler() -> Iterator[Pooler]:
    binary = os.environ.get("PGBOUNCER", "/usr/sbin/pgbouncer")
    if not os.access(binary, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"PgBouncer is not installed at {binary} (CI=true: this test must run)")
        pytest.skip(f"PgBouncer is not installed at {binary}")
    s = connection.settings_dict
    # Outside pytest's private tmp_path: PgBouncer runs as the postgres user.
    directory = Path(tempfile.mkdtemp(prefix="ledon-pgbouncer-"))
    started = subprocess.run(
        [str(SCRIPT), "start", str(directory), s["HOST"], str(s["PORT"])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    try:
        yield Pooler(int(started.stdout.strip()), directory)
    finally:
        subprocess.run([str(SCRIPT), "stop", str(directory)], timeout=60, check=False)
        shutil.rmtree(directory, ignore_errors=True)


#: What docs/deployment.md sets behind the pooler, as the test project reads it.
POOLED_SETTINGS = {"JOBS_PREPARED_STATEMENTS": "false"}


def pooled_env(**extra: str) -> dict[str, str]:
    """The test project's settings behind the pooler: LISTEN on a direct connection."""
    return {**POOLED_SETTINGS, "LISTEN_DATABASE_URL": database_url(), **extra}


def shell(pooler: Pooler, code: str, **env: str) -> None:
    """Run ``code`` in ``manage.py shell`` through the pooler (the web side's API)."""
    manage(pooler.url, "shell", "-c", code, env=pooled_env(**env))


def submit(pooler: Pooler, scope: str, job_id: str, handler: str, **env: str) -> None:
    """``submit_job`` in a process of its own, through the pooler."""
    payload = {"month": "2026-11"} if handler == "demo.report" else {}
    shell(
        pooler,
        "from jobs import JobSubmission, submit_job\n"
        f"submit_job({scope!r}, {job_id!r}, JobSubmission.create({handler!r}, {payload!r}))",
        **env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Shop:
    """``manage.py runserver`` through the pooler, and a browser that orders."""

    def __init__(self, tmp_path: Path, pooler: Pooler) -> None:
        self.port = free_port()
        self.server = ManageProcess(
            tmp_path,
            "runserver",
            "--noreload",
            f"127.0.0.1:{self.port}",
            env=pooled_env(),
            database=pooler.url,
        )
        self.cookies = http.cookiejar.CookieJar()
        self.browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirect()
        )
        wait_until(self._answers, 60, "runserver to answer", self.server)

    def _answers(self) -> bool:
        try:
            with self.browser.open(f"http://127.0.0.1:{self.port}/shop/", timeout=5):
                return True
        except OSError:
            return False

    def order(self, sku: str, quantity: int = 1) -> str:
        """Place an order through the catalogue's form; the new order's number."""
        token = next(c.value for c in self.cookies if c.name == "csrftoken")
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token,
                "email": "ada@example.com",
                "sku": sku,
                "quantity": quantity,
                "card": GOOD_CARD,
            }
        ).encode()
        with self.browser.open(f"http://127.0.0.1:{self.port}/shop/", form, timeout=30) as reply:
            body = reply.read()
            assert reply.status == 302, f"{reply.status}: {body[:2000]!r}\n{self.server.output}"
            match = re.search(r"/shop/orders/([^/]+)/", reply.headers["Location"])
        assert match, reply.headers["Location"]
        return match.group(1)

    def close(self) -> None:
        self.server.signal(signal.SIGINT)
        self.server.wait(30)
        self.server.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def http_error_302(self, req: object, fp: Any, code: int, msg: str, headers: object) -> Any:
        return fp  # the 302 itself says where the order is


@pytest.fixture
def shop(tmp_path: Path, pooler: Pooler) -> Iterator[Shop]:
    Product.objects.create(sku="MUG-1", name="Mug", price=Decimal("12.50"), stock=10)
    started = Shop(tmp_path, pooler)
    yield started
    started.close()


def test_an_order_a_submit_and_every_engine_in_burst_through_the_pooler(pooler, shop):
    """The web side stages the invoice job, the event and the saga in the request's
    transaction; ``manage.py shell`` submits a job; then ``recover_sagas --burst``
    runs the saga (its last step stages a label job), ``dispatch_outbox --burst``
    delivers the event to the mailer through the inbox, and ``run_jobs --burst``
    runs the three jobs — every one of them through the pooler."""
    before = pooler.transactions()
    number = shop.order("MUG-1", quantity=2)
    submit(pooler, "pooled", "report-1", "demo.report")
    env = pooled_env(SAGAS_RECOVER_IN_WORKER="false")
    manage(pooler.url, "recover_sagas", "--burst", env=env)
    manage(pooler.url, "dispatch_outbox", "--burst", env=env)
    manage(pooler.url, "run_jobs", "--burst", "--concurrency", "3", env=env)

    order = Order.objects.get(number=number)
    assert order.status == Order.Status.FULFILLED
    assert order.invoice == f"invoices/{number}.pdf"
    assert Payment.objects.get(order=order).amount == Decimal("25.00")
    assert Shipment.objects.get(order=order).tracking == f"TRK-{number}"
    saga = SagaInstance.objects.get(name="shop.fulfil", idempotency_key=number)
    assert saga.status == SagaStatus.SUCCEEDED
    assert list(Notification.objects.values_list("order_number", flat=True)) == [number]
    jobs = JobScope(order.scope)
    assert jobs.get(order.invoice_job_id).status == JobStatus.SUCCEEDED
    assert jobs.get(f"label-{number}").status == JobStatus.SUCCEEDED
    report = JobScope("pooled").get("report-1")
    assert (report.status, report.result_ref) == (JobStatus.SUCCEEDED, "reports/2026-11.csv")
    # The web process, the shell and the three engines ran their transactions through
    # PgBouncer (the test's own reads use its direct connection).
    assert pooler.transactions() - before >= 20


def test_running_engines_are_woken_over_the_direct_connection_and_cancel_works(
    pooler, shop, tmp_path
):
    """A worker and a dispatcher that poll only once a minute, both connected through
    the pooler and LISTENing on the direct alias: only NOTIFY (sent by transactions
    that went through the pooler) can make them pick up the work within the bounds.
    A running job is cancelled through the pooler and ends cancelled; SIGTERM then
    stops both engines cleanly."""
    env = pooled_env(
        JOBS_POLL_INTERVAL="60", OUTBOX_POLL_INTERVAL="60", SAGAS_RECOVER_IN_WORKER="true"
    )
    worker = ManageProcess(
        tmp_path, "run_jobs", "-v", "2", "--concurrency", "2", env=env, database=pooler.url
    )
    dispatcher = ManageProcess(tmp_path, "dispatch_outbox", "-v", "2", env=env, database=pooler.url)
    try:
        worker.wait_for_output("\nstarted queues=", 60)
        dispatcher.wait_for_output("\nstarted transport", 60)
        submit(pooler, "pooled", "export-1", "demo.export")
        scope = JobScope("pooled")
        wait_until(
            lambda: (scope.get("export-1").progress or 0) > 0,
            30,
            "the export to run (woken by NOTIFY)",
            worker,
        )
        shell(pooler, "from jobs import JobScope\nprint(JobScope('pooled').cancel('export-1'))")
        wait_until(
            lambda: scope.get("export-1").status == JobStatus.CANCELLED,
            30,
            "the running export to end cancelled",
            worker,
        )

        number = shop.order("MUG-1")
        wait_until(
            lambda: Notification.objects.filter(order_number=number).exists(),
            30,
            "the dispatcher to deliver OrderPlaced (woken by NOTIFY)",
            dispatcher,
        )
        order = Order.objects.get(number=number)
        wait_until(
            lambda: JobScope(order.scope).get(order.invoice_job_id).status == JobStatus.SUCCEEDED,
            30,
            "the invoice job to run (woken by NOTIFY)",
            worker,
        )
        worker.signal(signal.SIGTERM)
        dispatcher.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output
        assert dispatcher.wait(60) == 0, dispatcher.output
    finally:
        worker.close()
        dispatcher.close()
    assert "Traceback" not in worker.output + dispatcher.output


def test_without_a_direct_connection_the_checks_say_the_engines_poll(pooler):
    """Everything through the pooler, nothing configured for it: ``manage.py check``
    warns that workers and dispatchers cannot LISTEN (they poll) and that prepared
    statements are on; with them off, a burst worker still runs a job by polling."""
    check = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "DATABASE_URL": pooler.url,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = check.stdout + check.stderr
    assert check.returncode == 0, output  # warnings only
    for check_id in ("jobs.W001", "jobs.W002", "outbox.W003"):
        assert f"({check_id})" in output, output

    submit(pooler, "polling", "report-2", "demo.report", LISTEN_DATABASE_URL="")
    manage(pooler.url, "run_jobs", "--burst", env={**POOLED_SETTINGS, "LISTEN_DATABASE_URL": ""})
    report = JobScope("polling").get("report-2")
    assert (report.status, report.result_ref) == (JobStatus.SUCCEEDED, "reports/2026-11.csv")
