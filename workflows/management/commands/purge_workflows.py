"""``manage.py purge_workflows``: retention on demand — delete old finished runs."""

from __future__ import annotations

from collections.abc import Sequence

from ledon.retention import Purge, PurgeCommand
from workflows import store
from workflows.conf import workflows_settings
from workflows.models import RunQuerySet, WorkflowRun


def _finished_top_level_runs() -> RunQuerySet:
    # A child run goes with its parent, never alone.
    return WorkflowRun.objects.finished().filter(parent__isnull=True)


class Command(PurgeCommand):
    help = (
        "Delete runs that finished longer ago than the retention "
        "(WORKFLOWS['RETENTION_SECONDS'], 30 days by default), with their checkpoints, "
        "items, signals and child runs; unfinished runs are never touched. Every run_jobs "
        "worker also does this on a time basis."
    )

    def purges(self) -> Sequence[Purge]:
        return [
            Purge(
                "finished run(s)",
                workflows_settings,
                "RETENTION_SECONDS",
                store.purge_finished,
                _finished_top_level_runs,
                "finished_at",
            )
        ]
