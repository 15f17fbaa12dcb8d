"""``manage.py timetable_demo wait``: the schedules step of ``make demo`` — wait until a
worker has run the first periods of ``demo-heartbeat`` and show their jobs."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import JobStatus, execution


class Command(BaseCommand):
    help = "Wait until the demo schedule's first periods ran, then show their jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["wait"])
        parser.add_argument("--periods", type=int, default=2)
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args: Any, **options: Any) -> None:
        scope = execution.reserved_scope("periodic")
        deadline = time.monotonic() + options["timeout"]
        while True:
            done = [
                job
                for job in scope.list(status=JobStatus.SUCCEEDED)
                if job.job_id.startswith("demo-heartbeat@")
            ]
            if len(done) >= options["periods"]:
                break
            if time.monotonic() > deadline:
                raise CommandError("the demo schedule did not run in time; is a worker running?")
            time.sleep(0.2)  # a demo watching a worker, not a test
        for job in done:
            self.stdout.write(f"{job.job_id}: {job.status.label}, result {job.result_ref!r}")
