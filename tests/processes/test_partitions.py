"""Partitions and pauses, with real processes under a steady load (PostgreSQL).

A private cluster; a feeder process submits jobs and places orders (each an outbox
message billed through the inbox) at a fixed rate. Two workers and two dispatchers
run; one worker and one dispatcher reach the server through the fault proxy
(``support.proxy``), the others directly. Leases are a few seconds long, and so is
the round-trip deadline (``ledon.deadline``).

- **Black hole:** the proxy drops every byte, connections left open, for three
  leases. The cut engines must notice (one outage line each), the direct ones take
  over what they held once its lease expires; when the link heals the cut engines
  claim again, and what they finish late is fenced off by its token and counted.
- **Pause:** a worker is stopped with SIGSTOP for three leases and continued.

Then nothing is lost and nothing done twice: every job has exactly one succeeded
attempt and one effect for it, every order one invoice and one inbox record. The
figures (time to notice, to take over, to converge after healing, fenced finishes)
are printed; ``pytest -s`` shows them.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.brokers import ManageCommand, Processes
from tests.support.cluster import Cluster
from tests.support.procs import manage, wait_until
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(600)]

LEASE = 4
DEADLINE = 2.0
ENV = {
    "JOBS_LEASE_SECONDS": str(LEASE),
    "JOBS_HEARTBEAT_SECONDS": "1",
    "JOBS_RECOVERY_INTERVAL": "1",
    "JOBS_SCHEDULER": "false",
    "OUTBOX_LEASE_SECONDS": str(LEASE),
    "OUTBOX_RECOVERY_INTERVAL": "1",
    "OUTBOX_BATCH_SIZE": "5",
    "OUTBOX_LOG_LEVEL": "INFO",
    "SAGAS_RECOVER_IN_WORKER": "false",
    "LEDON_ROUND_TRIP_DEADLINE": str(DEADLINE),
}
ERROR_LINE = re.compile(r"^\S+ \S+ ERROR ", re.MULTILINE)


def error_lines(output: str) -> str:
    """Every ERROR line of ``output`` with the line after it (a failure's message)."""
    lines = output.splitlines()
    found = [i for i, line in enumerate(lines) if ERROR_LINE.match(line)]
    return "\n".join("\n".join(lines[i : i + 2]) for i in found) or "(no ERROR line)"


#: The load: every 0.1 s a job of 0.3 s; every 0.4 s an order; until the stop file
#: exists (about 3 of the 8 slots busy: every worker holds jobs when the link is cut).
FEEDER = """
import pathlib, time
from decimal import Decimal
from jobs import JobSubmission, submit_jobs
from testproject.orders.services import place_order

stop = pathlib.Path({stop!r})
n = 0
while not stop.exists():
    submit_jobs(
        ("partition", f"job-{{n + i}}",
         JobSubmission.create("test.outage", {{"seconds": 0.3}}, max_attempts=50))
        for i in range(1)
    )
    if n % 4 == 0:
        place_order(f"P-{{n // 4:06}}", Decimal("10.00"))
    n += 1
    time.sleep(0.1)
print("fed", n, flush=True)
"""

JOBS_DONE = "SELECT count(*) FROM jobs_job WHERE scope_hash = %s AND status = 'succeeded'"


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


def _what_holds_them(load: Load) -> str:
    """What the server says of the paused worker's Running jobs and of every session,
    for a failure to show why they were not taken over."""
    jobs = load.cluster.value(
        "SELECT json_agg(json_build_array(job_id, handler, lease_expires_at, now(),"
        " current_token IS NULL)) FROM jobs_job"
        " WHERE leased_by = 'w-paused' AND status = 'running'"
    )
    sessions = load.cluster.value(
        "SELECT json_agg(json_build_array(pid, application_name, state, wait_event_type,"
        " wait_event, xact_start, left(query, 160))) FROM pg_stat_activity"
        " WHERE datname = current_database()"
    )
    return f"its Running jobs: {jobs}\nsessions: {sessions}"


class Load:
    """The feeder process and the counts it is checked against."""

    def __init__(self, cluster: Cluster, procs: Processes, tmp_path: Path) -> None:
        self.cluster = cluster
        self.stop_file = tmp_path / "stop-feeding"
        self.proc = procs.start(
            "shell", "-c", FEEDER.format(stop=str(self.stop_file)), env=ENV,
            database_url=cluster.url,
        )  # fmt: skip

    def count(self, sql: str) -> int:
        return int(self.cluster.value(sql))

    def jobs(self, status: str | None = None) -> int:
        where = "handler = 'test.outage'" + (f" AND status = '{status}'" if status else "")
        return self.count(f"SELECT count(*) FROM jobs_job WHERE {where}")

    def finish(self) -> None:
        self.stop_file.touch()
        self.proc.wait_for_output("fed ")

    def drained(self) -> bool:
        orders = self.count("SELECT count(*) FROM orders_order")
        return (
            self.jobs("succeeded") == self.jobs()
            and self.count("SELECT count(*) FROM orders_invoice") == orders
            and not self.count(
                "SELECT count(*) FROM outbox_outboxmessage WHERE status <> 'sent'"
                " AND event_type = 'orders.placed'"
            )
        )

    def assert_nothing_lost_or_done_twice(self) -> dict[str, int]:
        jobs = self.jobs()
        assert self.jobs("succeeded") == jobs
        assert not self.count(
            "SELECT count(*) FROM (SELECT job_id FROM jobs_jobattempt WHERE status = 'succeeded'"
            " GROUP BY job_id HAVING count(*) > 1) twice"
        )
        # The succeeded attempt's effect exists exactly once for every job.
        assert (
            self.count(
                "SELECT count(*) FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
                " AND a.status = 'succeeded' JOIN shop_worklog w ON w.token = a.token"
                " WHERE j.handler = 'test.outage'"
            )
            == jobs
        )
        orders = self.count("SELECT count(*) FROM orders_order")
        assert self.count("SELECT count(*) FROM orders_invoice") == orders
        assert self.count("SELECT count(DISTINCT order_number) FROM orders_invoice") == orders
        assert (
            self.count("SELECT count(*) FROM outbox_inboxmessage WHERE consumer = 'billing'")
            == orders
        )
        return {"jobs": jobs, "orders": orders}


def since(proc: ManageCommand, mark: int, pattern: str) -> int:
    """Lines of ``proc``'s output after offset ``mark`` that start with ``pattern``."""
    return len(re.findall(rf"^{pattern}", proc.output[mark:], re.MULTILINE))


def claimed_by(load: Load, worker: str) -> int:
    return load.count(f"SELECT count(*) FROM jobs_jobattempt WHERE worker_id = '{worker}'")


def stop_all(procs: Processes, *engines: ManageCommand) -> dict[str, str]:
    """SIGTERM each engine; each exits with status 0; their summary lines."""
    for proc in engines:
        proc.proc.send_signal(signal.SIGTERM)
    summaries = {}
    for proc in engines:
        assert proc.wait(60) == 0, proc.output[-5000:]
        summaries[proc.name] = proc.output.strip().splitlines()[-1]
    return summaries


def stale(summary: str) -> int:
    found = re.search(r"stale \(fenced off\) (\d+)", summary)
    return int(found.group(1)) if found else 0


def test_a_black_holed_worker_and_dispatcher_recover_and_nothing_is_lost(cluster, procs, tmp_path):
    manage(cluster.url, "migrate", "-v", "0", env=ENV)
    with FaultProxy(cluster.port) as proxy:
        cut_url = proxy.url(cluster.url)

        def worker(name: str, url: str) -> ManageCommand:
            return procs.start(
                "run_jobs", "--worker-id", name, "--concurrency", "4", env=ENV,
                database_url=url,
            )  # fmt: skip

        def dispatcher(name: str, url: str) -> ManageCommand:
            return procs.start(
                "dispatch_outbox", "--dispatcher-id", name, env=ENV, database_url=url
            )

        cut_worker = worker("w-cut", cut_url)
        cut_dispatcher = dispatcher("d-cut", cut_url)
        direct_worker = worker("w-direct", cluster.url)
        direct_dispatcher = dispatcher("d-direct", cluster.url)
        load = Load(cluster, procs, tmp_path)
        engines = [cut_worker, cut_dispatcher, direct_worker, direct_dispatcher]

        wait_until(
            lambda: claimed_by(load, "w-cut") >= 20 and since(cut_dispatcher, 0, "batch ") >= 2,
            120, "the cut engines at work", cut_worker,
        )  # fmt: skip
        marks = {id(p): len(p.output) for p in engines}
        held_before = load.count(
            "SELECT count(*) FROM jobs_job WHERE leased_by = 'w-cut' AND status = 'running'"
        )
        cut_at = time.monotonic()
        proxy.black_hole()
        noticed = {}
        for proc in (cut_worker, cut_dispatcher):
            proc.wait_until(
                lambda p=proc: "database unreachable" in p.output[marks[id(p)] :],
                "it to report the outage", 60,
            )  # fmt: skip
            noticed[proc.name] = round(time.monotonic() - cut_at, 1)
        # What the cut worker held is taken over once its lease expires.
        wait_until(
            lambda: not load.count(
                "SELECT count(*) FROM jobs_job WHERE leased_by = 'w-cut' AND status = 'running'"
            ),
            60, "the cut worker's jobs to be taken over", direct_worker,
        )  # fmt: skip
        taken_over = round(time.monotonic() - cut_at, 1)
        # The partition lasts three leases in all.
        wait_until(lambda: time.monotonic() - cut_at >= 3 * LEASE, 60, "three leases")
        claimed_before_heal = claimed_by(load, "w-cut")
        heal_marks = {id(p): len(p.output) for p in engines}
        proxy.forward()
        healed_at = time.monotonic()
        converged = {}
        wait_until(
            lambda: claimed_by(load, "w-cut") > claimed_before_heal, 90,
            "the cut worker to claim again", cut_worker,
        )  # fmt: skip
        converged["w-cut claims"] = round(time.monotonic() - healed_at, 1)
        cut_dispatcher.wait_until(
            lambda: since(cut_dispatcher, heal_marks[id(cut_dispatcher)], "batch ") > 0,
            "the cut dispatcher to dispatch again", 90,
        )  # fmt: skip
        converged["d-cut dispatches"] = round(time.monotonic() - healed_at, 1)

        load.finish()
        wait_until(load.drained, 180, "the backlog to drain", direct_worker)
        drained = round(time.monotonic() - healed_at, 1)
        for proc in engines:
            assert proc.proc.poll() is None, f"{proc.name} died:\n{proc.output[-5000:]}"
        counts = load.assert_nothing_lost_or_done_twice()
        # One outage, said once (ERROR) by each cut engine while the link is cut; none
        # by the direct ones. After the heal, a connection attempt that began during
        # the cut may still time out (its connect timeout is the deadline): such a
        # straggler is a WARNING, the end of the outage, not a new ERROR.
        names = ["w-cut", "d-cut", "w-direct", "d-direct"]
        errors = {
            name: len(ERROR_LINE.findall(proc.output[marks[id(proc)] : heal_marks[id(proc)]]))
            for name, proc in zip(names, engines, strict=True)
        }
        stragglers = {
            name: len(ERROR_LINE.findall(proc.output[heal_marks[id(proc)] :]))
            for name, proc in zip(names, engines, strict=True)
        }
        stop_all(procs, *engines)
        fenced = {
            "w-cut": stale(cut_worker.output),
            "d-cut": stale(cut_dispatcher.output),
        }
        print(
            f"\nblack hole of {3 * LEASE} s (lease {LEASE} s, deadline {DEADLINE} s): "
            f"noticed after {noticed} s; w-cut's {held_before} running job(s) taken over "
            f"after {taken_over} s; after healing: {converged} s, drained {drained} s; "
            f"fenced-off late finishes {fenced}; ERROR lines {errors} (after the heal "
            f"{stragglers}); load {counts}"
        )
        assert errors["w-cut"] <= 1, error_lines(cut_worker.output)
        assert errors["d-cut"] <= 1, error_lines(cut_dispatcher.output)
        assert stragglers["w-cut"] == 0, error_lines(cut_worker.output)
        assert stragglers["d-cut"] == 0, error_lines(cut_dispatcher.output)
        assert errors["w-direct"] == stragglers["w-direct"] == 0
        assert errors["d-direct"] == stragglers["d-direct"] == 0


def test_a_paused_worker_is_fenced_off_and_claims_again_when_continued(cluster, procs, tmp_path):
    manage(cluster.url, "migrate", "-v", "0", env=ENV)

    def worker(name: str) -> ManageCommand:
        return procs.start(
            "run_jobs", "--worker-id", name, "--concurrency", "4", env=ENV,
            database_url=cluster.url,
        )  # fmt: skip

    paused = worker("w-paused")
    other = worker("w-other")
    dispatcher = procs.start("dispatch_outbox", env=ENV, database_url=cluster.url)
    load = Load(cluster, procs, tmp_path)
    wait_until(lambda: claimed_by(load, "w-paused") >= 20, 120, "the worker at work", paused)

    def holds_a_job() -> int:
        return load.count(
            "SELECT count(*) FROM jobs_job WHERE leased_by = 'w-paused' AND status = 'running'"
        )

    # Stopped while it holds a running job, as read once it is stopped (a job it held
    # just before may have ended in between): that job's late finish is fenced off.
    while True:
        wait_until(holds_a_job, 60, "the worker to hold a job", paused)
        paused.signal(signal.SIGSTOP)
        if holds_a_job():
            break
        paused.signal(signal.SIGCONT)
    stopped_at = time.monotonic()
    try:
        wait_until(
            lambda: not load.count(
                "SELECT count(*) FROM jobs_job WHERE leased_by = 'w-paused' AND status = 'running'"
            ),
            60, "the paused worker's jobs to be taken over", other,
        )  # fmt: skip
    except AssertionError as error:
        raise AssertionError(f"{error}\n{_what_holds_them(load)}") from None
    taken_over = round(time.monotonic() - stopped_at, 1)
    wait_until(lambda: time.monotonic() - stopped_at >= 3 * LEASE, 60, "three leases")
    before = claimed_by(load, "w-paused")
    paused.signal(signal.SIGCONT)
    continued_at = time.monotonic()
    wait_until(lambda: claimed_by(load, "w-paused") > before, 90, "it to claim again", paused)
    claims_again = round(time.monotonic() - continued_at, 1)
    load.finish()
    wait_until(load.drained, 180, "the backlog to drain", other)
    counts = load.assert_nothing_lost_or_done_twice()
    errors = len(ERROR_LINE.findall(paused.output))
    stop_all(procs, paused, other, dispatcher)
    fenced = stale(paused.output)
    print(
        f"\nSIGSTOP for {3 * LEASE} s (lease {LEASE} s): jobs taken over after {taken_over} s;"
        f" claiming again {claims_again} s after SIGCONT; fenced-off late finishes {fenced};"
        f" ERROR lines {errors}; load {counts}"
    )
    assert fenced >= 1
    assert errors == 0, paused.output[-5000:]


def test_a_black_holed_engine_stops_at_the_first_sigterm(cluster, procs, tmp_path):
    manage(cluster.url, "migrate", "-v", "0", env=ENV)
    with FaultProxy(cluster.port) as proxy:
        url = proxy.url(cluster.url)
        engines = [
            procs.start("run_jobs", "--worker-id", "w-stop", env=ENV, database_url=url),
            procs.start("dispatch_outbox", env=ENV, database_url=url),
            procs.start("recover_sagas", env=ENV, database_url=url),
        ]
        for proc in engines:
            proc.wait_for_output("started")
        proxy.black_hole()
        for proc in engines:
            proc.wait_until(lambda p=proc: "database unreachable" in p.output, "the outage", 60)
        signalled = time.monotonic()
        for proc in engines:
            proc.proc.send_signal(signal.SIGTERM)
        # One SIGTERM: each gives up waiting on the silent connection and exits 0.
        exited = {}
        for proc in engines:
            assert proc.wait(60) == 0, proc.output[-5000:]
            exited[proc.name] = round(time.monotonic() - signalled, 1)
            assert "SIGTERM" in proc.output
        print(f"\nblack-holed engines exited after one SIGTERM within {exited} s")
