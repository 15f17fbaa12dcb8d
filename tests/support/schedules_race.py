"""The callers of the schedules' race test: threads of the test process and spawned processes
run the same rounds, released together at each simulated period by one barrier.

Only the standard library is imported at module level: a spawned process imports this
module before it sets Django up.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

#: The simulated clock: period k starts at START + k minutes.
START = datetime(2030, 6, 3, tzinfo=UTC)
PERIOD = timedelta(minutes=1)


def declare() -> None:
    """The race's schedules: one cron, one interval, both a period every minute."""
    from jobs import periodic

    periodic("* * * * *", name="race-cron", handler="race.cron", catch_up="all")
    periodic(PERIOD, name="race-interval", handler="race.interval")


def run_rounds(barrier: Any, rounds: int) -> list[tuple[int, list[tuple[str, bool]], str]]:
    """Each round: wait for every caller, then enqueue as of that round's period start.
    Returns (round, [(job id, created)], error) for every round."""
    from jobs import execution

    outcomes = []
    for number in range(rounds):
        barrier.wait(120)
        try:
            jobs = execution.enqueue_due_schedules(now=START + number * PERIOD)
            outcomes.append((number, [(job.job_id, job.created) for job in jobs], ""))
        except Exception as exc:
            outcomes.append((number, [], f"{type(exc).__name__}: {exc}"))
    return outcomes


def in_process(database_url: str, barrier: Any, rounds: int, results: Any) -> None:
    """A spawned process: set Django up on the test database, declare, race."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    declare()
    try:
        results.put((os.getpid(), run_rounds(barrier, rounds)))
    finally:
        from django.db import connections

        connections.close_all()
