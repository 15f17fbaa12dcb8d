"""A PostgreSQL failover under load (real processes): a primary and a streaming
standby (``pg_basebackup``), both started by the test from the PostgreSQL binaries on
loopback ports. Two workers, a dispatcher (billing through the in-process transport)
and a saga runner reach them through one multi-host URL with
``target_session_attrs=read-write``; a feeder writes the chaos workload
(``testproject.history``: jobs, orders consumed through the inbox that signal
workflow runs, sagas) through the same URL.

Under load the primary is killed (``pg_ctl -m immediate``) and the standby promoted.
Measured:

- how long after the promotion each engine works again (a job finished, a batch
  sent, a saga ended), against the round-trip deadline plus a lease;
- what the promoted standby lacks that a client had been told was done: submits the
  feeder saw acknowledged, finishes the workers printed, and checkpoints committed on
  the old primary (read afterwards by starting it again alone, on another port).

With asynchronous replication the loss is measured and printed (``pytest -s``); with
``synchronous_commit = remote_apply`` (and the standby named synchronous) nothing
acknowledged is lost. Either way the run ends with every job, run, saga and message
final, each job's effect present, and no engine dead.

``make failover`` (``LEDON_FAILOVER=full``) runs both settings over 12 units of the
feed, the primary killed at the fourth: the figures of ``docs/guarantees.md``. The
suite runs a smoke of it: the ``remote_apply`` setting alone, over 3 units, killed at
the first.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testproject.history.workload import Unit
from tests.support.brokers import ManageCommand, Processes
from tests.support.cluster import Cluster
from tests.support.procs import manage, wait_until
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(600)]

LEASE = 5
DEADLINE = 2.0
#: How far behind the standby is when the primary dies: its stream is held so long.
LAG = 1.0
#: ``make failover``: both replication settings and the whole feed; else the smoke.
FULL = os.environ.get("LEDON_FAILOVER") == "full"
UNITS = 12 if FULL else 3
KILL_AT_UNIT = 4 if FULL else 1
MODES = ["asynchronous", "synchronous"] if FULL else ["synchronous"]
ENV = {
    "JOBS_LEASE_SECONDS": str(LEASE),
    "JOBS_HEARTBEAT_SECONDS": "1",
    "JOBS_RECOVERY_INTERVAL": "1",
    "JOBS_SCHEDULER": "false",
    "OUTBOX_ENABLED": "true",
    "OUTBOX_TRANSPORT": "in-process",
    "OUTBOX_LEASE_SECONDS": str(LEASE),
    "OUTBOX_RECOVERY_INTERVAL": "1",
    "OUTBOX_BATCH_SIZE": "20",
    "SAGAS_LEASE_SECONDS": str(LEASE),
    "SAGAS_POLL_INTERVAL": "0.2",
    "SAGAS_RECOVER_IN_WORKER": "false",
    "LEDON_ROUND_TRIP_DEADLINE": str(DEADLINE),
}
#: What each engine prints once it has done a piece of work.
WORK_DONE = {
    "run_jobs": re.compile(r"^succeeded job ", re.MULTILINE),
    "dispatch_outbox": re.compile(r"^batch \d+ claimed, [1-9]\d* sent", re.MULTILINE),
    "recover_sagas": re.compile(r"^(succeeded|compensated) saga ", re.MULTILINE),
}
SUCCEEDED = re.compile(r"^succeeded job (\S+) \(history\.job@1\)", re.MULTILINE)
ACKNOWLEDGED = re.compile(r"^acknowledged (\d+) ", re.MULTILINE)


def multi_host_url(*servers: Cluster) -> str:
    """One URL naming every server, for the one that accepts writes."""
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return f"postgres://postgres@{hosts}/ledon?target_session_attrs=read-write"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


class Pair:
    """The primary and its standby, which streams through a loopback proxy (so that
    the test can hold the stream: a standby lagging behind); stopped and removed at
    the end."""

    def __init__(self, synchronous: bool) -> None:
        self.primary = Cluster(synchronous_commit="remote_apply" if synchronous else "on")
        self.standby: Cluster | None = None
        self.link = FaultProxy(self.primary.port).start()
        try:
            manage(self.primary.url, "migrate", "-v", "0", env=ENV)
            self.standby = self.primary.standby(through=self.link.port)
            if synchronous:
                self.primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                self.primary.execute("SELECT pg_reload_conf()")
            wanted = "sync" if synchronous else "async"
            wait_until(
                lambda: self.primary.rows("SELECT sync_state FROM pg_stat_replication")
                == [(wanted,)],
                60, f"the standby to stream ({wanted})",
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.link.close()
        for server in (self.primary, self.standby):
            if server is not None:
                server.stop()


def unit_ids(units: int) -> dict[str, set[str]]:
    plan = [Unit(n) for n in range(units)]
    return {
        "jobs": {job_id for unit in plan for job_id in unit.job_ids()},
        "orders": {number for unit in plan for number, _ in unit.orders()},
        "sagas": {key for unit in plan for key, _ in unit.sagas()},
    }


def present(server: Cluster) -> dict[str, set[str]]:
    return {
        "jobs": {r[0] for r in server.rows("SELECT job_id FROM jobs_job")},
        "orders": {r[0] for r in server.rows("SELECT number FROM history_order")},
        "sagas": {r[0] for r in server.rows("SELECT idempotency_key FROM sagas_sagainstance")},
    }


def effects(server: Cluster) -> dict[tuple[str, str, str], Any]:
    """Every recorded effect, by what it is, with when it was committed."""
    return {
        (kind, subject, key): at
        for kind, subject, key, at in server.rows(
            "SELECT kind, subject, key, at FROM history_effect"
        )
    }


def checkpoints(server: Cluster) -> set[tuple[str, str]]:
    return set(
        server.rows(
            "SELECT r.run_id, s.key FROM workflows_workflowstep s JOIN workflows_workflowrun r"
            " ON r.id = s.run_id WHERE s.status = 'succeeded'"
        )
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_failover_under_load(procs, tmp_path, mode):
    synchronous = mode == "synchronous"
    pair = Pair(synchronous)
    try:
        measured = run_failover(pair, procs, synchronous)
    finally:
        pair.close()
    print(f"\nfailover, {mode} replication: {measured}")


def run_failover(pair: Pair, procs: Processes, synchronous: bool) -> dict[str, Any]:
    primary, standby = pair.primary, pair.standby
    assert standby is not None
    url = multi_host_url(primary, standby)

    def start(command: str, *args: str) -> ManageCommand:
        return procs.start(command, *args, env=ENV, database_url=url)

    named = {
        "w1": start("run_jobs", "--worker-id", "w1", "--concurrency", "4"),
        "w2": start("run_jobs", "--worker-id", "w2", "--concurrency", "4"),
        "d1": start("dispatch_outbox", "--dispatcher-id", "d1"),
        "r1": start("recover_sagas", "--runner-id", "r1"),
    }
    engines = list(named.values())
    for engine in engines:
        engine.wait_for_output("started")
    feeder = start("chaos_feed", "--units", str(UNITS), "--window", "200")

    def acknowledged() -> int:
        found = ACKNOWLEDGED.findall(feeder.output)
        return int(found[-1]) + 1 if found else 0

    feeder.wait_until(lambda: acknowledged() >= KILL_AT_UNIT, "the feed under way", 180)
    # The standby falls behind (its stream held) for LAG seconds of load, then the
    # primary dies; what it sent meanwhile never reaches the standby.
    pair.link.hold()
    lagging = time.monotonic()
    wait_until(lambda: time.monotonic() - lagging >= LAG, 30, "the standby to lag")
    primary.crash()
    killed = time.monotonic()
    pair.link.cut()
    # What every client had been told before the primary died.
    acked_units = acknowledged()
    marks = {id(e): len(e.output) for e in engines}
    finished_before = {job for e in engines for job in SUCCEEDED.findall(e.output)}
    standby.promote()
    promoted = time.monotonic()
    back: dict[str, float] = {}

    def all_back() -> bool:
        """Each engine reported the outage's end, then did a piece of work."""
        for name, engine in named.items():
            again = engine.output.find("database reachable again", marks[id(engine)])
            if (
                name not in back
                and again >= 0
                and WORK_DONE[engine.name].search(engine.output, again)
            ):
                back[name] = round(time.monotonic() - promoted, 1)
        return len(back) == len(named)

    wait_until(all_back, 120, "every engine to work again", engines[0])
    feeder.wait_for_output("\nfed ", 300)
    unfinished = (
        "SELECT (SELECT count(*) FROM jobs_job WHERE status IN ('queued', 'running'))"
        " + (SELECT count(*) FROM workflows_workflowrun WHERE status IN ('running', 'waiting'))"
        " + (SELECT count(*) FROM sagas_sagainstance WHERE status IN ('running', 'compensating'))"
        " + (SELECT count(*) FROM outbox_outboxmessage WHERE status <> 'sent')"
    )
    wait_until(lambda: standby.value(unfinished) == 0, 300, "every piece of work to end")
    for engine in engines:
        assert engine.terminate() == 0, engine.output[-3000:]

    # The promoted standby: everything is final, every job ran (its effect is there).
    ids = unit_ids(UNITS)
    acked = unit_ids(acked_units)
    now_there = present(standby)
    lost_submits = {what: sorted(acked[what] - now_there[what]) for what in acked}
    missing_jobs = ids["jobs"] - now_there["jobs"]
    without_effect = standby.rows(
        "SELECT j.job_id FROM jobs_job j WHERE j.handler = 'history.job' AND NOT EXISTS"
        " (SELECT 1 FROM history_effect e WHERE e.subject = j.job_id AND e.kind = 'job')"
    )
    assert without_effect == []
    # A finish a worker printed before the kill, that the new primary does not have:
    # the job ran again there.
    ran_again = {
        job
        for (job,) in standby.rows(
            "SELECT j.job_id FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
            " WHERE j.handler = 'history.job' GROUP BY j.job_id HAVING count(*) > 1"
        )
    }
    lost_finishes = sorted(finished_before & ran_again)
    new_checkpoints = checkpoints(standby)
    new_effects = effects(standby)

    # The old primary, started again alone: what it had committed.
    primary.restart_elsewhere()
    lost_checkpoints = checkpoints(primary) - new_checkpoints
    old_there = present(primary)
    committed_lost = {what: len(old_there[what] - now_there[what]) for what in old_there}
    old_effects = effects(primary)
    lost_effects = set(old_effects) - set(new_effects)
    # How far back from the old primary's last commit the lost commits go.
    window = (
        (max(old_effects.values()) - min(old_effects[e] for e in lost_effects)).total_seconds()
        if lost_effects
        else 0.0
    )
    measured = {
        "standby behind by s": LAG,
        "killed to promoted s": round(promoted - killed, 1),
        "back at work after promotion s": back,
        "target s": DEADLINE + LEASE,
        "acknowledged submits lost": {k: len(v) for k, v in lost_submits.items()},
        "acknowledged finishes lost": len(lost_finishes),
        "finishes printed before the kill": len(finished_before),
        "checkpoints committed on the old primary, lost": len(lost_checkpoints),
        "rows committed on the old primary, lost": committed_lost,
        "effects committed on the old primary, lost": len(lost_effects),
        "loss window ms": round(window * 1000),
        "jobs in all": len(ids["jobs"] - missing_jobs),
    }
    assert max(back.values()) <= DEADLINE + LEASE, measured
    if synchronous:
        assert not any(lost_submits.values()), measured
        assert lost_finishes == [], measured
    return measured
