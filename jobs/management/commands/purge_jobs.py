"""``manage.py purge_jobs``: retention on demand — delete old finished jobs."""

from __future__ import annotations

from collections.abc import Sequence

from jobs import execution
from jobs.conf import jobs_settings
from jobs.models import Job
from ledon.retention import Purge, PurgeCommand


class Command(PurgeCommand):
    help = (
        "Delete finished jobs (Succeeded, Failed, Cancelled, Interrupted) and their "
        "attempts that finished longer ago than the retention (JOBS['RETENTION_SECONDS'], "
        "14 days by default); Queued and Running jobs are never touched."
    )

    def purges(self) -> Sequence[Purge]:
        return [
            Purge(
                "finished job(s)",
                jobs_settings,
                "RETENTION_SECONDS",
                execution.purge_finished,
                Job.objects.finished,
                "finished_at",
            )
        ]
