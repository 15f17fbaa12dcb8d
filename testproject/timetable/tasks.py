"""Schedules of the test project, chosen through the environment so that no other
worker of the test suite enqueues them:

``TIMETABLE=demo``
    ``demo-heartbeat``, every two seconds (``make demo``).
``TIMETABLE=tick``
    ``tick`` every ``TIMETABLE_EVERY`` seconds (default 1), with
    ``TIMETABLE_CATCH_UP`` (default "latest").
``TIMETABLE=fifty``
    fifty yearly cron schedules in Europe/Paris, none due for months: the idle cost
    of a worker with fifty schedules (benchmarks/schedules.py).
"""

from __future__ import annotations

import os
from datetime import timedelta

from jobs import JobContext, job_handler, periodic


@job_handler("timetable.tick", version=1)
def tick(ctx: JobContext) -> str:
    """Returns the job id: one job per period, named by its period."""
    return ctx.job_id


_chosen = set(os.environ.get("TIMETABLE", "").split(","))

if "demo" in _chosen:

    @periodic(timedelta(seconds=2), name="demo-heartbeat", payload={"say": "hello"})
    @job_handler("timetable.heartbeat", version=1)
    def heartbeat(ctx: JobContext) -> str:
        """The demo's schedule: each period's job says hello."""
        return f"{ctx.payload['say']} from {ctx.job_id}"


if "tick" in _chosen:
    periodic(
        timedelta(seconds=int(os.environ.get("TIMETABLE_EVERY", "1"))),
        name="tick",
        handler="timetable.tick",
        catch_up=os.environ.get("TIMETABLE_CATCH_UP", "latest"),
    )

if "fifty" in _chosen:
    for number in range(50):
        periodic(
            f"{number} 3 1 1 *",
            name=f"daily-{number:02}",
            handler="timetable.tick",
            timezone="Europe/Paris",
        )
