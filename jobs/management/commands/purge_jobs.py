"""``manage.py purge_jobs``: retention on demand — delete old finished jobs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from jobs import execution
from jobs.conf import jobs_settings
from jobs.models import Job


class Command(BaseCommand):
    help = (
        "Delete finished jobs (Succeeded, Failed, Cancelled, Interrupted) and their "
        "attempts that finished longer ago than the retention; Queued and Running jobs "
        "are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days",
            type=float,
            default=None,
            metavar="DAYS",
            help="delete jobs that finished more than DAYS ago "
            "(default: JOBS['RETENTION_SECONDS'])",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            help="jobs deleted per transaction (default: 1000)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        if days is None:
            seconds = jobs_settings().RETENTION_SECONDS
            if seconds is None:
                raise CommandError(
                    "give --older-than-days or set JOBS['RETENTION_SECONDS'] "
                    "(finished jobs are kept forever by default)"
                )
        elif days <= 0:
            raise CommandError("--older-than-days must be positive")
        else:
            seconds = days * 86_400
        batch = options["batch_size"]
        if not 1 <= batch <= 100_000:
            raise CommandError("--batch-size must be between 1 and 100000")
        cutoff = timezone.now() - timedelta(seconds=seconds)
        if options["dry_run"]:
            count = Job.objects.finished().filter(finished_at__lt=cutoff).count()
            self.stdout.write(
                f"{count} finished job(s) before {cutoff.isoformat()} would be deleted"
            )
            return
        total = 0
        while count := execution.purge_finished(older_than=cutoff, limit=batch):
            total += count
            if count < batch:
                break
        self.stdout.write(f"deleted {total} finished job(s) before {cutoff.isoformat()}")
