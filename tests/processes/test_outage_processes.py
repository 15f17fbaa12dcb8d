"""Surviving PostgreSQL outages, with real processes under load.

A private throw-away cluster (``scripts/pg.sh start``), with synchronous commits so
that a crash loses no acknowledged commit. A backlog of jobs, orders (outbox
messages billed through the inbox, which stage a job and an event each) and sagas;
three workers, two dispatchers, two saga runners and a consumer (RabbitMQ, where it
can run; otherwise billing runs inside the dispatchers through the in-process
transport) work through it while the server is stopped with ``-m immediate`` and
started again, twice. During the first outage one more worker, dispatcher and saga
runner start. Then:

- every process is alive and the backlog drains;
- nothing is lost or done twice: each job has one succeeded attempt and one effect
  for it, each order one invoice and one inbox record, each saga step one commit;
- each process logged a handful of ERROR lines (counted in its log), not one per
  attempt;
- SIGTERM stops each process with status 0 within its shutdown timeout.

The figures (ERROR lines per process and per second of outage, time to drain after
the database returned) are printed; ``pytest -s`` shows them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.brokers import (
    ManageCommand,
    Processes,
    _conninfo,
    broker,
    transport_env,
    unique,
    uses_broker,
)
from tests.support.procs import ROOT, manage, wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(900)]

PG = ROOT / "scripts" / "pg.sh"
#: The server runs with synchronous commits: a crash loses nothing acknowledged.
PG_ENV = {**os.environ, "PG_SYNC_COMMIT": "on"}

JOBS = 2000
ORDERS = 300
SAGAS = 150
SHUTDOWN_TIMEOUT = 10
ERROR_LINE = re.compile(r"^\S+ \S+ ERROR ", re.MULTILINE)
OUTAGE_START = re.compile(r"^\S+ \S+ ERROR \S+: database unreachable: ", re.MULTILINE)

SEED = f"""
from decimal import Decimal
from jobs import JobSubmission, submit_jobs
from sagas import start_saga
from testproject.orders.services import place_order

for start in range(0, {JOBS}, 500):
    submit_jobs(
        ("outage", f"job-{{n}}", JobSubmission.create("test.outage", {{"seconds": 0.02}},
                                                     max_attempts=20))
        for n in range(start, min(start + 500, {JOBS}))
    )
for n in range({ORDERS}):
    place_order(f"O-{{n:04}}", Decimal("10.00"))
for n in range({SAGAS}):
    start_saga("fulfilment.order", {{"order_id": n, "sku": "SKU", "quantity": 1,
                                     "amount": "9.90"}})
"""


class Cluster:
    """A private PostgreSQL cluster that the test crashes and restarts."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ledon-outage-pg-"))
        result = self._pg("start")
        self.url = result.stdout.strip().splitlines()[-1]

    def _pg(self, command: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(PG), command, str(self.directory)],
            env=PG_ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"pg.sh {command}:\n{result.stderr}"
        return result

    def crash(self) -> None:
        self._pg("crash")

    def restart(self) -> None:
        self._pg("restart")

    def stop(self) -> None:
        self._pg("stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def value(self, query: str) -> Any:
        import psycopg

        with psycopg.connect(_conninfo(self.url)) as conn:
            row = conn.execute(query).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return row[0]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = Cluster()
    yield server
    server.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


@dataclass
class Fleet:
    """The engine processes of the test, and when each outage began and ended."""

    procs: Processes
    cluster: Cluster
    env: dict[str, str]
    engines: list[ManageCommand] = field(default_factory=list)
    consumer: ManageCommand | None = None
    outages: list[tuple[float, float]] = field(default_factory=list)

    def start(self, command: str, *args: str, **env: str) -> ManageCommand:
        proc = self.procs.start(
            command, *args, env={**self.env, **env}, database_url=self.cluster.url
        )
        self.engines.append(proc)
        return proc

    def worker(self, name: str) -> ManageCommand:
        return self.start(
            "run_jobs", "--worker-id", name, "--concurrency", "4",
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), SAGAS_RECOVER_IN_WORKER="false",
        )  # fmt: skip

    def dispatcher(self, name: str) -> ManageCommand:
        return self.start("dispatch_outbox", "--dispatcher-id", name)

    def runner(self, name: str) -> ManageCommand:
        return self.start("recover_sagas", "--runner-id", name)

    def all(self) -> list[ManageCommand]:
        return self.engines + ([self.consumer] if self.consumer else [])

    def alive(self) -> None:
        for proc in self.all():
            assert proc.proc.poll() is None, f"{proc.name} died:\n{proc.output[-5000:]}"

    def outage(self, *, start_during: bool = False) -> list[ManageCommand]:
        """Crash the server; wait until every engine said so (and, with
        ``start_during``, start one more of each kind and wait until they said it
        too); start the server again and wait until every engine is back."""
        before = {id(p): len(OUTAGE_START.findall(p.output)) for p in self.engines}
        self.cluster.crash()
        down = time.monotonic()
        for proc in list(self.engines):
            proc.wait_until(
                lambda p=proc: len(OUTAGE_START.findall(p.output)) > before[id(p)],
                "it to report the outage",
            )
        late: list[ManageCommand] = []
        if start_during:
            late = [self.worker("w-late"), self.dispatcher("d-late"), self.runner("r-late")]
            for proc in late:
                proc.wait_until(
                    lambda p=proc: "database unreachable: connecting to database" in p.output,
                    "it to start and report the outage",
                )
        self.alive()
        self.cluster.restart()
        up = time.monotonic()
        self.outages.append((down, up))
        for proc in self.engines:
            proc.wait_until(
                lambda p=proc: (
                    p.output.count("database reachable again")
                    >= len(OUTAGE_START.findall(p.output))
                ),
                "it to be back at work",
            )
        return late


@uses_broker("rabbitmq")  # its consumer and dispatchers use the shared RabbitMQ
def test_engines_survive_postgres_outages_under_load(cluster, procs, tmp_path):
    env: dict[str, str] = {"OUTBOX_ENABLED": "true"}
    group = unique("billing")
    try:
        rabbit = broker("rabbitmq")
    except pytest.skip.Exception:
        rabbit = None  # billing runs in the dispatchers (in-process transport)
    if rabbit is not None:
        env = transport_env(rabbit, {"exchange": unique("orders"), "connect_timeout": 2})
    manage(cluster.url, "migrate", "-v", "0", env=env)
    manage(cluster.url, "shell", "-c", SEED, env=env)

    fleet = Fleet(procs, cluster, env)
    if rabbit is not None:
        fleet.consumer = procs.start(
            "consume_events", "--group", group, env=env, database_url=cluster.url
        )
        fleet.consumer.wait_for_output("\nready ")
    workers = [fleet.worker(f"w{n}") for n in range(3)]
    for n in range(2):
        fleet.dispatcher(f"d{n}")
        fleet.runner(f"r{n}")

    def done(sql: str) -> int:
        return int(cluster.value(sql))

    jobs_done = (
        "SELECT count(*) FROM jobs_job WHERE handler = 'test.outage' AND status = 'succeeded'"
    )
    sagas_done = "SELECT count(*) FROM sagas_sagainstance WHERE status = 'succeeded'"
    sent = (
        "SELECT count(*) FROM outbox_outboxmessage"
        " WHERE event_type = 'orders.placed' AND status = 'sent'"
    )
    wait_until(
        lambda: done(jobs_done) >= JOBS // 10 and done(sagas_done) and done(sent),
        120,
        "work under way before the first outage",
        workers[0],
    )
    fleet.outage(start_during=True)
    wait_until(lambda: done(jobs_done) >= JOBS // 2, 180, "half the jobs", workers[0])
    invoices = "SELECT count(*) FROM orders_invoice"
    targets = {"jobs": (jobs_done, JOBS), "sagas": (sagas_done, SAGAS)}
    targets.update({"messages": (sent, ORDERS), "invoices": (invoices, ORDERS)})
    fleet.outage()
    back = fleet.outages[-1][1]
    left = {what: target - done(sql) for what, (sql, target) in targets.items()}
    finished: dict[str, float] = {}

    def drained_all() -> bool:
        for what, (sql, target) in targets.items():
            if what not in finished and done(sql) == target:
                finished[what] = round(time.monotonic() - back, 1)
        return len(finished) == len(targets)

    wait_until(drained_all, 300, "the backlog to drain", workers[0])
    drained = max(finished.values())
    fleet.alive()

    # Nothing lost, nothing done twice.
    assert done("SELECT count(*) FROM jobs_job WHERE handler = 'test.outage'") == JOBS
    assert not done(
        "SELECT count(*) FROM (SELECT job_id FROM jobs_jobattempt WHERE status = 'succeeded'"
        " GROUP BY job_id HAVING count(*) > 1) twice"
    )
    # The succeeded attempt's effect exists exactly once for every job.
    assert (
        done(
            "SELECT count(*) FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
            " AND a.status = 'succeeded' JOIN shop_worklog w ON w.token = a.token"
            " WHERE j.handler = 'test.outage'"
        )
        == JOBS
    )
    assert done("SELECT count(*) FROM orders_invoice") == ORDERS
    assert done("SELECT count(DISTINCT order_number) FROM orders_invoice") == ORDERS
    assert done("SELECT count(*) FROM outbox_inboxmessage WHERE consumer = 'billing'") == ORDERS
    assert not done(
        "SELECT count(*) FROM (SELECT instance_id, step FROM fulfilment_steprun"
        " WHERE kind = 'action' GROUP BY instance_id, step HAVING count(*) > 1) twice"
    )
    assert done("SELECT count(*) FROM fulfilment_steprun WHERE kind = 'action'") == 3 * SAGAS
    assert not done("SELECT count(*) FROM sagas_sagainstance WHERE compensated_steps <> '[]'")

    # A handful of ERROR lines per process, not one per attempt.
    outage_seconds = sum(up - down for down, up in fleet.outages)
    errors = {
        f"{p.name} #{i}": len(ERROR_LINE.findall(p.output)) for i, p in enumerate(fleet.all())
    }
    print(
        f"\noutages: {[round(up - down, 1) for down, up in fleet.outages]} s; drained "
        f"{drained:.1f} s after the database returned (left then: {left}; done after, in "
        f"seconds: {finished}); ERROR lines per process: {errors}; "
        f"worst {max(errors.values()) / outage_seconds:.2f} per second of outage"
    )
    for name, count in errors.items():
        assert count <= 3 * len(fleet.outages), f"{name}: {count} ERROR lines"

    # SIGTERM: status 0 within the shutdown timeout.
    for proc in fleet.all():
        proc.proc.send_signal(signal.SIGTERM)
    for proc in fleet.all():
        assert proc.wait(SHUTDOWN_TIMEOUT + 20) == 0, proc.output[-5000:]
