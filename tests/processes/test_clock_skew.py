"""A worker whose host clock is off by a minute, beside one whose clock is right
(PostgreSQL, real processes; the skewed one runs with libfaketime preloaded).

Both run the same work at once: jobs each holds for three leases (queues of their
own), delayed jobs, workflow runs with a timer, jobs under a rate limit, and a
schedule every two seconds (each worker runs the scheduler). No rule may break:

- **leases:** neither worker takes the other's attempts (no attempt Interrupted,
  every job one attempt) — a worker whose clock runs ahead would find every lease
  of the other expired; one whose clock runs behind would write leases that were
  already expired;
- **timers no earlier than asked:** no delayed job runs before its ``not_before``,
  no workflow timer fires before its time;
- **rates:** no window of the rate's length holds more starts than the rate allows;
- **schedules:** one job per period, run once, never before its period began.

Each is read on the database's clock: every effect of ``testproject.history``
records ``now()`` of the server, which libfaketime does not shift. What the skew
delays (how late each worker ran delayed jobs, timers and periods) is printed;
``pytest -s`` shows it.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testproject.history.workload import RATE_COUNT, RATE_SECONDS, RUN_SLEEP
from tests.support.cluster import Cluster
from tests.support.procs import ManageProcess, manage, wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(600)]

# Long enough that a worker starved of the CPU on a loaded machine (the skewed one is
# slower: every clock read goes through libfaketime) still renews its leases in time.
LEASE = 8
ENV = {
    "JOBS_LEASE_SECONDS": str(LEASE),
    "JOBS_HEARTBEAT_SECONDS": "1",
    "JOBS_RECOVERY_INTERVAL": "1",
    "JOBS_SCHEDULE_REFRESH_SECONDS": "1",
    "SAGAS_RECOVER_IN_WORKER": "false",
    "HISTORY_CLOCK_RULES": "on",
}
DELAYED = 12
RATED = 18
RUNS = 6


def libfaketime() -> str:
    """The path of libfaketime (Debian's ``faketime`` package), or skip (fail in CI)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        reason = "libfaketime is not installed (Debian's faketime package)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true: scripts/test.sh installs it")
        pytest.skip(reason)
    return found[0]


def skewed_env(skew: str) -> dict[str, str]:
    """The environment of a process whose wall clock is off by ``skew`` ("+60s"); its
    monotonic clock is left alone, as on a host whose wall clock alone is off."""
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": skew,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


class SkewedWorker(ManageProcess):
    """``run_jobs`` with its wall clock shifted by ``skew`` (libfaketime, preloaded)."""

    def __init__(self, tmp_path: Path, skew: str, *args: str, database: str) -> None:
        env = {**ENV, **skewed_env(skew)}
        super().__init__(tmp_path, "run_jobs", *args, env=env, database=database, real=True)


#: The work, submitted by the test's clock (the database's): ``.format(hold=…)``.
SEED = """
from datetime import timedelta
from django.utils import timezone
from jobs import JobSubmission, submit_jobs
from workflows import send_signal, start_workflow

now = timezone.now()
work = []
for queue in ("true", "skewed"):
    for n in range(2):
        hold = JobSubmission.create("test.record", dict(hold_file={hold!r}), queue="hold-" + queue)
        work.append(("clock", f"hold-{{queue}}-{{n}}", hold))
for n in range({delayed}):
    due = now + timedelta(seconds=2 + n % 3)
    work.append(("clock", f"delayed-{{n}}", JobSubmission.create("history.job", not_before=due)))
for n in range({rated}):
    work.append(("clock", f"rated-{{n}}", JobSubmission.create("history.rated")))
submit_jobs(work)
for n in range({runs}):
    start_workflow("clock", f"run-{{n}}", "history.order", dict(sleep={sleep}))
    send_signal("clock", f"run-{{n}}", "paid", dict(message=f"m-{{n}}"))
"""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    libfaketime()
    server = Cluster()
    manage(server.url, "migrate", "-v", "0", env=ENV)
    yield server
    server.stop()


def rows(cluster: Cluster, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return cluster.rows(query, list(params) or None)


def lateness(cluster: Cluster, job_like: str) -> dict[str, list[float]]:
    """Seconds from each job's ``not_before`` to its handler's effect, by worker id
    (negative: it ran early)."""
    found: dict[str, list[float]] = {}
    for worker, late in rows(
        cluster,
        "SELECT a.worker_id, extract(epoch FROM e.at - j.initial_not_before)"
        " FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
        " JOIN history_effect e ON e.subject = j.job_id AND e.key = a.token"
        " WHERE j.job_id LIKE %s",
        job_like,
    ):
        found.setdefault(worker, []).append(float(late))
    return found


def shortest_span(times: list[float], count: int) -> float:
    """The shortest time from one of ``times`` to the one ``count`` after it: under a
    rate of ``count`` starts per window, never less than the window."""
    ordered = sorted(times)
    return min(ordered[i + count] - ordered[i] for i in range(len(ordered) - count))


@pytest.mark.parametrize("skew", ["+60s", "-60s"])
def test_a_worker_whose_clock_is_off_by_a_minute_breaks_no_rule(cluster, tmp_path, skew):
    right = ManageProcess(
        tmp_path, "run_jobs", "--worker-id", "w-right", "--concurrency", "4",
        "--queue", "default", "--queue", "hold-true", env=ENV, database=cluster.url,
    )  # fmt: skip
    skewed = SkewedWorker(
        tmp_path, skew, "--worker-id", "w-skewed", "--concurrency", "4",
        "--queue", "default", "--queue", "hold-skewed", database=cluster.url,
    )  # fmt: skip
    workers = [right, skewed]
    try:
        for worker in workers:
            worker.wait_for_output("started", 120)
        hold = tmp_path / "release"
        seed = SEED.format(hold=str(hold), delayed=DELAYED, rated=RATED, runs=RUNS, sleep=RUN_SLEEP)
        manage(cluster.url, "shell", "-c", seed, env=ENV)
        held = (
            "SELECT count(*) FROM jobs_job WHERE job_id LIKE 'hold-%%' AND status = 'running'"
            " AND leased_by = %s"
        )
        for worker, name in [(right, "w-right"), (skewed, "w-skewed")]:
            wait_until(
                lambda name=name: cluster.value(held, [name]) == 2,
                120, f"{name} to hold its two jobs", worker,
            )  # fmt: skip
        # Three leases, each worker holding its jobs: long enough for either to take
        # the other's, if a clock could make a live lease look expired.
        holding_since = time.monotonic()
        wait_until(lambda: time.monotonic() - holding_since >= 3 * LEASE, 60, "three leases")
        hold.touch()
        unfinished = (
            "SELECT (SELECT count(*) FROM jobs_job WHERE status IN ('queued', 'running')"
            " AND handler <> 'history.tick') + (SELECT count(*) FROM workflows_workflowrun"
            " WHERE status IN ('running', 'waiting'))"
        )
        ticks = (
            "SELECT count(*) FROM jobs_job WHERE handler = 'history.tick' AND status = 'succeeded'"
        )
        wait_until(
            lambda: cluster.value(unfinished) == 0 and cluster.value(ticks) >= 5,
            180, "every job and run to end, five periods to run", right,
        )  # fmt: skip
        for worker in workers:
            worker.signal(15)
            assert worker.wait(60) == 0, worker.output[-3000:]
        # The skewed worker measured the skew, and said so once.
        direction = "ahead of" if skew.startswith("+") else "behind"
        assert skewed.output.count("this host's clock is") == 1, skewed.output[-3000:]
        assert f"s {direction} the database server's" in skewed.output
        assert "this host's clock is" not in right.output
    finally:
        for worker in workers:
            worker.close()

    # Leases: nobody took anybody's attempt. (A schedule's job claimed as its worker
    # stops is released unstarted, as it should be.)
    attempts = rows(
        cluster,
        "SELECT j.job_id, a.status, a.worker_id, a.error FROM jobs_jobattempt a"
        " JOIN jobs_job j ON j.id = a.job_id WHERE a.status NOT IN ('succeeded', 'released')",
    )
    assert attempts == [], attempts
    assert rows(
        cluster,
        "SELECT j.job_id, a.worker_id FROM jobs_jobattempt a JOIN jobs_job j ON j.id = a.job_id"
        " WHERE j.job_id LIKE 'hold-%%' ORDER BY 1",
    ) == [
        ("hold-skewed-0", "w-skewed"), ("hold-skewed-1", "w-skewed"),
        ("hold-true-0", "w-right"), ("hold-true-1", "w-right"),
    ]  # fmt: skip

    # Delayed jobs and schedule periods: none ran before its time.
    delayed = lateness(cluster, "delayed-%%")
    periods = lateness(cluster, "history-tick@%%")
    assert sum(len(v) for v in delayed.values()) == DELAYED
    for found in (delayed, periods):
        early = {w: [round(s, 3) for s in late if s < 0] for w, late in found.items()}
        assert not any(early.values()), early
    # One job per period (its id names the period), each run once.
    assert not rows(
        cluster,
        "SELECT subject FROM history_effect WHERE kind = 'tick' GROUP BY subject"
        " HAVING count(*) > 1",
    )

    # Workflow timers: none fired before its time.
    slept = rows(
        cluster,
        "SELECT b.subject, extract(epoch FROM a.at - b.at) FROM history_effect a"
        " JOIN history_effect b ON a.subject = b.subject AND b.kind = 'step'"
        " AND b.key = 'reserve' WHERE a.kind = 'step' AND a.key = 'after-sleep'",
    )
    assert len(slept) == RUNS
    timers = {run: round(float(s) - RUN_SLEEP, 3) for run, s in slept}
    assert all(late >= 0 for late in timers.values()), timers

    # Rates: the start that comes RATE_COUNT after another is a window later. The
    # effect is written when the handler starts, a moment after its claim (more on a
    # loaded machine: starts bunch up), so half a window is asked; two workers each
    # counting on a clock of its own would start twice the rate: spans near zero.
    starts = [
        float(at)
        for (at,) in rows(
            cluster,
            "SELECT extract(epoch FROM at) FROM history_effect WHERE subject LIKE 'rated-%%'",
        )
    ]
    assert len(starts) == RATED
    span = shortest_span(starts, RATE_COUNT)
    assert span >= RATE_SECONDS / 2, f"start n and n + {RATE_COUNT} {span:.2f} s apart"

    def spread(found: dict[str, list[float]]) -> dict[str, str]:
        return {w: f"{min(v):.2f}..{max(v):.2f} s" for w, v in sorted(found.items())}

    print(
        f"\nclock {skew} on w-skewed: delayed jobs late by {spread(delayed)}; schedule periods"
        f" late by {spread(periods)}; timers late by {min(timers.values()):.2f}.."
        f"{max(timers.values()):.2f} s; rated starts {RATE_COUNT} apart at least {span:.2f} s"
        f" (rate {RATE_COUNT} per {RATE_SECONDS} s)"
    )


def test_the_skew_is_real(tmp_path):
    """A process with libfaketime preloaded reads a wall clock a minute ahead, and a
    monotonic clock it does not shift (a check of the test's own means)."""
    code = "import time; print(time.time(), time.monotonic())"
    env = {**os.environ, **skewed_env("+60s")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    wall, monotonic = map(float, out.stdout.split())
    assert wall - time.time() > 55
    assert abs(monotonic - time.monotonic()) < 5
