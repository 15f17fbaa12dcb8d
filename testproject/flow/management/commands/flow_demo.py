"""``manage.py flow_demo submit|wait``: the flow-control step of ``make demo`` — a
handler limited to two Running jobs on every worker, a job that snoozes once, and a
handler that ignores its timeout."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import JobScope, JobSubmission, submit_job
from jobs.models import Job
from jobs.types import JobStatus

SCOPE = "flow-demo"
LIMITED = 8


class Command(BaseCommand):
    help = "Submit the flow-control demo's jobs, or wait for a worker to run them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["submit", "wait"])
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["step"] == "submit":
            for n in range(LIMITED):
                submit_job(
                    SCOPE, f"limited-{n}", JobSubmission.create("flow.limited", {"seconds": 0.2})
                )
            submit_job(SCOPE, "sleepy", JobSubmission.create("flow.sleepy", {"snooze": 0.5}))
            stubborn = JobSubmission.create("flow.stubborn", {"seconds": 1.5}, max_attempts=1)
            submit_job(SCOPE, "stubborn", stubborn)
            self.stdout.write(
                f"submitted {LIMITED} jobs of flow.limited (max_running=2), flow.sleepy "
                "(snoozes 0.5 s once) and flow.stubborn (timeout 0.5 s, ignores it)"
            )
            return
        self._wait(options["timeout"])

    def _wait(self, timeout: float) -> None:
        jobs = Job.objects.filter(scope_hash=JobScope(SCOPE).scope_hash)
        deadline = time.monotonic() + timeout
        most = 0
        while jobs.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING)).exists():
            running = jobs.filter(handler="flow.limited", status=JobStatus.RUNNING).count()
            most = max(most, running)
            if time.monotonic() > deadline:
                raise CommandError("the flow demo's jobs did not finish; is a worker running?")
            time.sleep(0.02)  # a demo watching a worker, not a test
        limited = jobs.filter(handler="flow.limited", status=JobStatus.SUCCEEDED).count()
        self.stdout.write(
            f"flow.limited: {limited}/{LIMITED} succeeded, at most {most} Running at once"
        )
        sleepy = jobs.get(job_id="sleepy")
        executions = ", ".join(a.status for a in sleepy.attempts.order_by("number"))
        self.stdout.write(
            f"flow.sleepy: {sleepy.get_status_display()} after executions [{executions}]; "
            f"attempts used {sleepy.attempt_count}/{sleepy.max_attempts}, "
            f"snoozes {sleepy.snooze_count}"
        )
        stubborn = jobs.get(job_id="stubborn")
        self.stdout.write(
            f"flow.stubborn: {stubborn.get_status_display()}: {stubborn.error.splitlines()[-1]}"
        )
