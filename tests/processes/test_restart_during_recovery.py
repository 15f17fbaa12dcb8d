"""PostgreSQL restarted while an engine runs its start-up recovery (real processes):
the case where a peer's runs stayed pending for ever. The engine is started paused at
the fault point right before its recovery's statement; the server is crashed, the
engine goes on into the outage, and the server starts again (the chaos run's own
injector, ``chaos/injector.py``, does it; every chaos run does it once for each).

Leases are a minute long, so that nothing here can be recovered by a lease's expiry:
what is recovered, the start-up recovery recovered, once the server was back.

- **A worker** killed while it held two attempts: its start-up recovery re-queues
  them (Interrupted, "worker … restarted"), it runs them again, each job ends with
  one succeeded attempt.
- **A dispatcher** that died right after publishing a batch (published, not marked
  sent, still leased to it): its start-up recovery releases the batch, which is
  published again; billing's inbox makes the second delivery do nothing — one
  invoice per order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.fleet import Fleet
from chaos.injector import Injector
from chaos.profiles import SHORT
from chaos.schedule import Fault, Kind
from tests.support.procs import manage, wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(600)]

#: One worker and one dispatcher, leases of a minute.
PROFILE = dataclasses.replace(SHORT, workers=1, dispatchers=1, saga_runners=0, lease=60.0)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    started = Fleet(PROFILE, tmp_path, {"OUTBOX_TRANSPORT": "in-process"})
    try:
        started.migrate()
        started.build()
        started.start_engines()
        yield started
    finally:
        started.close()


def shell(fleet: Fleet, code: str) -> None:
    manage(fleet.cluster.url, "shell", "-c", code, env=fleet.env)


def test_a_worker_whose_start_up_recovery_meets_a_restart_recovers_at_once(fleet, tmp_path):
    hold = tmp_path / "release-jobs"
    shell(
        fleet,
        "from jobs import JobSubmission, submit_jobs\n"
        f"submit_jobs([('restart', f'held-{{n}}', JobSubmission.create('test.record',"
        f" {{'hold_file': {str(hold)!r}}}, max_attempts=5)) for n in range(2)])\n",
    )
    applied = Injector(fleet, tmp_path).apply(Fault(Kind.PG_RESTART_IN_WORKER_RECOVERY, "w1", 0))
    assert applied.note.startswith("2 attempt(s)"), applied.note
    worker = fleet.processes["w1"]
    # It met the outage in its recovery, then recovered its two attempts.
    assert "database unreachable" in worker.output
    assert "recovered 2 attempt(s) of stopped workers" in worker.output, worker.output
    hold.touch()
    done = "SELECT count(*) FROM jobs_job WHERE job_id LIKE 'held-%%' AND status = 'succeeded'"
    wait_until(lambda: fleet.value(done) == 2, 120, "both jobs to succeed")
    attempts = fleet.cluster.rows(
        "SELECT j.job_id, a.number, a.status, a.error FROM jobs_jobattempt a"
        " JOIN jobs_job j ON j.id = a.job_id WHERE j.job_id LIKE 'held-%%' ORDER BY 1, 2"
    )
    assert attempts == [
        (job, number, status, error)
        for job in ("held-0", "held-1")
        for number, status, error in [
            (1, "interrupted", "recovered: worker w1 restarted"),
            (2, "succeeded", ""),
        ]
    ]
    assert worker.terminate() == 0


def test_a_dispatcher_whose_start_up_recovery_meets_a_restart_delivers_once(fleet, tmp_path):
    orders = 40
    # Stopped before the orders exist: a dispatcher at work would send them all
    # before the fault's own start, on a slow machine, and leave it nothing to hold.
    fleet.processes["d1"].kill()
    shell(
        fleet,
        "from decimal import Decimal\n"
        "from testproject.orders.services import place_order\n"
        f"for n in range({orders}): place_order(f'R-{{n:03}}', Decimal('5.00'))\n",
    )
    applied = Injector(fleet, tmp_path).apply(
        Fault(Kind.PG_RESTART_IN_DISPATCHER_RECOVERY, "d1", 0)
    )
    leased = int(applied.note.split()[0])
    assert leased > 0, applied.note  # the batch it published and died with
    dispatcher = fleet.processes["d1"]
    assert "database unreachable" in dispatcher.output
    sent = (
        "SELECT count(*) FROM outbox_outboxmessage WHERE event_type = 'orders.placed'"
        " AND status = 'sent'"
    )
    wait_until(lambda: fleet.value(sent) == orders, 120, "every order's message sent")
    # The batch it held went out again at start-up (a lease of a minute had not expired).
    assert f"recovered {leased} released" in dispatcher.output, dispatcher.output[-3000:]
    # Delivered again: billing's inbox record made each second delivery do nothing.
    assert fleet.value("SELECT count(*) FROM orders_delivery WHERE NOT fresh") > 0
    # One invoice per order: the second delivery found billing's inbox record.
    assert fleet.value("SELECT count(DISTINCT order_number) FROM orders_invoice") == orders
    assert fleet.value("SELECT count(*) FROM orders_invoice") == orders
    assert not fleet.value(
        "SELECT count(*) FROM (SELECT message_id FROM orders_delivery WHERE fresh"
        " GROUP BY message_id HAVING count(*) > 1) twice"
    )
    assert dispatcher.terminate() == 0
