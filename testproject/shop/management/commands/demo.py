"""``manage.py demo submit|cancel-export|report`` — the steps of ``make demo``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import JobScope, JobStatus, JobSubmission, submit_job

SCOPE = "demo-shop"


class Command(BaseCommand):
    help = "Demo steps: submit sample jobs, cancel the running export, report states."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["submit", "cancel-export", "report"])
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, options["step"].replace("-", "_"))(options["timeout"])

    def submit(self, timeout: float) -> None:
        jobs = [
            ("report-2026-11", JobSubmission.create("demo.report", {"month": "2026-11"})),
            (
                "flaky-delivery",
                JobSubmission.create("demo.flaky", {"fail_times": 1}, max_attempts=3),
            ),
            ("export-all", JobSubmission.create("demo.export", {"table": "orders"})),
        ]
        for job_id, sub in jobs:
            snap = submit_job(SCOPE, job_id, sub)
            state = "submitted" if snap.created else "already there"
            self.stdout.write(f"{state}: {job_id} -> {sub.handler} (max {sub.max_attempts})")
        again = submit_job(SCOPE, "report-2026-11", jobs[0][1])
        self.stdout.write(
            f"submitting report-2026-11 again returns the same job (created={again.created})"
        )

    def cancel_export(self, timeout: float) -> None:
        import time

        scope = JobScope(SCOPE)
        deadline = time.monotonic() + timeout
        while True:
            snap = scope.get("export-all")
            if snap is None:
                raise CommandError("export-all was not submitted")
            if snap.status == JobStatus.RUNNING and snap.progress:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"export-all did not start running ({snap.status})")
            time.sleep(0.1)
        outcome = scope.cancel("export-all")
        self.stdout.write(
            f"cancel export-all while running at {snap.progress:.0f}%: {outcome.value}"
        )

    def report(self, timeout: float) -> None:
        expected = {
            "report-2026-11": JobStatus.SUCCEEDED,
            "flaky-delivery": JobStatus.SUCCEEDED,
            "export-all": JobStatus.CANCELLED,
        }
        wrong = []
        for job_id, want in expected.items():
            snap = JobScope(SCOPE).get(job_id)
            if snap is None:
                raise CommandError(f"{job_id} is missing")
            self.stdout.write(
                f"{job_id:15} {snap.status.label:10} attempts {snap.attempt_count}/"
                f"{snap.max_attempts} progress {snap.progress or 0:.0f}% "
                f"result {snap.result_ref!r}"
            )
            for attempt in snap.attempts:
                error = attempt.error.strip().splitlines()[-1] if attempt.error else ""
                self.stdout.write(f"    attempt {attempt.number}: {attempt.status.label} {error}")
            if snap.status != want:
                wrong.append(f"{job_id} is {snap.status}, expected {want}")
        if wrong:
            raise CommandError("; ".join(wrong))
        self.stdout.write(self.style.SUCCESS("demo finished: every job ended as expected"))
